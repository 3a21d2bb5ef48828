"""As-ready stepping: ``HarnessVectorEnv.send(actions, env_ids)`` / ``recv(min_envs)``.

The harness is a small line-protocol script written to ``tmp_path``: its message
``wait NAME`` answers only once the test creates the file ``NAME`` beside it, so which
sub-envs are ready is decided by the test, never by timing. Sub-envs run in real worker
processes (``gymnasium.make_vec``'s default mode), harnesses under real keepers.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import psutil
import pytest
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from support.process import wait_gone

import gym_harness  # noqa: F401  (registers the env ids)
from gym_harness.vector import HarnessVectorEnv

WAIT_BOUND_S = 60  # the harness gives up waiting for its file after this
GONE_BOUND_S = 10.0

HARNESS = """
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\\n"); sys.stdout.flush()
emit({"type": "ready"})
for line in sys.stdin:
    content = json.loads(line)["content"]
    if content.startswith("wait "):
        path = os.path.join(here, content[5:])
        deadline = time.monotonic() + BOUND
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
    if content == "crash":
        sys.exit(3)
    emit({"type": "turn_complete", "response": "echo: " + content, "done": content == "/done"})
""".replace("BOUND", str(WAIT_BOUND_S))


@pytest.fixture
def harness(tmp_path: Path) -> list[str]:
    script = tmp_path / "harness.py"
    script.write_text(textwrap.dedent(HARNESS), encoding="utf-8")
    return [sys.executable, str(script)]


def make(command: list[str], num_envs: int = 3) -> HarnessVectorEnv:
    envs = gymnasium.make_vec("gym_harness/Command-v0", num_envs=num_envs, command=command)
    assert isinstance(envs, HarnessVectorEnv)  # the default mode: our vector entry point
    return envs


def release(command: list[str], name: str) -> None:
    (Path(command[1]).parent / name).touch()


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def assert_gone(pids: set[int]) -> None:
    assert wait_gone(list(pids), GONE_BOUND_S) == []


def by_id(batch: tuple[Any, ...]) -> dict[int, tuple[Any, ...]]:
    obs, rewards, terminated, truncated, infos = batch
    assert list(infos["_env_id"]) == [True] * len(obs)
    return {
        int(i): (obs[j], rewards[j], terminated[j], truncated[j], infos["error_type"][j])
        for j, i in enumerate(infos["env_id"])
    }


@pytest.mark.timeout(120)
def test_recv_returns_the_envs_that_are_ready_with_their_ids(harness: list[str]) -> None:
    envs = make(harness)
    try:
        envs.reset(seed=0)
        envs.send(["wait zero", "a", "b"])
        got = by_id(envs.recv(min_envs=2))
        assert got == {1: ("echo: a", 0.0, False, False, ""), 2: ("echo: b", 0.0, False, False, "")}
        with pytest.raises(AlreadyPendingCallError):
            envs.send(["again"], env_ids=[0])  # its result is not received yet
        with pytest.raises(AlreadyPendingCallError):
            envs.step(np.array(["x", "y", "z"], dtype=object))
        with pytest.raises(ValueError, match="twice"):
            envs.send(["c", "d"], env_ids=[1, 1])
        with pytest.raises(ValueError, match="out of range"):
            envs.send(["c"], env_ids=[3])
        with pytest.raises(ValueError, match="actions for"):
            envs.send(["c", "d"], env_ids=[1])
        envs.send(["c"], env_ids=np.array([1]))
        release(harness, "zero")
        got = by_id(envs.recv(min_envs=2))
        assert got == {
            0: ("echo: wait zero", 0.0, False, False, ""),
            1: ("echo: c", 0.0, False, False, ""),
        }
        with pytest.raises(NoAsyncCallError):
            envs.recv()
        obs, *_ = envs.step(np.array(["x", "y", "z"], dtype=object))  # idle again: step works
        assert list(obs) == ["echo: x", "echo: y", "echo: z"]
        envs.send(["p", "q"], env_ids=[2, 0])
        obs, rewards, terminated, truncated, infos = envs.recv(min_envs=5)  # capped at two
        assert list(infos["env_id"]) == [0, 2] and list(obs) == ["echo: q", "echo: p"]
        assert rewards.dtype == np.float64 and terminated.dtype == truncated.dtype == np.bool_
        assert list(infos["turn"]) == [3, 3]
    finally:
        envs.close()


@pytest.mark.timeout(120)
def test_autoreset_is_gymnasiums_next_step_reset_per_env(harness: list[str]) -> None:
    """The same sequence through ``step`` and through ``send``/``recv`` gives the same
    results for the sub-env that ends its episode."""
    plan = ["a", "/done", "ignored", "b"]
    seen: dict[str, list[tuple[Any, ...]]] = {"step": [], "recv": []}
    for how in seen:
        envs = make(harness, num_envs=2)
        try:
            first, _ = envs.reset(seed=0)
            for action in plan:
                if how == "step":
                    obs, rewards, term, trunc, infos = envs.step(
                        np.array([action, "other"], dtype=object)
                    )
                    j = 0
                else:
                    envs.send([action], env_ids=[0])
                    obs, rewards, term, trunc, infos = envs.recv()
                    assert list(infos["env_id"]) == [0]
                    j = 0
                seen[how].append(
                    (obs[j], rewards[j], bool(term[j]), bool(trunc[j]), int(infos["turn"][j]))
                )
        finally:
            envs.close()
    assert seen["step"] == seen["recv"]
    assert seen["recv"] == [
        ("echo: a", 0.0, False, False, 1),
        ("echo: /done", 0.0, True, False, 2),
        (first[0], 0.0, False, False, 0),  # the reset: its observation, the action ignored
        ("echo: b", 0.0, False, False, 1),
    ]


@pytest.mark.timeout(120)
def test_a_crashed_harness_and_a_killed_worker_are_their_envs_results(
    harness: list[str],
) -> None:
    before = descendants()
    envs = make(harness)
    try:
        envs.reset(seed=0)
        envs.send(["crash", "wait one", "c"])
        got = by_id(envs.recv(min_envs=2))
        assert set(got) == {0, 2}
        assert got[0][2] is np.True_ and got[0][4] == "harness_crashed"
        assert got[2] == ("echo: c", 0.0, False, False, "")
        os.kill(envs.processes[1].pid, signal.SIGKILL)  # sub-env 1's worker, mid-step
        got = by_id(envs.recv())
        assert list(got) == [1] and got[1][2] and got[1][4] == "worker_lost"
        old_worker = envs.processes[1].pid
        envs.send(["ignored", "ignored", "d"])  # 0 and 1 reset; 2 steps
        got = by_id(envs.recv(min_envs=3))
        assert got[0][:4] == got[1][:4] == ("", 0.0, False, False)
        assert got[2] == ("echo: d", 0.0, False, False, "")
        assert envs.processes[1].pid != old_worker  # a fresh worker
        envs.send(["e", "f", "g"])
        obs, *_ = envs.recv(min_envs=3)
        assert list(obs) == ["echo: e", "echo: f", "echo: g"]
        pids = descendants() - before
    finally:
        envs.close()
    assert_gone(pids)


@pytest.mark.timeout(120)
def test_an_env_exception_is_raised_by_recv_and_the_other_results_wait(harness: list[str]) -> None:
    envs = make(harness)
    try:
        envs.reset(seed=0)
        envs.send([123, "b", "c"])  # a non-str action: HarnessEnv.step raises
        with pytest.raises(TypeError):
            envs.recv(min_envs=3)
        obs, _, _, _, infos = envs.recv(min_envs=2)
        assert list(infos["env_id"]) == [1, 2] and list(obs) == ["echo: b", "echo: c"]
        envs.send(["a"], env_ids=[0])  # the env kept its state: no reset
        obs, _, _, _, infos = envs.recv()
        assert list(obs) == ["echo: a"] and list(infos["turn"]) == [1]
    finally:
        envs.close()


@pytest.mark.timeout(120)
def test_recv_timeout_loses_nothing(harness: list[str]) -> None:
    envs = make(harness, num_envs=2)
    try:
        envs.reset(seed=0)
        envs.send(["wait late", "wait late"])
        with pytest.raises(multiprocessing.TimeoutError):
            envs.recv(timeout=0.2)
        release(harness, "late")
        obs, _, _, _, infos = envs.recv(min_envs=2)
        assert list(infos["env_id"]) == [0, 1] and list(obs) == ["echo: wait late"] * 2
    finally:
        envs.close()


@pytest.mark.timeout(120)
def test_close_while_envs_are_busy_ends_them_and_leaves_nothing(harness: list[str]) -> None:
    before = descendants()
    envs = make(harness)
    envs.close_timeout_s = 1.0  # their steps never end: close must not wait for them
    envs.reset(seed=0)
    envs.send(["wait never", "wait never", "c"])
    obs, *_ = envs.recv()
    assert list(obs) == ["echo: c"]
    envs.send(["d"], env_ids=[2])  # a result nobody receives
    pids = descendants() - before
    assert len(pids) >= 9  # a worker, a keeper and a harness per sub-env
    envs.close()
    envs.close()  # idempotent
    assert_gone(pids)


@pytest.mark.timeout(180)
def test_model_mode_sends_answers_and_receives_the_next_calls() -> None:
    tool = json.dumps(
        {"content": "", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}
    )
    envs = gymnasium.make_vec("gym_harness/Reference-v0", num_envs=2, mode="model")
    assert isinstance(envs, HarnessVectorEnv)
    try:
        obs, _ = envs.reset(seed=0)
        assert all(json.loads(o)["messages"][-1]["role"] == "user" for o in obs)
        envs.send([tool, tool])
        obs, _, terminated, _, infos = envs.recv(min_envs=2)
        assert list(infos["env_id"]) == [0, 1] and not terminated.any()
        for o in obs:
            last = json.loads(o)["messages"][-1]
            assert last["role"] == "tool" and last["content"] == "5"
        envs.send(["done"], env_ids=[1])
        obs, _, _, _, infos = envs.recv()
        assert list(infos["env_id"]) == [1] and list(infos["error_type"]) == [""]
    finally:
        envs.close()


def open_fds(pid: int | None = None) -> set[str]:
    """The targets of a process's open fds (pipes and sockets by inode)."""
    where = f"/proc/{pid or os.getpid()}/fd"
    found = set()
    for name in os.listdir(where):
        try:
            found.add(f"{name}:{os.readlink(f'{where}/{name}')}")
        except OSError:
            continue  # closed meanwhile (the listing's own fd)
    return found


@pytest.mark.timeout(120)
def test_workers_inherit_no_siblings_pipes_and_close_releases_the_parents(
    harness: list[str],
) -> None:
    """A worker forked after others holds none of their pipes (no O(N²) fds, and a
    worker sees EOF when the parent dies); close() leaves the parent no fd of its own."""
    before = open_fds()
    envs = make(harness, num_envs=4)
    try:
        envs.reset(seed=0)
        counts = [len(open_fds(p.pid)) for p in envs.processes]
        assert counts[-1] == counts[0], counts
        parent_ends = {f"pipe:[{os.fstat(p.fileno()).st_ino}]" for p in envs.parent_pipes}
        for process in envs.processes:
            held = {fd.split(":", 1)[1] for fd in open_fds(process.pid)}
            assert not held & parent_ends
    finally:
        envs.close()
    assert open_fds() - before == set()
