"""A harness's process tree, seen from its owner: snapshot, end, and the lost-keeper case.

While its keeper lives, the tree is exactly the keeper's descendants (the keeper
is a child subreaper: orphans re-parent to it), and the keeper ends it. If the
keeper dies (a harness can kill it: same user), the owner ends what it can still
find: with a cgroup, all of it; without one, the root's descendants, everything
in the root's session or process group (those ids outlive the root and are never
reused while in use), and processes carrying the harness's marker. A descendant
that re-parented to the keeper, called ``setsid`` and cleared its environment
before the keeper was killed escapes this fallback: only a cgroup finds it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

import psutil

__all__ = ["ProcessUsage", "end", "end_lost", "marked_pids", "snapshot", "usage"]

MARKER_VAR = "GYM_HARNESS_MARKER"
_LOST_KILL_S = 1.0
_REAP_WAIT_S = 0.5


@dataclass(frozen=True)
class ProcessUsage:
    """Resources used by a harness tree at one moment.

    Args:
        rss_bytes: Resident memory of every live process of the tree, summed.
        cpu_seconds: User plus system CPU time of those processes.
        num_processes: How many processes the tree has.
    """

    rss_bytes: int
    cpu_seconds: float
    num_processes: int


class Keeper(Protocol):
    """What this module needs of a keeper (``keeper_client.KeeperClient``)."""

    pid: int
    dead: bool

    def end(self, grace_s: float) -> bool: ...


class Child(Protocol):
    """What this module needs of a harness started by a keeper (``keeper_client.Child``)."""

    pid: int
    marker: str
    cgroup: str
    returncode: int | None

    @property
    def keeper(self) -> Keeper: ...

    def wait(self, timeout: float | None = None) -> int: ...


def snapshot(child: Child | None) -> dict[int, psutil.Process]:
    """Every live process of the harness's tree (the keeper's descendants)."""
    if child is None or child.keeper.dead:
        return {}
    try:
        keeper = psutil.Process(child.keeper.pid)
        return {proc.pid: proc for proc in keeper.children(recursive=True)}
    except psutil.Error:
        return {}


def usage(child: Child | None) -> tuple[int, float, int]:
    """``(rss_bytes, cpu_seconds, num_processes)`` summed over the tree's live processes."""
    rss, cpu, count = 0, 0.0, 0
    for proc in snapshot(child).values():
        try:
            with proc.oneshot():
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                rss += proc.memory_info().rss
                times = proc.cpu_times()
                cpu += times.user + times.system
                count += 1
        except psutil.Error:
            continue
    return rss, cpu, count


def end(child: Child, grace_s: float) -> None:
    """Have the keeper SIGTERM the tree, wait ``grace_s``, then SIGKILL every descendant.

    Falls back to ``end_lost`` when the keeper is gone or does not answer.
    """
    if not child.keeper.end(grace_s) and child.returncode is None:  # nor did the watcher
        end_lost(child.pid, child.marker, child.cgroup)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=_REAP_WAIT_S)


def end_lost(pid: int, marker: str, cgroup: str) -> None:
    """SIGKILL what can be found of a tree whose keeper died; remove its cgroup. Never raises."""
    if cgroup:
        with contextlib.suppress(OSError), open(f"{cgroup}/cgroup.kill", "w") as f:
            f.write("1")
    deadline = time.monotonic() + _LOST_KILL_S
    while True:
        found = _lost_members(pid, marker, cgroup)
        for member in found:
            with contextlib.suppress(OSError):
                os.kill(member, signal.SIGKILL)
        if not found or time.monotonic() > deadline:
            break
        time.sleep(0.01)  # the killed may have forked: look again
    if cgroup:  # it empties as the killed finish exiting: give that its own bound
        deadline = time.monotonic() + _LOST_KILL_S
        while True:
            try:
                os.rmdir(cgroup)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)


def marked_pids(markers: Collection[str]) -> list[int]:
    """Return the pids, other than ours, whose environment carries one of ``markers``."""
    needles = [f"\0{MARKER_VAR}={marker}\0".encode() for marker in markers]
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                data = b"\0" + f.read() + b"\0"
        except OSError:  # gone, or not ours to read
            continue
        if any(needle in data for needle in needles):
            found.append(int(name))
    return found


def _lost_members(root: int, marker: str, cgroup: str) -> list[int]:
    """Live processes of a keeper-less tree: see the module docstring."""
    table: dict[int, tuple[int, int, int]] = {}  # pid: (ppid, pgid, sid)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split(b" ", 5)
        if len(fields) >= 5 and fields[0] not in (b"Z", b"X"):
            table[int(name)] = (int(fields[1]), int(fields[2]), int(fields[3]))
    members = {pid for pid, (_, pgid, sid) in table.items() if root in (pgid, sid)}
    if root in table:
        members.add(root)
    if cgroup:
        with contextlib.suppress(OSError), open(f"{cgroup}/cgroup.procs") as f:
            members.update(int(line) for line in f if line.strip())
    members.update(marked_pids([marker]))
    members.discard(os.getpid())
    # Descendants of members are members.
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    queue = list(members)
    while queue:
        for pid in children.get(queue.pop(), ()):
            if pid not in members:
                members.add(pid)
                queue.append(pid)
    return sorted(pid for pid in members if pid in table)
