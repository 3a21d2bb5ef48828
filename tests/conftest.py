"""Test-wide guards: loopback-only network, and no process left behind.

* At start the whole test session moves into a fresh network namespace with
  only ``lo`` up (the thread-level ``unshare(CLONE_NEWNET)``; every thread and
  process started later inherits it), so nothing a test starts, real harness
  CLIs included, can reach beyond 127.0.0.1. Where that is impossible (not root,
  no user namespaces) the ``isolated_network`` fixture skips the tests that need it.
* An autouse guard fails any test that leaves a process behind: a descendant of
  this process, or any process carrying this session's ``GYM_HARNESS_SESSION``
  tag (which ``HarnessProcess`` forwards to every harness, so orphans that
  re-parented to PID 1 are found too). It kills what it finds, by pid.
* Under pytest-xdist (``-n 2``) each worker is a session of its own here: its own
  network namespace and its own tag, so neither worker's guard sees the other's processes.
"""

from __future__ import annotations

import ctypes
import os
import time
import uuid
from collections.abc import Iterator

import psutil
import pytest
from support.bridges import bridge, bridge_args  # noqa: F401  (fixtures: one bridge builder)
from support.gate import gate  # noqa: F401  (a fixture: shared by the bridge tests)
from support.process import tagged_processes

from gym_harness.process.confine import bring_loopback_up
from gym_harness.process.keeper_client import SESSION_VAR

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000

_network_isolated: str | None = None  # None = isolated; otherwise why not


def _isolate_network() -> str | None:
    if os.environ.get("GYM_HARNESS_TEST_NETNS") == "off":
        return "GYM_HARNESS_TEST_NETNS=off"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
            return f"cannot create a network namespace: {os.strerror(ctypes.get_errno())}"
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    bring_loopback_up()
    return None


def pytest_configure(config: pytest.Config) -> None:
    global _network_isolated
    _network_isolated = _isolate_network()
    if "PYTEST_XDIST_WORKER" in os.environ:  # each worker guards its own processes only
        os.environ[SESSION_VAR] = uuid.uuid4().hex
    else:
        os.environ.setdefault(SESSION_VAR, uuid.uuid4().hex)


@pytest.fixture
def isolated_network() -> None:
    """Skip unless this session runs in a loopback-only network namespace."""
    if _network_isolated is not None:
        pytest.skip(f"network not isolated ({_network_isolated})")


def _leftovers(before: set[int], tag: str) -> list[psutil.Process]:
    procs = {p.pid: p for p in psutil.Process().children(recursive=True)}
    procs.update((p.pid, p) for p in tagged_processes(tag))
    alive = []
    for pid, proc in procs.items():
        try:
            if pid not in before and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Fail the test if it leaves any process of ours running."""
    tag = os.environ[SESSION_VAR]
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    before.update(p.pid for p in tagged_processes(tag))
    yield
    deadline = time.monotonic() + 3.0
    left = _leftovers(before, tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _leftovers(before, tag)
    if not left:
        return
    described = []
    for proc in left:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(left, timeout=3)
    pytest.fail("test left processes running:\n" + "\n".join(described))
