"""Vector envs whose worker (in sync mode: whose harness) is SIGKILLed mid-step.

Each mode gives what the README documents: our entry point (``make_vec``'s default) a
``worker_lost`` step and a fresh worker, sync mode a ``harness_crashed`` step, gymnasium's
own ``AsyncVectorEnv`` (``vectorization_mode="async"``) its ``EOFError``. Then ``close()``
returns within a bound and nothing is left: no process, no workspace, no listening
socket. "Mid-step" is exact: the harness emits an event from inside the turn and the
``on_event`` callback does the killing, in the worker (or, in sync mode, the caller).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import psutil
import pytest
from support import LINE_AGENT
from support.process import wait_gone

import gym_harness  # noqa: F401  (registers the env ids)
from gym_harness.errors import WorkerLost
from gym_harness.records.events import HarnessEvent
from gym_harness.vector import HarnessVectorEnv

COMMAND = [sys.executable, str(LINE_AGENT)]
#: Sub-env 1 pauses mid-turn (and is killed); the others answer.
ACTIONS = np.array(["a", "pause", "c"], dtype=object)
CLOSE_BOUND_S = 10.0
GONE_BOUND_S = 10.0


def kill_own_worker(event: HarnessEvent) -> None:
    """``on_event`` in a vector worker: SIGKILL the worker itself while its turn runs."""
    if event.data.get("type") == "paused":
        os.kill(os.getpid(), signal.SIGKILL)


def kill_the_harness(event: HarnessEvent) -> None:
    """``on_event`` in sync mode (this process): SIGKILL the harness that paused."""
    if event.data.get("type") == "paused":
        os.kill(int(event.data["pid"]), signal.SIGKILL)


def make(mode: str, num_envs: int = 3) -> gymnasium.vector.VectorEnv:
    kwargs: dict[str, Any] = {"command": COMMAND, "on_event": kill_own_worker}
    if mode == "default":
        return gymnasium.make_vec("gym_harness/Command-v0", num_envs=num_envs, **kwargs)
    if mode == "sync":
        kwargs["on_event"] = kill_the_harness
    return gymnasium.make_vec(
        "gym_harness/Command-v0", num_envs=num_envs, vectorization_mode=mode, **kwargs
    )


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def roots_of(envs: gymnasium.vector.VectorEnv) -> list[Path]:
    """Each sub-env's workspace root (the ``gym_harness-*`` directory), after a reset."""
    return [Path(w).parent.parent for w in envs.get_attr("workspace")]


def subtree(pid: int) -> list[int]:
    return [pid] + [p.pid for p in psutil.Process(pid).children(recursive=True)]


def gone_within(paths: list[Path], bound_s: float) -> list[Path]:
    """The paths still there after ``bound_s`` (polled)."""
    deadline = time.monotonic() + bound_s
    left = [p for p in paths if p.exists()]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if p.exists()]
    return left


def close_within(envs: gymnasium.vector.VectorEnv, bound_s: float, **kwargs: Any) -> list[str]:
    """Run ``envs.close(**kwargs)`` in a thread; fail if it has not returned by ``bound_s``.

    Returns:
        The warnings it gave.
    """
    errors: list[BaseException] = []
    caught: list[warnings.WarningMessage] = []

    def run() -> None:
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                envs.close(**kwargs)
            caught.extend(seen)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="close", daemon=True)
    thread.start()
    thread.join(bound_s)
    assert not thread.is_alive(), f"close({kwargs}) still blocked after {bound_s} s"
    assert errors == [], errors
    return [str(w.message) for w in caught]


def assert_nothing_left(pids: set[int], roots: list[Path]) -> None:
    """No process of ``pids``, no workspace root, no listening socket of those pids."""
    assert wait_gone(list(pids), GONE_BOUND_S) == []
    assert gone_within(roots, GONE_BOUND_S) == []
    listening = [
        c
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    ]
    assert listening == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["default", "vector_entry_point", "sync", "async"])
def test_a_kill_mid_step_gives_the_documented_result_and_close_returns(mode: str) -> None:
    before = descendants()
    envs = make(mode)
    try:
        envs.reset(seed=0)
        roots = roots_of(envs)
        pids = descendants() - before
        assert len(pids) >= 6  # a harness and a keeper per sub-env (and the workers)
        if mode == "async":  # gymnasium's own class: its bare EOFError
            assert type(envs) is gymnasium.vector.AsyncVectorEnv
            with pytest.raises(EOFError):
                envs.step(ACTIONS)
            # Why its close() without arguments cannot return, whatever runs in the workers:
            # step read sub-env 0's reply, met EOF on the dead worker's pipe (no process
            # holds its other end) and kept that pipe. close() then reads sub-env 0's pipe
            # again, while that worker waits for a command, and any read or write of the
            # dead pipe raises. terminate=True polls sub-env 0's pipe instead, and ends them.
            envs.processes[1].join(GONE_BOUND_S)
            assert envs.processes[1].exitcode == -signal.SIGKILL
            assert envs.parent_pipes[1] is not None and not envs.parent_pipes[1].closed
            assert envs.processes[0].is_alive() and not envs.parent_pipes[0].poll(0)
        else:
            obs, rewards, terminated, truncated, info = envs.step(ACTIONS)
            assert obs[0] == "echo: a" and obs[2] == "echo: c" and obs[1] == ""
            assert list(terminated) == [False, True, False] and not truncated.any()
            assert rewards[1] == 0.0 and info["turn"][1] == 1
            if mode == "sync":
                assert list(info["error_type"]) == ["", "harness_crashed", ""]
                assert info["exit_code"][1] == -signal.SIGKILL
            else:
                assert isinstance(envs, HarnessVectorEnv)
                assert list(info["error_type"]) == ["", "worker_lost", ""]
                assert info["exit_code"][1] == -1  # the harness's: unknown
                assert "sub-env 1" in info["error"][1]
                assert "killed by signal 9 (SIGKILL)" in info["error"][1]
        pids |= descendants() - before
    finally:
        # gymnasium's own close() would wait forever for sub-env 0's reply, read already
        said = close_within(envs, CLOSE_BOUND_S, **({"terminate": True} if mode == "async" else {}))
    assert_nothing_left(pids, roots)
    if mode == "async":
        assert len(said) == 1 and "while waiting for a pending call to `step`" in said[0]
    else:
        assert said == []


@pytest.mark.timeout(120)
def test_a_dead_workers_harness_and_workspace_go_at_once_and_a_fresh_worker_goes_on() -> None:
    before = descendants()
    envs = make("default")
    try:
        envs.reset(seed=0)
        roots = roots_of(envs)
        assert isinstance(envs, HarnessVectorEnv)
        dead_tree = subtree(envs.processes[1].pid)  # the worker, its keeper, its harness
        assert len(dead_tree) >= 3
        below = [psutil.Process(pid) for pid in dead_tree[1:]]  # (the worker is ours to reap)
        _, _, _, _, info = envs.step(ACTIONS)
        assert list(info["error_type"]) == ["", "worker_lost", ""]
        # The keeper of the dead worker ends its harness and removes its workspace; the
        # vector env is still open, so nothing of ours did that.
        _, alive = psutil.wait_procs(below, GONE_BOUND_S)
        assert not alive, alive
        assert gone_within([roots[1]], GONE_BOUND_S) == []
        assert roots[0].exists() and roots[2].exists()
        obs, _, terminated, _, info = envs.step(np.array(["b", "ignored", "d"], dtype=object))
        assert list(obs) == ["echo: b", "", "echo: d"]  # sub-env 1: the autoreset step
        assert list(info["turn"]) == [2, 0, 2] and list(info["error_type"]) == ["", "", ""]
        assert not terminated.any()
        obs, *_ = envs.step(np.array(["e", "f", "g"], dtype=object))
        assert list(obs) == ["echo: e", "echo: f", "echo: g"]
        assert envs.processes[1].pid not in dead_tree
        roots += roots_of(envs)
        pids = descendants() - before
    finally:
        close_within(envs, CLOSE_BOUND_S)
    assert_nothing_left(pids, roots)


@pytest.mark.timeout(120)
def test_a_worker_that_died_between_steps_is_found_by_a_call_then_reported() -> None:
    before = descendants()
    envs = make("default")
    try:
        envs.reset(seed=0)
        roots = roots_of(envs)
        assert isinstance(envs, HarnessVectorEnv)
        worker = envs.processes[1]
        os.kill(worker.pid, signal.SIGKILL)  # idle: no call is waiting for it
        worker.join(GONE_BOUND_S)  # (multiprocessing reaps it: psutil must not)
        assert worker.exitcode == -signal.SIGKILL
        with pytest.raises(WorkerLost, match=r"sub-env 1 \(pid \d+\) was killed by signal 9") as e:
            envs.get_attr("workspace")
        assert (e.value.index, e.value.exit_code, e.value.pid) == (1, -9, worker.pid)
        obs, _, terminated, _, info = envs.step(np.array(["a", "b", "c"], dtype=object))
        assert list(obs) == ["echo: a", "", "echo: c"] and list(terminated) == [False, True, False]
        assert list(info["error_type"]) == ["", "worker_lost", ""]
        obs, _ = envs.reset(seed=1)
        assert list(obs) == ["", "", ""]
        roots += roots_of(envs)  # (a fresh worker for sub-env 1, reset)
        obs, *_ = envs.step(np.array(["x", "y", "z"], dtype=object))
        assert list(obs) == ["echo: x", "echo: y", "echo: z"]
        pids = descendants() - before
    finally:
        close_within(envs, CLOSE_BOUND_S)
    assert_nothing_left(pids, roots)


@pytest.mark.timeout(60)
def test_an_envs_exception_is_raised_with_the_workers_traceback_and_the_worker_goes_on() -> None:
    before = descendants()
    envs = make("default", num_envs=2)
    try:
        envs.reset(seed=0)
        roots = roots_of(envs)
        workers = [p.pid for p in envs.processes]
        with pytest.raises(TypeError, match="the action must be a str") as e:
            envs.step(np.array(["a", 3], dtype=object))
        assert "raised in the vector worker of sub-env 1" in "\n".join(e.value.__notes__)
        obs, *_ = envs.step(np.array(["b", "c"], dtype=object))
        assert list(obs) == ["echo: b", "echo: c"]
        assert [p.pid for p in envs.processes] == workers
        pids = descendants() - before
    finally:
        close_within(envs, CLOSE_BOUND_S)
    assert_nothing_left(pids, roots)
