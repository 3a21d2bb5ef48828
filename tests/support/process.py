"""The fake harness of the process tests (``scripts/harness.py``) and pid checks."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil

from gym_harness.config import ProcessSpec
from gym_harness.process.keeper_client import SESSION_VAR
from support import HARNESS_SCRIPT

__all__ = [
    "SCRIPT",
    "is_ready",
    "removed",
    "running",
    "spec",
    "tagged_processes",
    "wait_gone",
]

SCRIPT = HARNESS_SCRIPT


def spec(mode: str, **changes: object) -> ProcessSpec:
    """A process spec that starts ``scripts/harness.py`` in ``mode``."""
    return ProcessSpec(command=(sys.executable, str(SCRIPT), mode), **changes)  # type: ignore[arg-type]


def is_ready(line: str) -> bool:
    """The fake harness's readiness line."""
    return line == '{"type":"ready"}'


def running(pid: int) -> bool:
    """The pid runs (a zombie counts as exited)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: list[int], timeout_s: float = 5.0) -> list[int]:
    """Return the pids still running after a bounded wait."""
    deadline = time.monotonic() + timeout_s
    left = [pid for pid in pids if running(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [pid for pid in left if running(pid)]
    return left


def removed(path: Path, timeout_s: float = 15.0) -> bool:
    """Whether ``path`` is gone within ``timeout_s`` (polled)."""
    deadline = time.monotonic() + timeout_s
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not path.exists()


def tagged_processes(tag: str) -> list[psutil.Process]:
    """The processes but this one whose environment carries the test session's ``tag``
    (``GYM_HARNESS_SESSION``, which every harness and keeper inherits)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(SESSION_VAR) == tag:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def namespaces_in_use() -> set[int]:
    """The inodes of every network namespace a live process is in (what ``/proc`` shows)."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                found.add(os.stat(f"/proc/{name}/ns/net").st_ino)
            except OSError:
                continue  # gone, or not ours to look at
    return found
