"""HarnessProcess ends whole trees: on stop(), on the owner's death, over many cycles."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from support import OWNER_SCRIPT
from support.process import SCRIPT, is_ready, running, spec, wait_gone

from gym_harness.config import ProcessSpec
from gym_harness.process.harness_process import HarnessProcess
from gym_harness.process.keeper_client import hold, unhold
from gym_harness.readiness import start_ready

OWNER = OWNER_SCRIPT
ROOT = Path(__file__).parents[2]


def start_family(proc: HarnessProcess) -> list[int]:
    start_ready(proc, is_ready)
    pids: list[int] = json.loads(proc.read_line(timeout_s=10) or "{}")["pids"]
    assert len(pids) == 4 and all(running(pid) for pid in pids)
    return pids


def test_stop_ends_group_setsid_grandchild_and_daemon() -> None:
    proc = HarnessProcess(spec("family", stop_grace_s=0.5))
    pids = start_family(proc)
    harness, _child, grandchild, daemon = pids
    assert psutil.Process(grandchild).ppid() != harness  # re-parented or in another session
    assert psutil.Process(daemon).ppid() != harness
    assert proc.usage().num_processes == 4
    proc.stop()
    assert wait_gone(pids) == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_family_dies_with_its_owner(sig: signal.Signals) -> None:
    """The owner dies without stop(): SIGKILL, or SIGTERM as close(terminate=True) sends."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    owner = subprocess.Popen(
        [sys.executable, str(OWNER)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert owner.stdout is not None
        report = json.loads(owner.stdout.readline())
        pids = [*report["family"], report["keeper"]]
        assert all(running(pid) for pid in pids)
    finally:
        owner.send_signal(sig)
        owner.wait(timeout=10)
        if owner.stdout is not None:
            owner.stdout.close()
    assert owner.returncode == -sig
    assert wait_gone(pids, timeout_s=2.0) == []


def test_each_harness_has_its_own_keeper_which_parents_it_and_exits_with_it() -> None:
    first, second = HarnessProcess(spec("echo")), HarnessProcess(spec("echo"))
    start_ready(first, is_ready)
    start_ready(second, is_ready)
    keepers = [first.keeper_pid, second.keeper_pid]
    assert keepers[0] != keepers[1] and all(running(k) for k in keepers)  # type: ignore[arg-type]
    assert psutil.Process(first.pid).ppid() == keepers[0]
    assert psutil.Process(keepers[0]).ppid() == os.getpid()  # type: ignore[arg-type]
    first.stop()
    assert wait_gone([keepers[0]]) == [] and running(keepers[1])  # type: ignore[list-item,arg-type]
    second.stop()
    assert wait_gone(keepers) == []  # type: ignore[arg-type]


def test_a_held_keeper_serves_harness_after_harness() -> None:
    hold()
    try:
        with HarnessProcess(spec("echo")) as proc:
            start_ready(proc, is_ready)
            keeper = proc.keeper_pid
        assert keeper is not None and running(keeper)
        with HarnessProcess(spec("echo")) as proc:
            start_ready(proc, is_ready)
            assert proc.keeper_pid == keeper
    finally:
        unhold()
    assert wait_gone([keeper]) == []


def test_a_released_keeper_that_does_not_quit_is_killed_within_its_bound() -> None:
    """Letting a keeper go is bounded: one that cannot quit (stopped) is killed."""
    hold()
    try:
        with HarnessProcess(spec("echo")) as proc:
            start_ready(proc, is_ready)
            keeper = proc.keeper_pid
        assert keeper is not None and running(keeper)  # idle, held for the next harness
        os.kill(keeper, signal.SIGSTOP)  # now it cannot act on being asked to quit
    finally:
        unhold()
    assert wait_gone([keeper], timeout_s=10) == []


def _open_fds_and_threads() -> tuple[int, int]:
    return psutil.Process().num_fds(), threading.active_count()


@pytest.mark.timeout(120)
def test_200_start_stop_cycles_leave_nothing_behind() -> None:
    cfg = ProcessSpec(command=("sh", "-c", "echo ready; exec cat"), stop_grace_s=1.0)
    with HarnessProcess(cfg) as warm_up:  # the spawner thread starts once and stays
        start_ready(warm_up, lambda line: line == "ready")
    before = _open_fds_and_threads()
    pids = []
    for n in range(200):
        with HarnessProcess(cfg) as proc:
            start_ready(proc, lambda line: line == "ready")
            proc.write_line(f"ping {n}", timeout_s=10)
            assert proc.read_line(timeout_s=10) == f"ping {n}"
            pids.append(proc.pid)
    assert wait_gone(pids) == []  # type: ignore[arg-type]
    assert _open_fds_and_threads() == before


def test_family_script_reports_real_pids() -> None:
    """Guards the fixture itself: the pids it prints are its own family."""
    with HarnessProcess(spec("family")) as proc:
        harness, child, _grandchild, _daemon = start_family(proc)
        assert harness == proc.pid
        assert psutil.Process(child).ppid() == harness
        assert str(SCRIPT) in " ".join(psutil.Process(child).cmdline())
