"""Directory trees a fork copies: their size under a bound, and a bounded copy of a live tree.

A forked turn-mode episode starts from a copy of its parent's workspace and private
home, which the parent's harness may change while they are copied. Both walks here go
by directory file descriptors, never by path: each entry is looked at with
``fstatat(dir_fd, name, AT_SYMLINK_NOFOLLOW)`` and opened with ``openat(dir_fd, name,
O_NOFOLLOW)``, so no symbolic link is followed at any depth. A link is copied as a link
(the harness made it; the child's sandbox decides what it may reach); a directory or
file that becomes a link between the look and the open is never entered, and the copy
fails. Sockets, FIFOs and devices are skipped; a file's set-user-ID and set-group-ID bits
are not copied.

:func:`tree_size` sizes trees (a quick refusal before anything starts; entries that
vanish meanwhile are not counted). :func:`copy_tree` counts the bytes as it copies them
and never writes past its bound: the target holds at most ``limit`` bytes of file
content, whatever the source grows to. Contents are copied with ``copy_file_range``,
which shares blocks where the filesystem can (btrfs, XFS, bcachefs ... clone extents
through it), else by reading and writing. Every failure of a copy (a bound passed, an
entry that vanished or became a link, a full disk, nesting deeper than
:data:`MAX_DEPTH`, more than :data:`MAX_ENTRIES` entries) is a ``ForkFailed`` whose
message says which entry and why.

Threads: any; nothing is shared.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path
from typing import NamedTuple

from gym_harness.errors import ForkFailed

__all__ = ["MAX_DEPTH", "MAX_ENTRIES", "TreeSize", "copy_tree", "tree_size"]

#: Most directories deep a copy goes (each level holds a few file descriptors open).
MAX_DEPTH = 128
#: Most entries (files, directories, links, anything else) one tree may hold for a copy:
#: empty files cost no bytes, yet a million of them take a copy minutes and as many inodes.
MAX_ENTRIES = 1 << 20
#: Most bytes one ``copy_file_range`` call is asked for.
_CHUNK = 1 << 30
#: Most bytes one read of the fallback copy holds.
_READ = 1 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: ``O_NONBLOCK``: an entry that became a FIFO between the look and the open never blocks.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: ``copy_file_range`` cannot copy between these two files: read and write instead.
_NO_RANGE = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})
_BECAME_LINK = frozenset({errno.ELOOP, errno.ENOTDIR})
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class TreeSize(NamedTuple):
    """What :func:`tree_size` counted."""

    bytes: int
    """Bytes of regular files."""
    entries: int
    """Entries of each root tree, the largest count."""


def tree_size(roots: list[Path], limit: int, max_entries: int = MAX_ENTRIES) -> TreeSize:
    """The bytes of the regular files under ``roots`` (links not followed), and the most
    entries one root holds; once the bytes pass ``limit``, or a root's entries pass
    ``max_entries``, the count stops there and returns what it has.

    Entries that vanish or change meanwhile, and levels below :data:`MAX_DEPTH`, are not
    counted: this is a quick refusal, and :func:`copy_tree` holds both bounds itself.
    """
    total, most = 0, 0
    for root in roots:
        try:
            fd = os.open(root, _DIR)
        except OSError:
            continue  # no such directory (or not one): nothing to count
        count = _Count(total, limit, max_entries)
        try:
            count.directory(fd, 0)
        finally:
            os.close(fd)
        total, most = count.bytes, max(most, count.entries)
        if count.over():
            break
    return TreeSize(total, most)


class _Count:
    """One root's walk for :func:`tree_size`: bytes (with the roots' before it) and entries."""

    def __init__(self, total: int, limit: int, max_entries: int) -> None:
        self.bytes, self.entries = total, 0
        self.limit, self.max_entries = limit, max_entries

    def over(self) -> bool:
        return self.bytes > self.limit or self.entries > self.max_entries

    def directory(self, fd: int, depth: int) -> None:
        with os.scandir(fd) as entries:
            for entry in entries:
                self.entries += 1
                try:
                    if entry.is_file(follow_symlinks=False):
                        self.bytes += entry.stat(follow_symlinks=False).st_size
                    elif entry.is_dir(follow_symlinks=False) and depth < MAX_DEPTH:
                        below = os.open(entry.name, _DIR, dir_fd=fd)
                        try:
                            self.directory(below, depth + 1)
                        finally:
                            os.close(below)
                except OSError:
                    continue  # vanished or became a link meanwhile
                if self.over():
                    break


def copy_tree(
    source: Path, target: Path, *, limit: int, copied: int = 0, max_entries: int = MAX_ENTRIES
) -> int:
    """Make ``target`` (a directory, emptied first) a copy of the live tree ``source``.

    Args:
        source: The directory to copy; it is opened without following a link.
        target: The directory to copy into (made if missing; what it holds is removed).
        limit: Most bytes of file content the copy (with ``copied``) may hold.
        copied: Bytes already copied under the same ``limit`` (an earlier tree's).
        max_entries: Most entries of ``source`` the copy looks at.

    Returns:
        ``copied`` plus the bytes of file content this copy wrote.

    Raises:
        ForkFailed: The copy stopped: ``source`` grew past ``limit`` (the target holds at
            most ``limit``), an entry vanished or became a link while it was copied, the
            disk is full, the tree is nested deeper than :data:`MAX_DEPTH` or holds more
            than ``max_entries`` entries. The message names the entry (under
            ``source``'s name) and the cause.
    """
    copy = _Copy(source.name, limit, copied, max_entries)
    try:
        target.mkdir(parents=True, exist_ok=True)
        _empty(target)
        src = os.open(source, _DIR)
        try:
            dst = os.open(target, _DIR)
            try:
                copy.directory(src, dst, 0)
                _same_metadata(os.fstat(src), dst)
            finally:
                os.close(dst)
        finally:
            os.close(src)
    except OSError as exc:
        raise copy.failed(exc) from exc
    return copy.copied


def _empty(target: Path) -> None:
    with os.scandir(target) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)  # fd-based on Linux: it follows no link either
            else:
                os.unlink(entry.path)


def _same_metadata(source: os.stat_result, fd: int, mode: int | None = None) -> None:
    os.chmod(fd, stat.S_IMODE(source.st_mode) if mode is None else mode)
    os.utime(fd, ns=(source.st_atime_ns, source.st_mtime_ns))


class _Copy:
    """One copy's running count and where it is (for the message if it fails)."""

    def __init__(self, root: str, limit: int, copied: int, max_entries: int) -> None:
        self.limit = limit
        self.copied = copied
        self.entries, self.max_entries = 0, max_entries
        self.at = root  # the entry being copied, under the root's name
        self.kind = "directory"  # what ``at`` is

    def directory(self, src: int, dst: int, depth: int) -> None:
        """Copy the entries of the open directory ``src`` into the open directory ``dst``."""
        here = self.at
        with os.scandir(src) as entries:
            for entry in entries:
                self.at, self.kind = f"{here}/{entry.name}", "entry"
                self.entries += 1
                if self.entries > self.max_entries:
                    raise _Crowded(self.at)
                mode = os.stat(entry.name, dir_fd=src, follow_symlinks=False).st_mode
                if stat.S_ISLNK(mode):
                    self.kind = "link"
                    os.symlink(os.readlink(entry.name, dir_fd=src), entry.name, dir_fd=dst)
                elif stat.S_ISDIR(mode):
                    self.kind = "directory"
                    self._subdirectory(src, dst, entry.name, mode, depth + 1)
                elif stat.S_ISREG(mode):
                    self.kind = "file"
                    self._file(src, dst, entry.name)
        self.at, self.kind = here, "directory"

    def _subdirectory(self, src: int, dst: int, name: str, mode: int, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise _Nested(self.at)
        try:
            below = os.open(name, _DIR, dir_fd=src)
        except OSError as exc:
            now = os.stat(name, dir_fd=src, follow_symlinks=False).st_mode
            if exc.errno == errno.ENOTDIR and not stat.S_ISLNK(now):
                raise _Replaced(self.at) from exc  # by a file, say
            raise
        try:
            os.mkdir(name, stat.S_IMODE(mode) | stat.S_IRWXU, dir_fd=dst)
            there = os.open(name, _DIR, dir_fd=dst)
            try:
                self.directory(below, there, depth)
                _same_metadata(os.fstat(below), there)
            finally:
                os.close(there)
        finally:
            os.close(below)

    def _file(self, src: int, dst: int, name: str) -> None:
        reader = os.open(name, _FILE, dir_fd=src)
        try:
            status = os.fstat(reader)
            if not stat.S_ISREG(status.st_mode):
                return  # became a FIFO, socket or device meanwhile: skipped, as those are
            mode = stat.S_IMODE(status.st_mode) & ~(stat.S_ISUID | stat.S_ISGID)
            writer = os.open(name, _NEW_FILE, mode, dir_fd=dst)
            try:
                self._content(reader, writer)
                _same_metadata(status, writer, mode)
            finally:
                os.close(writer)
        finally:
            os.close(reader)

    def _content(self, reader: int, writer: int) -> None:
        """Copy from ``reader``'s offset to its end, never past the bound."""
        ranged = True
        while self.copied < self.limit:
            want = min(_CHUNK, self.limit - self.copied)
            try:
                done = os.copy_file_range(reader, writer, want) if ranged else 0
            except OSError as exc:
                if exc.errno not in _NO_RANGE:
                    raise
                ranged = False  # nothing was copied by the failed call: go on by hand
            if not ranged:
                done = _read_write(reader, writer, min(want, _READ))
            if done == 0:
                return
            self.copied += done
        if os.pread(reader, 1, os.lseek(reader, 0, os.SEEK_CUR)):
            raise _Over(self.at)

    def failed(self, exc: OSError) -> ForkFailed:
        """The ``ForkFailed`` that says why the copy stopped at ``self.at``."""
        where = f"{self.kind} {self.at!r}"
        if isinstance(exc, _Over):
            why = (
                f"the tree grew past max_fork_bytes={self.limit} bytes while it was copied "
                f"({self.copied} bytes copied, {where} had more): the copy stopped at the "
                "bound. Raise max_fork_bytes, or fork when the harness has stopped writing"
            )
        elif isinstance(exc, _Nested):
            why = f"{where} is nested deeper than {MAX_DEPTH} directories; a fork copies no deeper"
        elif isinstance(exc, _Crowded):
            why = (
                f"the tree holds more than {self.max_entries} entries (files, directories, "
                f"links); a fork copies no more (stopped at {where})"
            )
        elif exc.errno == errno.ENOENT:
            why = f"{where} vanished while it was copied (the harness removed or renamed it)"
        elif exc.errno in _BECAME_LINK:
            why = (
                f"{where} became a symbolic link while it was copied (the harness replaced "
                "it); a fork never follows a link"
            )
        elif isinstance(exc, _Replaced) or (exc.errno == errno.EINVAL and self.kind == "link"):
            why = f"{where} was replaced while it was copied (the harness made it anew)"
        elif exc.errno in _NO_SPACE:
            why = (
                f"the disk ran out of space copying {where} ({exc.strerror}): free space on "
                "the disk that holds the workspaces, or point TMPDIR at a larger one"
            )
        else:
            why = f"could not copy {where}: {exc.strerror or exc}"
        return ForkFailed(why)


class _Over(OSError):
    """The bound was reached with more of a file to copy."""


class _Replaced(OSError):
    """An entry that is no longer of the type it was when it was looked at (not a link)."""


class _Nested(OSError):
    """A directory deeper than ``MAX_DEPTH``."""


class _Crowded(OSError):
    """An entry past the copy's ``max_entries``."""


def _read_write(reader: int, writer: int, size: int) -> int:
    data = os.read(reader, size)
    view = memoryview(data)
    while view:
        view = view[os.write(writer, view) :]
    return len(data)
