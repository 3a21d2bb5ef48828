"""``Trajectory.training_trace()``: the plain-dict trace, with no trainer library installed.

Model mode: a real harness process (the Command agent of the model-mode tests) calls
the env's endpoint; the test's actions carry token ids, logprobs and prompt ids, and the
trace must hold exactly those, one entry per main call, masked over the completion only.
An action without them, or with ids that do not line up, is text-level and says why; a
side call (answered by the env, no ids) is left out and never makes the trace
text-level. ``import gym_harness`` loads no trainer library (a fresh interpreter checks).
The capture-mode trace is tested in ``test_capture_tokens.py``; the validated OpenEnv
object in ``test_openenv.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.envs import model_env

from gym_harness import RewardContext
from gym_harness.records.training import record_trace, training_trace

#: The worktree: the subprocesses import the package from here.
WORKTREE = Path(__file__).resolve().parents[2]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def reward(ctx: RewardContext) -> float:
    return 1.0 if "5" in ctx.response else 0.25


def action(content: str = "", tool: bool = False, **traces: Any) -> str:
    calls = [{"name": "add", "arguments": {"a": 2, "b": 3}}] if tool else []
    return json.dumps({"content": content, "tool_calls": calls, **traces})


def episode(first: dict[str, Any], second: dict[str, Any], prompt: str = "what is 2+3?") -> Any:
    """Tool call, then the answer; returns the trajectory and the two observations."""
    env = model_env("command", [add], prompt=prompt, reward_fn=reward)
    try:
        obs, info = env.reset(seed=0)
        assert info["error_type"] == "", info
        seen = [json.loads(obs)]
        obs, _, terminated, _, info = env.step(action(tool=True, **first))
        assert (terminated, info["error_type"]) == (False, ""), info
        seen.append(json.loads(obs))
        _, rew, terminated, _, info = env.step(action("The sum is 5.", **second))
        assert (terminated, info["error_type"], rew) == (True, "", 1.0), info
        return (
            env.trajectory,
            seen,
            env.trajectory.to_record(env_id="x", index=0, seed=0, total_s=1),
        )
    finally:
        env.close()


FIRST = {"prompt_token_ids": [1, 2, 3], "token_ids": [7, 8], "logprobs": [-0.25, -1.5]}
SECOND = {
    "prompt_token_ids": [1, 2, 3, 7, 8, 4],
    "token_ids": [9, 10, 11],
    "logprobs": [{"token": "a", "logprob": -0.5}, -0.125, 0.0],  # an entry may be an object
}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_model_mode_trace_holds_the_actions_ids_masked_over_the_completion() -> None:
    trajectory, seen, record = episode(FIRST, SECOND, prompt="side: what is 2+3?")
    trace = trajectory.training_trace()
    assert trace["schema_version"] == 1 and trace["token_level"] is True
    first, second = trace["turns"]
    assert first["node_id"] == f"call-{seen[0]['request_id']}"
    assert (first["prompt_token_ids"], first["completion_token_ids"]) == ([1, 2, 3], [7, 8])
    assert first["per_token_logps"] == [-0.25, -1.5]
    assert first["loss_mask"] == [0, 0, 0, 1, 1]
    assert second["per_token_logps"] == [-0.5, -0.125, 0.0]
    assert second["loss_mask"] == [0] * 6 + [1] * 3
    assert second["request"]["messages"] == seen[1]["messages"]
    assert second["response"]["content"] == "The sum is 5."
    assert first["metadata"] == {
        "source": "model",
        "episode_id": trajectory.episode_id,
        "side": False,
    }
    # The side call got the env's fixed answer (no ids): left out, and not text-level.
    (side,) = trace["text_level_calls"]
    assert side["side"] is True and "no prompt token ids" in side["why"]
    # The same trace from the rollout record, as read back from disk.
    assert record_trace(json.loads(json.dumps(record))) == trace


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("second", "why"),
    [
        ({}, "carries no prompt token ids"),
        ({"prompt_token_ids": [1], "token_ids": [5]}, "token ids but no logprobs"),
        ({"prompt_token_ids": [1], "logprobs": [-1.0]}, "no completion token ids"),
        ({**SECOND, "logprobs": [-1.0]}, "1 logprobs for 3 token ids"),
        ({**SECOND, "logprobs": [-1.0, 0.5, -1.0]}, "not finite numbers <= 0"),
        ({**SECOND, "token_ids": [9, -1, 11]}, "not non-negative integers"),
    ],
)
def test_a_call_without_usable_ids_is_text_level_and_says_why(
    second: dict[str, Any], why: str
) -> None:
    trajectory, seen, _ = episode(FIRST, second)
    trace = trajectory.training_trace()
    assert trace["token_level"] is False
    assert [t["completion_token_ids"] for t in trace["turns"]] == [[7, 8]]  # nothing made up
    (call,) = trace["text_level_calls"]
    assert call["node_id"] == f"call-{seen[1]['request_id']}" and not call["side"]
    assert why in call["why"], call


def test_an_episode_without_model_calls_is_not_token_level() -> None:
    assert training_trace([], []) == {
        "schema_version": 1,
        "turns": [],
        "token_level": False,
        "text_level_calls": [],
    }


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_import_gym_harness_loads_no_trainer_library() -> None:
    code = (
        "import sys, gym_harness, gym_harness.records.training\n"
        "env = gym_harness.HarnessEnv('reference')\n"
        "env.trajectory.training_trace()\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('openenv', 'gradio', 'trl')"
        " or m.startswith('gym_harness.openenv')]\n"
        "print(loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(WORKTREE)},
        capture_output=True,
        text=True,
        timeout=200,
        check=True,
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


#: Hides any installed openenv (a finder that looks in the working directory only), then
#: imports the bridge to it.
WITHOUT_OPENENV = """
import importlib.machinery, os, sys

class NoInstalledOpenEnv:
    def find_spec(self, name, path=None, target=None):
        if name == "openenv" or name.startswith("openenv."):
            return importlib.machinery.PathFinder.find_spec(name, [os.getcwd()])
        return None

sys.meta_path.insert(0, NoInstalledOpenEnv())
import gym_harness
try:
    import gym_harness.openenv
except ImportError as exc:
    print(exc)
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_without_the_extra_the_bridge_says_how_to_install_it(tmp_path: Path) -> None:
    (tmp_path / "openenv").mkdir()  # a stray folder of the same name is no install either
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_OPENENV],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(WORKTREE)},
        capture_output=True,
        text=True,
        timeout=200,
        check=True,
    )
    assert done.stdout.startswith("gym_harness.openenv needs openenv 0.10.0: pip install "), (
        done.stdout + done.stderr
    )
    assert "--no-deps 'openenv==0.10.0'" in done.stdout
