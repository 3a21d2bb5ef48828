"""Shared memory for text observations of any length (``AsyncVectorEnv(shared_memory=True)``).

Gymnasium's shared-memory path allocates one fixed buffer per vector env, once,
and reads it back through the object ``read_from_shared_memory`` returned at
construction. Free text has no useful fixed size (our spaces allow 16M code
points, 64 MiB of UTF-8 per env), so each sub-env gets a *growable* segment
instead: an anonymous memory file (``memfd_create``; an unlinked temporary file
where that is missing). The worker writes an observation by resizing its file
to the text's UTF-8 length and writing the bytes; the parent reads the file's
size and bytes back. The file size is the length header, so nothing else is
shared, and memory held is the current text, not a worst case.

Ordering needs no lock: a worker writes before it answers on its pipe, and the
parent reads only after that answer (gymnasium's own protocol).

Nothing has a name in ``/dev/shm``: a segment is freed by the kernel once the
last process holding its descriptor exits or closes it (workers at exit, the
parent when the vector env is garbage-collected), so ``close(terminate=True)``
leaves nothing behind either.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from multiprocessing import context, reduction
from typing import Any, overload

__all__ = ["TextBatchView", "TextSegments"]

# Lone surrogates pass through too, so any Python str round-trips exactly.
_ERRORS = "surrogatepass"


def _new_segment() -> int:
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        return int(memfd_create("gym_harness-text", 0))
    fd, path = tempfile.mkstemp(prefix="gym_harness-text-")
    os.unlink(path)  # the open descriptor keeps the file; no name is left behind
    return fd


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class TextSegments:
    """One growable shared segment per sub-env, holding that env's latest text.

    Built in the parent by ``create_shared_memory``; travels to each worker as a
    ``Process`` argument (inherited on fork; descriptors passed along with the
    process on spawn and forkserver, like multiprocessing's own shared arrays).

    Args:
        n: How many sub-envs.

    Example:
        >>> segments = TextSegments(2)
        >>> segments.write(1, "héllo 🎉")
        >>> segments.read(1), segments.read(0)
        ('héllo 🎉', '')
        >>> segments.close()
    """

    def __init__(self, n: int, *, _fds: Sequence[int] | None = None) -> None:
        self.fds: tuple[int, ...] = (
            tuple(_new_segment() for _ in range(n)) if _fds is None else tuple(_fds)
        )
        self._finalizer = weakref.finalize(self, _close_all, self.fds)

    def __len__(self) -> int:
        return len(self.fds)

    def write(self, index: int, text: str) -> None:
        """Store ``text`` as the text of sub-env ``index`` (replacing the last one)."""
        data = text.encode("utf-8", _ERRORS)
        fd = self.fds[index]
        os.ftruncate(fd, len(data))  # shrinks too: memory follows the current text
        view = memoryview(data)
        offset = 0
        while offset < len(data):  # pwrite may write less than asked
            offset += os.pwrite(fd, view[offset:], offset)

    def read(self, index: int) -> str:
        """The text sub-env ``index`` wrote last (``""`` before any write)."""
        fd = self.fds[index]
        size = os.fstat(fd).st_size
        chunks: list[bytes] = []
        offset = 0
        while offset < size:
            chunk = os.pread(fd, size - offset, offset)
            if not chunk:  # cut short by a writer killed mid-write; keep what is there
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks).decode("utf-8", _ERRORS)

    def close(self) -> None:
        """Close this process's descriptors (the kernel frees a segment with its last one)."""
        self._finalizer()

    def __reduce__(self) -> tuple[Any, ...]:
        # Only while a worker process is being started, as for multiprocessing's own
        # shared objects: a descriptor cannot travel in an ordinary pickle.
        context.assert_spawning(self)
        return _rebuild, tuple(reduction.DupFd(fd) for fd in self.fds)


def _rebuild(*dup_fds: Any) -> TextSegments:
    return TextSegments(len(dup_fds), _fds=[dup.detach() for dup in dup_fds])


class TextBatchView(Sequence[str]):
    """The batch of texts as the parent sees it: each item read when it is asked for.

    ``AsyncVectorEnv`` keeps this object as its observations and returns a deep
    copy of it (``copy=True``, the default), which is a plain ``tuple`` of ``str``,
    the same batch as with ``shared_memory=False``. With ``copy=False`` the view
    itself is returned; it then shows the texts of the latest step.

    Args:
        segments: The segments of the vector env.
    """

    def __init__(self, segments: TextSegments) -> None:
        self.segments = segments

    def __len__(self) -> int:
        return len(self.segments)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...

    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        if isinstance(index, slice):
            return tuple(self.segments.read(i) for i in range(len(self))[index])
        return self.segments.read(range(len(self))[index])  # negative indices, IndexError

    def __iter__(self) -> Iterator[str]:
        return (self.segments.read(i) for i in range(len(self)))

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TextBatchView | tuple | list):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # its items change under it

    def __repr__(self) -> str:
        return f"TextBatchView({tuple(self)!r})"
