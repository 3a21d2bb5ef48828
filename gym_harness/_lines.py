"""Reading a harness's output: bounded line splitting and a bounded line queue.

``read_lines`` turns a byte stream into decoded lines (UTF-8 with replacement;
a line over the limit is cut while it is read, so a 20 MB line never sits in
memory whole). ``LineQueue`` carries lines from a reader thread to the caller,
holding at most a byte budget of unread lines (the reader then waits: back
pressure on the harness, never a deadlock for us).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import IO

__all__ = ["LineQueue", "read_lines"]

_DISCARD_CHUNK = 64 * 1024


class LineQueue:
    """Lines from the stdout reader to the caller, holding at most ``max_bytes`` unread.

    Lines travel through a C ``SimpleQueue`` (one wake-up per line on the fast
    path); the byte count only makes the reader wait when the caller falls behind.
    """

    _END = ("", -1)  # the last item ever put: EOF, or close()

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._items: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._has_room = threading.Condition(self._lock)
        self._bytes = 0
        self._ended = False  # the writer put _END
        self._closed = False  # the consumer is gone: drop everything
        self._seen_end = False  # the consumer took _END

    @property
    def finished(self) -> bool:
        # Once _END is queued, a size of 1 means only _END is left unread.
        return self._seen_end or self._closed or (self._ended and self._items.qsize() <= 1)

    def put(self, text: str, size: int) -> None:
        with self._lock:
            # Always admit one line, however large, so a cut line never blocks forever.
            while self._bytes and self._bytes + size > self._max and not self._closed:
                self._has_room.wait()
            if self._closed:
                return
            self._bytes += size
        self._items.put((text, size))

    def get(self, timeout_s: float) -> str | None:
        if self._seen_end:
            return None
        try:
            text, size = self._items.get(timeout=max(timeout_s, 0.0))
        except queue.Empty:
            return None
        if size < 0:
            self._seen_end = True
            self._items.put(self._END)  # for any other thread waiting in get()
            return None
        with self._lock:
            self._bytes -= size
            self._has_room.notify()
        return text

    def end(self) -> None:
        with self._lock:
            if not self._ended:
                self._items.put(self._END)
                self._ended = True  # only after _END is in: ``finished`` counts on it

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._bytes = 0
            self._has_room.notify_all()
            while True:  # drop unread lines now rather than when the object dies
                try:
                    self._items.get_nowait()
                except queue.Empty:
                    break
            self._items.put(self._END)  # wakes a get() waiting in another thread


def read_lines(stream: IO[bytes], limit: int) -> Iterator[tuple[str, int]]:
    """Yield (text, bytes held) per line; cut lines past ``limit`` bytes while reading.

    Closes ``stream`` at EOF or on a read error (the reader thread owns it).
    """
    with stream:
        try:
            while raw := stream.readline(limit + 1):
                size = len(raw)
                if size > limit and not raw.endswith(b"\n"):
                    cut = 1
                    while rest := stream.readline(_DISCARD_CHUNK):
                        if rest.endswith(b"\n"):
                            cut += len(rest) - 1
                            break
                        cut += len(rest)
                    text = raw[:limit].decode("utf-8", "replace")
                    yield f"{text} …[cut {cut} bytes]", limit
                    continue
                if raw.endswith(b"\n"):
                    raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
                yield raw.decode("utf-8", "replace"), size
        except (OSError, ValueError):
            return  # the pipe broke or was closed under us: that is EOF
