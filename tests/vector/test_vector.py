"""Vector envs over real harness processes: async and sync, autoreset,
isolation of a crashing sub-env, and no process left after close."""

from __future__ import annotations

import sys

import gymnasium
import numpy as np
import psutil
import pytest
from support import LINE_AGENT

import gym_harness  # noqa: F401  (registers the env ids)

AGENT = str(LINE_AGENT)
COMMAND = [sys.executable, AGENT]


def harness_pids(envs: gymnasium.vector.VectorEnv) -> list[int]:
    """Pids of the harness processes below this test process."""
    return [
        p.pid for p in psutil.Process().children(recursive=True) if AGENT in " ".join(p.cmdline())
    ]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["entry_point", "async", "sync"])
def test_vector_episodes_with_autoreset(mode: str) -> None:
    kwargs: dict[str, object] = {"command": COMMAND, "max_episode_steps": 3}
    if mode == "entry_point":
        envs = gymnasium.make_vec("gym_harness/Command-v0", num_envs=4, **kwargs)
    elif mode == "async":
        envs = gymnasium.make_vec(
            "gym_harness/Command-v0",
            num_envs=4,
            vectorization_mode="async",
            vector_kwargs={"shared_memory": False},
            **kwargs,
        )
    else:
        envs = gymnasium.make_vec(
            "gym_harness/Command-v0", num_envs=4, vectorization_mode="sync", **kwargs
        )
    try:
        obs, info = envs.reset(seed=0)
        assert list(obs) == [""] * 4
        truncations = 0
        for turn in range(7):
            actions = np.array([f"m{turn}-{i} ✓" for i in range(4)], dtype=object)
            obs, _rewards, terminated, truncated, info = envs.step(actions)
            if turn % 4 == 3:  # the autoreset step after each 3-turn episode
                assert list(obs) == [""] * 4
                continue
            assert list(obs) == [f"echo: m{turn}-{i} ✓" for i in range(4)]
            assert not terminated.any()
            assert list(info["error_type"]) == [""] * 4
            truncations += int(truncated.sum())
        assert truncations == 8  # two 3-turn episodes ended by the TimeLimit in each sub-env
        assert len(harness_pids(envs)) == 4
    finally:
        envs.close()


@pytest.mark.timeout(120)
def test_one_crashing_sub_env_leaves_the_others_alone() -> None:
    envs = gymnasium.make_vec("gym_harness/Command-v0", num_envs=3, command=COMMAND)
    try:
        envs.reset(seed=0)
        obs, _, terminated, _truncated, info = envs.step(
            np.array(["a", "crash", "c"], dtype=object)
        )
        assert list(terminated) == [False, True, False]
        assert list(info["error_type"]) == ["", "harness_crashed", ""]
        assert obs[0] == "echo: a" and obs[2] == "echo: c"
        obs, _, terminated, _, _ = envs.step(np.array(["b", "ignored", "d"], dtype=object))
        assert obs[0] == "echo: b" and obs[1] == "" and obs[2] == "echo: d"  # sub-env 1 reset
        obs, _, terminated, _, _ = envs.step(np.array(["e", "f", "g"], dtype=object))
        assert list(obs) == ["echo: e", "echo: f", "echo: g"]
    finally:
        envs.close()


@pytest.mark.timeout(120)
def test_close_terminate_leaves_no_process() -> None:
    envs = gymnasium.make_vec("gym_harness/Command-v0", num_envs=2, command=COMMAND)
    envs.reset(seed=0)
    pids = harness_pids(envs)
    assert len(pids) == 2
    envs.close(terminate=True)  # workers get SIGTERM and never run env.close()
    _gone, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], 5)
    assert not alive, alive


@pytest.mark.timeout(120)
@pytest.mark.parametrize("terminate", [False, True])
def test_async_mode_works_as_is(terminate: bool) -> None:
    """gymnasium's own AsyncVectorEnv, shared memory on (its default): texts arrive whole."""
    envs = gymnasium.make_vec("gym_harness/Reference-v0", num_envs=2, vectorization_mode="async")
    try:
        assert envs.shared_memory
        prompts, _ = envs.reset(seed=0)
        replies, rewards, _, _, info = envs.step(prompts)
        assert all(
            prompt and reply.startswith(f"You said: {prompt.splitlines()[0]}")
            for prompt, reply in zip(prompts, replies, strict=True)
        )
        assert list(info["error_type"]) == ["", ""] and list(rewards) == [1.0, 1.0]
        workers = [psutil.Process(p.pid) for p in envs.processes]
    finally:
        envs.close(terminate=terminate)
    _gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, alive
