"""Splitting a harness's output into lines, with a bound on what is held.

``LineSplitter`` turns chunks of bytes into decoded lines (UTF-8 with
replacement); a line longer than the limit is cut while it is read, so a
20 MB line never sits in memory whole. ``read_batches`` runs one over a whole
stream, a batch of lines per read (the stderr reader thread uses it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import IO

__all__ = ["CUT_PATTERN", "READ_CHUNK", "LineSplitter", "read_batches"]

#: Bytes asked of the pipe per read.
READ_CHUNK = 64 * 1024
#: How the end of a cut line reads; group 1 is the number of bytes dropped.
CUT_PATTERN = re.compile(r" …\[cut (\d+) bytes\]\Z")


class LineSplitter:
    """Cut a byte stream into lines of at most ``limit`` bytes each.

    ``feed`` returns the complete lines a chunk finishes, as (text, bytes
    held); ``finish`` returns the last line, if the stream ended without a
    newline. A longer line keeps its first ``limit`` bytes, the rest is counted
    and dropped, and its text ends with `` …[cut N bytes]``. At most ``limit``
    bytes of an unfinished line are ever held.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._pending = b""  # the start of a line whose newline has not come (<= limit bytes)
        self._head: bytes | None = None  # the kept part of a line being cut
        self._cut = 0

    def feed(self, data: bytes) -> list[tuple[str, int]]:
        """Return the lines that ``data`` completes."""
        if (
            self._head is None
            and not self._pending
            and len(data) <= self.limit
            and data.endswith(b"\n")
            and b"\r" not in data
        ):
            # The usual chunk (a harness flushes whole lines): one split, no line to cut.
            raws = data.split(b"\n")[:-1]
            return [(raw.decode("utf-8", "replace"), len(raw) + 1) for raw in raws]
        lines: list[tuple[str, int]] = []
        if self._head is not None:
            newline = data.find(b"\n")
            if newline < 0:
                self._cut += len(data)
                return lines
            lines.append(_cut_line(self._head, self._cut + newline))
            self._head, self._cut, data = None, 0, data[newline + 1 :]
        if self._pending:
            data, self._pending = self._pending + data, b""
        start, limit = 0, self.limit
        while (newline := data.find(b"\n", start)) >= 0:
            if newline - start > limit:
                lines.append(_cut_line(data[start : start + limit], newline - start - limit))
            else:
                lines.append(_line(data[start:newline]))
            start = newline + 1
        rest = data[start:]
        if len(rest) > limit:
            self._head, self._cut = rest[:limit], len(rest) - limit
        else:
            self._pending = rest
        return lines

    def finish(self) -> list[tuple[str, int]]:
        """Return the unfinished last line, if any (the stream ended)."""
        head, pending, cut = self._head, self._pending, self._cut
        self._head, self._pending, self._cut = None, b"", 0
        if head is not None:
            return [_cut_line(head, cut)]
        return [_line(pending)] if pending else []


def read_batches(stream: IO[bytes], limit: int) -> Iterator[list[tuple[str, int]]]:
    """Yield, per read of ``stream``, the lines it completes (see ``LineSplitter``).

    Closes ``stream`` at EOF or on a read error (the reading thread owns it).
    """
    splitter = LineSplitter(limit)
    fd = stream.fileno()
    with stream:
        while True:
            try:
                data = os.read(fd, READ_CHUNK)
            except OSError:
                data = b""
            batch = splitter.feed(data) if data else splitter.finish()
            if batch:
                yield batch
            if not data:
                return


def _line(raw: bytes) -> tuple[str, int]:
    size = len(raw) + 1
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    return raw.decode("utf-8", "replace"), size


def _cut_line(head: bytes, cut: int) -> tuple[str, int]:
    return f"{head.decode('utf-8', 'replace')} …[cut {cut} bytes]", len(head)
