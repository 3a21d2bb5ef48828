"""Ending a harness's whole process tree.

The tree is the root, its descendants, and every process whose environment
carries the harness's marker (descendants that called ``setsid``, daemons that
double-forked and were re-parented to PID 1). It is snapshotted before each
signal: SIGTERM, the grace, then a second snapshot (to catch what forked
meanwhile) and SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable

import psutil

from gym_harness import _keeper

__all__ = ["end", "snapshot"]

_KILL_WAIT_S = 0.5


def snapshot(popen: subprocess.Popen[bytes] | None, marker: str) -> dict[int, psutil.Process]:
    """The root (while unreaped), its descendants and every process carrying ``marker``."""
    procs: dict[int, psutil.Process] = {}
    # Once reaped, the root's pid may belong to a stranger: trust the marker alone.
    if popen is not None and popen.poll() is None:
        try:
            root = psutil.Process(popen.pid)
            procs[root.pid] = root
            procs.update((child.pid, child) for child in root.children(recursive=True))
        except psutil.Error:
            pass
    for pid in _keeper.marked_pids([marker]):
        try:
            procs.setdefault(pid, psutil.Process(pid))
        except psutil.Error:
            continue
    return procs


def end(popen: subprocess.Popen[bytes], marker: str, grace_s: float) -> None:
    """SIGTERM the tree, wait ``grace_s``, SIGKILL what is left, reap the root.

    Raises:
        psutil.Error, OSError: Rarely, from the process table; callers suppress them.
    """
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, _KILL_WAIT_S)):
        procs = snapshot(popen, marker)
        if popen.poll() is None:  # its group, while the pid is surely still ours
            with contextlib.suppress(OSError):
                os.killpg(popen.pid, sig)
        for proc in procs.values():
            try:
                proc.send_signal(sig)
            except psutil.Error:
                continue
        _wait_gone(popen, procs.values(), wait_s)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(timeout=_KILL_WAIT_S)


def _wait_gone(
    popen: subprocess.Popen[bytes], procs: Iterable[psutil.Process], timeout_s: float
) -> None:
    """Wait until every process in ``procs`` is gone or a zombie (reaping ours)."""
    pending = list(procs)
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while True:
        popen.poll()  # reap the root so it does not linger as a zombie
        pending = [p for p in pending if _running(p)]
        remaining = deadline - time.monotonic()
        if not pending or remaining <= 0:
            return
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.02)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
