"""What the keeper reads, writes and removes in ``/proc``, cgroupfs and the filesystem.

Stdlib only: the keeper (a ``python -I -S`` script) loads this file by its path, and the
owner imports it as ``gym_harness.process.procfs``.
"""

from __future__ import annotations

import os

__all__ = [
    "PAGE",
    "cgroup_base",
    "cgroup_event",
    "descendants",
    "remove_tree",
    "disk_bytes",
    "resident_bytes",
    "shared_bytes",
    "write_file",
]

PAGE = os.sysconf("SC_PAGE_SIZE")


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root``, parents before children, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
            try:
                stat = os.read(fd, 1024)
            finally:
                os.close(fd)
        except OSError:
            continue  # gone
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split(b" ", 2)
        if len(fields) >= 2 and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    found, queue = [], [root]
    while queue:
        for pid in children.get(queue.pop(), ()):
            found.append(pid)
            queue.append(pid)
    return found


def cgroup_base() -> str | None:
    """The directory of this process's cgroup v2 when we may create cgroups in it."""
    try:
        with open("/proc/self/cgroup") as f:
            own = next((line[3:].strip() for line in f if line.startswith("0::")), None)
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    if own is None:
        return None
    for fields in mounts:
        sep = fields.index("-") if "-" in fields else -1
        if sep < 0 or fields[sep + 1] != "cgroup2":
            continue
        root, point = fields[3], fields[4]
        rel = own if root == "/" else own[len(root) :] if own.startswith(root) else None
        if rel is None:
            continue
        base = point + rel.rstrip("/")
        if os.access(base, os.W_OK) and os.access(f"{base}/cgroup.procs", os.W_OK):
            return base
    return None


def write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def remove_tree(path: str) -> None:
    """Delete ``path`` and everything in it, restoring permissions a harness removed.

    Only directories inside ``path`` (and ``path`` itself) are ever chmodded: never its
    parent (the temp dir), whatever fails.
    """
    import shutil  # only at the end of the keeper's life, or in the owner

    top = os.path.abspath(path)

    def fix(_func: object, failed: str, _exc: object) -> None:
        try:
            parent = os.path.dirname(os.path.abspath(failed))
            if parent == top or parent.startswith(top + os.sep):
                os.chmod(parent, 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)
        except OSError:
            pass

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=fix)


def cgroup_event(cgroup: str, controller: str, key: str) -> bool:
    """Whether ``cgroup``'s ``CONTROLLER.events`` counts ``key`` above zero."""
    if not cgroup:
        return False
    try:
        with open(f"{cgroup}/{controller}.events") as f:
            return any(line.split()[:1] == [key] and line.split()[1] != "0" for line in f)
    except (OSError, IndexError):
        return False


def resident_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0  # gone


def shared_bytes(pids: list[int], view: bool) -> int:
    """Shared memory the tree holds that its resident pages do not show.

    Memory files (``memfd_create``) held open and not mapped (a mapped one's touched pages
    are resident already), each counted once; and, with a view (``view``), what the
    files of its private ``/dev/shm`` (a tmpfs) hold.
    """
    total, seen, unmapped = 0, set(), []
    for pid in pids:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone
        held = []
        for name in names:
            path = f"/proc/{pid}/fd/{name}"
            try:
                if not os.readlink(path).startswith("/memfd:"):
                    continue
                found = os.stat(path)
            except OSError:
                continue
            if (found.st_dev, found.st_ino) not in seen:
                seen.add((found.st_dev, found.st_ino))
                held.append(found)
        if held:
            unmapped += [(pid, found) for found in held]
    mapped = _mapped_memfds({pid for pid, _ in unmapped})
    total += sum(found.st_blocks * 512 for _, found in unmapped if found.st_ino not in mapped)
    if view:
        for pid in pids:
            try:
                shm = os.statvfs(f"/proc/{pid}/root/dev/shm")
            except OSError:
                continue
            total += (shm.f_blocks - shm.f_bfree) * shm.f_frsize
            break
    return total


def _mapped_memfds(pids: set[int]) -> set[int]:
    """The inodes of the memory files mapped by ``pids`` (from ``/proc/PID/maps``)."""
    inodes = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                for line in f:
                    if b"/memfd:" in line:
                        inodes.add(int(line.split()[4]))
        except (OSError, ValueError, IndexError):
            continue
    return inodes


def disk_bytes(roots: list[str], limit: int) -> int:
    """The disk the files under ``roots`` hold (allocated blocks, each inode once, links
    not followed); the count stops once past ``limit``."""
    total, seen, stack = 0, set(), list(roots)
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue  # gone, or made unreadable by the harness: its bytes count elsewhere
        with entries:
            for entry in entries:
                try:
                    found = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                # Only a directory (through a bind mount) or a hard-linked file can be met
                # twice: a tree of many plain files costs the walk no memory per file.
                if found.st_nlink > 1 or entry.is_dir(follow_symlinks=False):
                    if (found.st_dev, found.st_ino) in seen:
                        continue
                    seen.add((found.st_dev, found.st_ino))
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                total += found.st_blocks * 512
                if total > limit:
                    return total
    return total
