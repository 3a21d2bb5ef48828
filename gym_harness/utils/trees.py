"""Directory trees a fork copies: their size under a bound, and a copy-on-write copy.

A forked turn-mode episode starts from a copy of its parent's workspace and private
home. :func:`tree_bytes` sizes them without following links, and stops counting past
its bound; :func:`copy_tree` copies one, cloning each file's blocks where the filesystem
can (``FICLONE``: btrfs, XFS, bcachefs ...), else with ``copy_file_range`` (which shares
blocks where the kernel can), else by reading and writing. Symbolic links are copied as
links, never followed (the harness made them); sockets, FIFOs and devices are skipped.

Threads: any; nothing is shared.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
from pathlib import Path

__all__ = ["copy_tree", "tree_bytes"]

#: ``ioctl(dst, FICLONE, src)``: share every block of ``src`` (Linux).
FICLONE = 0x40049409
#: Most bytes one ``copy_file_range`` call is asked for.
_CHUNK = 1 << 30


def tree_bytes(roots: list[Path], limit: int) -> int:
    """The bytes of the regular files under ``roots`` (links not followed); once the sum
    passes ``limit`` the count stops there and returns what it has (more than ``limit``)."""
    total = 0
    stack = [str(root) for root in roots if root.is_dir()]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
                    if total > limit:
                        return total
    return total


def copy_tree(source: Path, target: Path) -> None:
    """Make ``target`` (a directory, emptied first) a copy of ``source``."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in os.scandir(target):
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path)
        else:
            path.unlink()
    _copy_into(source, target)
    shutil.copystat(source, target, follow_symlinks=False)


def _copy_into(source: Path, target: Path) -> None:
    with os.scandir(source) as entries:
        for entry in entries:
            there = target / entry.name
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                os.symlink(os.readlink(entry.path), there)
            elif stat.S_ISDIR(mode):
                there.mkdir(mode=stat.S_IMODE(mode) | 0o700)
                _copy_into(Path(entry.path), there)
                shutil.copystat(entry.path, there, follow_symlinks=False)
            elif stat.S_ISREG(mode):
                _copy_file(entry.path, there, stat.S_IMODE(mode))


def _copy_file(source: str, target: Path, mode: int) -> None:
    src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            try:
                fcntl.ioctl(dst, FICLONE, src)
                return
            except OSError:
                pass  # no block cloning here
            try:
                while os.copy_file_range(src, dst, _CHUNK):
                    pass
            except OSError:
                os.lseek(src, 0, os.SEEK_SET)
                os.lseek(dst, 0, os.SEEK_SET)
                os.ftruncate(dst, 0)
                with open(src, "rb", closefd=False) as reader, open(dst, "wb", closefd=False) as w:
                    shutil.copyfileobj(reader, w)
        finally:
            os.close(dst)
    finally:
        os.close(src)
