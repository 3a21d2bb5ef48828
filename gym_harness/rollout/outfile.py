"""The rollout's output file: records stream to ``OUT.partial``, renamed to ``OUT`` at the end.

``gym-harness rollout --out OUT`` writes each record to ``OUT.partial`` as its episode
ends (a visible file: ``tail -f`` follows it) and renames it over ``OUT`` once every
episode is recorded, so a run that fails or is stopped never truncates an existing
``OUT``. ``RecordFile.write`` writes a record's whole line or nothing: one line is one
``write`` of its encoded bytes (looped over short writes), and a write that fails
(ENOSPC, EIO) or is cut by a signal (Ctrl-C, SIGTERM) truncates the file back to where
the line began, so the file only ever holds whole records and ``records`` counts exactly
those.

``resume`` reads what an earlier run of the same rollout kept (``OUT.partial``, else
``OUT``) and says which episodes of the plan are recorded; a grouped episode counts as
recorded only when all of its forks are.

Threads: the rollout's writing thread only (``schedule`` writes every record in the
caller's thread).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["RecordFile", "partial_path", "resume"]


def partial_path(target: Path) -> Path:
    """Where the records of a rollout into ``target`` stream: ``OUT.partial``."""
    return target.with_name(target.name + ".partial")


def _whole_lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """The records of ``path`` with their lines; a cut last line or a non-record is skipped."""
    with path.open("r", encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if not line.endswith("\n"):
                return  # cut by a crash: the episode runs again
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "task_id" in record and "episode_index" in record:
                yield line, record


def resume(target: Path, group: int | None) -> tuple[set[tuple[str, int]], int]:
    """Keep the whole episodes an earlier rollout into ``target`` recorded; say which.

    Reads ``OUT.partial`` (else ``OUT``; else nothing is recorded), keeps each recorded
    episode's lines once (a grouped episode only when all ``group`` of its forks are
    there), and writes them to ``OUT.partial`` (through a temporary file and a rename),
    which the rollout then appends to.

    Args:
        target: ``--out``.
        group: The rollout's group size (``None``: no groups).

    Returns:
        The (task id, episode index of the plan) pairs recorded, and how many records
        ``OUT.partial`` now holds.
    """
    partial = partial_path(target)
    source = partial if partial.exists() else target if target.exists() else None
    if source is None:
        return set(), 0
    size = group or 1
    members: dict[tuple[str, int], dict[int, str]] = {}
    for line, record in _whole_lines(source):
        index = record["episode_index"]
        if not isinstance(index, int):
            continue
        key = (str(record["task_id"]), index // size)
        members.setdefault(key, {}).setdefault(index, line)
    done = {key for key, lines in members.items() if len(lines) == size}
    kept = [line for key in done for line in members[key].values()]
    temp = partial.with_name(f".{partial.name}.resume")
    try:
        with temp.open("w", encoding="utf-8") as out:
            out.writelines(kept)
        os.replace(temp, partial)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
    return done, len(kept)


class RecordFile:
    """``OUT.partial``, written a whole line at a time (see the module docstring).

    Args:
        path: The file (``partial_path(OUT)``).
        append: Add to what it holds (``--resume``); otherwise it is emptied first.
        records: How many records it holds already (with ``append``).
    """

    def __init__(self, path: Path, *, append: bool = False, records: int = 0) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        self.path = path
        self.fd = os.open(path, flags, 0o666)  # the umask applies, as for open(OUT, "w")
        self.records = records if append else 0
        self.failed: OSError | None = None

    def write(self, text: str) -> int:
        """Write one record's line whole, or nothing.

        Raises:
            OSError: The write failed (``failed`` keeps it); the file was truncated back
                to where the line began (as it is for a signal's exception).
        """
        data = memoryview(text.encode("utf-8"))
        start = os.lseek(self.fd, 0, os.SEEK_END)
        try:
            while data:
                data = data[os.write(self.fd, data) :]
        except BaseException as exc:  # a full disk, or a signal between two short writes
            if isinstance(exc, OSError):
                self.failed = exc
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, start)
            raise
        self.records += 1
        return len(text)

    def flush(self) -> None:
        """Nothing to flush: each line went to the file in ``write``."""

    def close(self) -> None:
        """Close the file. Idempotent; never raises."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
