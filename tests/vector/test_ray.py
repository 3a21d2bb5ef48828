"""RayVectorEnv and the Ray rollout on a real local Ray instance (loopback only).

One Ray instance serves the whole module: it starts before the first test's
process snapshot (module fixtures run before the function-scoped leak guard),
so only what a test itself starts, actors and harnesses, must be gone at its
end. Actors take the instance's pre-started idle workers or start their own,
and an actor's worker process exits with the actor.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import psutil
import pytest
from support import LINE_AGENT
from support.process import removed, tagged_processes, wait_gone

import gym_harness  # noqa: F401  (registers the env ids)
from gym_harness.agents.demo import demo_tasks_path
from gym_harness.errors import ConfigError
from gym_harness.process import keeper as _keeper
from gym_harness.process.keeper_client import SESSION_VAR
from gym_harness.rollout.local import run_episode
from gym_harness.tasks import load_tasks

ray = pytest.importorskip("ray")
from gym_harness.rollout.ray import RayVectorEnv, ray_rollout  # noqa: E402

AGENT = str(LINE_AGENT)
HALF_CPU = {"num_cpus": 0.5}  # 4 sub-envs on the 2 CPUs the test instance has

RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}


#: One Ray cluster: every test of this module runs on the same test worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as env:
        for key, value in RAY_ENV.items():
            env.setenv(key, value)
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",  # the session's netns has only loopback
            log_to_driver=False,
        )
        ray_pids = [p.pid for p in psutil.Process().children(recursive=True)]
        try:
            yield
        finally:
            ray.shutdown()
            procs = [psutil.Process(pid) for pid in ray_pids if psutil.pid_exists(pid)]
            _, alive = psutil.wait_procs(procs, timeout=15)
            for proc in alive:  # ours, by pid: never let Ray's daemons outlive the module
                proc.kill()


def gone(pids: list[int], timeout: float = 15.0) -> bool:
    return wait_gone(pids, timeout) == []


def line_envs() -> RayVectorEnv:
    """Two sub-envs over the line agent (``echo: <message>``), half a CPU each."""
    return RayVectorEnv(
        "gym_harness/Command-v0",
        2,
        env_kwargs={"command": [sys.executable, AGENT]},
        resources_per_env=HALF_CPU,
    )


def comparable(info: dict[str, Any]) -> dict[str, list[Any]]:
    """The deterministic part of stacked infos (no timings, ids, stderr)."""
    keys = ("turn", "error_type", "tool_calls", "task_id", "exit_code")
    return {k: list(info[k]) for k in keys} | {f"_{k}": list(info[f"_{k}"]) for k in keys}


@pytest.mark.timeout(120)
def test_four_envs_through_autoreset_episodes_match_sync_vector_env(ray_instance: None) -> None:
    kwargs: dict[str, Any] = {"max_episode_steps": 2}
    envs = RayVectorEnv(
        "gym_harness/Reference-v0", 4, env_kwargs=kwargs, resources_per_env=HALF_CPU
    )
    local = gymnasium.make_vec(
        "gym_harness/Reference-v0", num_envs=4, vectorization_mode="sync", **kwargs
    )
    try:
        assert envs.single_observation_space == local.single_observation_space
        assert envs.single_action_space == local.single_action_space
        assert envs.metadata["autoreset_mode"] == local.metadata["autoreset_mode"]
        obs, info = envs.reset(seed=3)
        local_obs, local_info = local.reset(seed=3)
        assert list(obs) == list(local_obs) and all(obs)
        assert sorted(info) == sorted(local_info)
        harness_pids = [w["harness_pid"] for w in envs.worker_info()]
        assert len(set(harness_pids)) == 4 and None not in harness_pids
        ended = np.zeros(4, dtype=int)
        for _ in range(5):
            actions = np.array(list(obs), dtype=object)
            obs, rewards, terminated, truncated, info = envs.step(actions)
            want = local.step(actions)
            assert list(obs) == list(want[0])
            assert list(rewards) == list(want[1])
            assert list(terminated) == list(want[2]) and list(truncated) == list(want[3])
            assert sorted(info) == sorted(want[4])
            assert comparable(info) == comparable(want[4])
            ended += terminated | truncated
        assert (ended >= 2).all(), ended  # every sub-env went through autoresets
        harness_pids += [w["harness_pid"] for w in envs.worker_info() if w["harness_pid"]]
    finally:
        envs.close()
        local.close()
    assert gone(harness_pids)


@pytest.mark.timeout(120)
def test_killed_actor_reports_worker_lost_then_is_replaced(ray_instance: None) -> None:
    envs = line_envs()
    try:
        envs.reset(seed=0)
        obs, *_ = envs.step(np.array(["a", "b"], dtype=object))
        assert list(obs) == ["echo: a", "echo: b"]
        before = envs.worker_info()
        root = Path(before[1]["workspace"]).parent.parent  # the actor env's gym_harness-* dir
        assert root.is_dir() and Path(before[0]["workspace"]).is_dir()
        ray.kill(envs.actors[1])  # mid-episode; the kill is asynchronous: wait for it
        assert gone([before[1]["pid"], before[1]["harness_pid"]])  # the harness died with it
        assert removed(root)  # by its keeper: the actor never ran close()
        lost = envs.worker_info()  # never raises for a lost actor: says why instead
        assert lost[0] == {**before[0], "lost": ""}
        assert lost[1]["pid"] is None and "Actor" in lost[1]["lost"]
        obs, rewards, terminated, truncated, info = envs.step(np.array(["c", "d"], dtype=object))
        assert list(obs) == ["echo: c", ""] and rewards[1] == 0.0
        assert list(terminated) == [False, True] and not truncated.any()
        assert list(info["error_type"]) == ["", "worker_lost"]
        assert info["turn"][1] == 2 and "Actor" in info["error"][1]
        # Its replacement is placed in the background: sub-env 0 never waits for it, and
        # sub-env 1 reports worker_lost until the replacement is up, then its reset.
        turn, deadline = 3, time.monotonic() + 60
        while time.monotonic() < deadline:
            obs, _, terminated, _, info = envs.step(np.array([f"e{turn}", "x"], dtype=object))
            assert obs[0] == f"echo: e{turn}" and info["turn"][0] == turn
            turn += 1
            if info["error_type"][1] == "":
                break
            assert info["error_type"][1] == "worker_lost" and "not up yet" in info["error"][1]
        assert obs[1] == "" and info["turn"][1] == 0 and not terminated.any()  # autoreset
        obs, *_ = envs.step(np.array(["f", "g"], dtype=object))
        assert list(obs) == ["echo: f", "echo: g"]
        after = envs.worker_info()
        assert after[0]["pid"] == before[0]["pid"] and after[1]["pid"] != before[1]["pid"]
    finally:
        envs.close()


@pytest.mark.timeout(120)
def test_an_actors_env_exception_is_its_env_error_result(ray_instance: None) -> None:
    envs = line_envs()
    try:
        envs.reset(seed=0)
        obs, _, terminated, _, info = envs.step(np.array(["a", 3], dtype=object))
        assert list(obs) == ["echo: a", ""] and list(terminated) == [False, True]
        assert list(info["error_type"]) == ["", "env_error"]
        assert "the action must be a str" in info["error"][1]
        obs, _, terminated, _, info = envs.step(np.array(["b", "x"], dtype=object))
        assert list(obs) == ["echo: b", ""] and list(info["turn"]) == [2, 0]  # its reset
        obs, *_ = envs.step(np.array(["c", "d"], dtype=object))
        assert list(obs) == ["echo: c", "echo: d"]
    finally:
        envs.close()


SIGTERM_AFTER_ROLLOUT = """
import io, json, os, signal, sys
from gym_harness.agents.demo import demo_tasks_path
from gym_harness.rollout.ray import ray_rollout
from gym_harness.tasks import load_tasks

caught = []
signal.signal(signal.SIGTERM, lambda number, frame: caught.append(number))
tasks = [t for t in load_tasks(demo_tasks_path()) if t.id == "add"]
out = io.StringIO()
written = ray_rollout("gym_harness/Reference-v0", {}, tasks, n=1, max_turns=1, out=out,
                      num_workers=1, resources_per_env={"num_cpus": 0.5})
os.kill(os.getpid(), signal.SIGTERM)  # handled by the handler above, not Ray's sys.exit
print(json.dumps({"written": written, "caught": caught}))
"""


@pytest.mark.timeout(300)
def test_a_sigterm_handler_installed_before_ray_rollout_still_runs_after_it(
    tmp_path: Path,
) -> None:
    env = {**os.environ, **RAY_ENV, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("RAY_ADDRESS", None)  # a private local instance, started and shut down by it
    done = subprocess.run(
        [sys.executable, "-c", SIGTERM_AFTER_ROLLOUT],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"written": 1, "caught": [int(signal.SIGTERM)]}


@pytest.mark.timeout(120)
def test_close_ends_every_actor_and_harness(ray_instance: None) -> None:
    envs = line_envs()
    envs.reset(seed=0)
    workers = envs.worker_info()
    actors = list(envs.actors)
    envs.close()
    envs.close()  # idempotent
    assert gone([w["pid"] for w in workers] + [w["harness_pid"] for w in workers])
    for actor in actors:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.describe.remote(), timeout=30)


def test_an_env_that_cannot_be_made_is_a_config_error(ray_instance: None) -> None:
    with pytest.raises(ConfigError, match="bogus"):
        RayVectorEnv(
            "gym_harness/Command-v0", 1, env_kwargs={"bogus": 1}, resources_per_env=HALF_CPU
        )


def _deterministic(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "keys": sorted(record),
        "task": record["task"],
        "seed": record["seed"],
        "messages": record["messages"],
        "outcome": record["outcome"],
        "error_type": record["error_type"],
        "reward": record["reward"],
        "turns": [
            (
                t["message"],
                t["response"],
                t["reward"],
                t["terminated"],
                t["truncated"],
                [(e["type"], e.get("data")) for e in t["events"] if e["type"] == "tool_call"],
            )
            for t in record["turns"]
        ],
    }


@pytest.mark.timeout(120)
def test_ray_rollout_writes_the_local_rollouts_records(ray_instance: None) -> None:
    tasks = [t for t in load_tasks(demo_tasks_path()) if t.id in ("add", "finish")]
    big = tasks[0].to_dict() | {"id": "big", "files": {"data/big.txt": "x" * (2 << 20)}}
    tasks.append(type(tasks[0]).from_dict(big))  # a 2 MB workspace file, put once
    env = gymnasium.make("gym_harness/Reference-v0")
    local = {}
    try:
        j = 0
        for task in tasks:
            for k in range(2):
                record = run_episode(
                    env,
                    task.to_dict(),
                    env_id="gym_harness/Reference-v0",
                    seed=10 + j,
                    index=k,
                    max_turns=2,
                    follow_up="Continue.",
                )
                local[(record["task_id"], k)] = _deterministic(record)
                j += 1
    finally:
        env.close()
    out, seen = io.StringIO(), []
    written = ray_rollout(
        "gym_harness/Reference-v0",
        {},
        tasks,
        n=2,
        seed=10,
        max_turns=2,
        follow_up="Continue.",
        out=out,
        progress=lambda done, outcome: seen.append((done, outcome)),
        num_workers=3,
        resources_per_env=HALF_CPU,
    )
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert written == len(records) == 2 * len(tasks)
    assert [done for done, _ in seen] == list(range(1, written + 1))
    remote = {(r["task_id"], r["episode_index"]): _deterministic(r) for r in records}
    assert remote == local
    assert {r["outcome"] for r in records} >= {"done", "max_turns"}
    assert all(r["task"] == t.to_dict() for r in records for t in tasks if t.id == r["task_id"])
    assert any(turn[-1] for r in remote.values() for turn in r["turns"])  # real tool calls


@pytest.mark.timeout(120)
def test_ray_rollout_records_an_episode_whose_actor_died(ray_instance: None) -> None:
    env_id = "gym_harness/Reference-v0"
    tasks = [t for t in load_tasks(demo_tasks_path()) if t.id == "add"]
    out = io.StringIO()
    keepers, actors = set(keeper_pids()), actor_pids()
    written = ray_rollout(
        env_id,
        {"reward_fn": "sys:exit"},  # the first turn's reward ends the actor's process
        tasks,
        n=2,
        seed=0,
        max_turns=2,
        follow_up="Continue.",
        out=out,
        num_workers=1,
        resources_per_env=HALF_CPU,
    )
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert written == len(records) == 2
    assert [(r["episode_index"], r["seed"]) for r in records] == [(0, 0), (1, 1)]
    for record in records:  # each on a fresh actor, each lost, each with the usual keys
        assert record["outcome"] == record["error_type"] == "worker_lost"
        assert "Actor" in record["error"] and record["turns"] == []
        assert record["task"] == tasks[0].to_dict() and record["env_id"] == env_id
    # A dead actor's keeper ends its harness, then itself, once the actor's process is gone.
    assert gone([pid for pid in keeper_pids() if pid not in keepers], timeout=60)
    # The dead actors' worker processes exit too, in their own time on a loaded machine.
    assert gone([pid for pid in actor_pids() if pid not in actors], timeout=60)


def actor_pids() -> set[int]:
    """The Ray worker processes (descendants of this process) that host an env actor."""
    pids = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if "EnvActor" in " ".join(proc.cmdline()):  # EnvActor, _EpisodeEnvActor
                pids.add(proc.pid)
        except psutil.Error:
            continue
    return pids


def keeper_pids() -> list[int]:
    """Keepers of this test session (not another session's or test worker's): this
    checkout's keeper, carrying this session's tag (the actors inherit it from Ray)."""
    ours = os.path.abspath(_keeper.__file__)  # as the keeper client starts it
    pids = []
    for proc in tagged_processes(os.environ[SESSION_VAR]):
        try:
            if ours in proc.cmdline():
                pids.append(proc.pid)
        except psutil.Error:
            continue
    return pids
