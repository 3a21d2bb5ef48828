"""``mode="model"`` with the real CLIs: the test is the model, and no model server exists.

Each CLI runs through ``HarnessEnv(<name>, mode="model")`` in the loopback-only
namespace. The env serves the CLI's model calls itself; the test reads each call as
an observation and answers it as the policy would. Per CLI:

* one episode: the first observation holds the prompt and the env tool; a tool call
  runs the tool over the bridge and comes back as a ``tool`` message; a text answer
  ends the turn and the episode with ``reward_fn``'s reward; side calls (titles) never
  become steps; each main call is one step, with no retry;
* the same episode with a policy that takes 20 s to answer its first call: still no
  retry and no duplicate step;
* malformed actions (a tool the request did not offer; arguments that are no object)
  end the episode as ``invalid_action``;
* SIGKILL of the CLI while the policy holds a call gives ``harness_crashed``;
* Gemini CLI, whose policy answers after ``policy_timeout_s``: ``policy_timeout``, and the
  late answer is never delivered (the CLI would retry, then end its turn as if done).
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest
from support.cli import CLIS, Calls, real_cli

from gym_harness import HarnessEnv
from gym_harness.outcome import Outcome
from gym_harness.process import sandbox
from gym_harness.records.trajectory import RewardContext

PROMPT = "please add 20 and 22 with the add tool"
#: How long the slow policy thinks before it answers.
SLOW_S = 20


def reward(ctx: RewardContext) -> float:
    """0.75 when the reply gives the sum, else 0.25 (either tells the reward came from here)."""
    return 0.75 if "42" in ctx.response else 0.25


def env_tool(observation: dict[str, Any]) -> str | None:
    """The env tool ``add`` under the name the CLI offers it, if offered."""
    names = [t["function"]["name"] for t in observation["tools"]]
    return next((n for n in names if n.endswith("add") and "env" in n), None)


def call_tool(name: str, arguments: Any) -> str:
    return json.dumps({"content": "", "tool_calls": [{"name": name, "arguments": arguments}]})


def episode(env: HarnessEnv, calls: Calls, think_s: float = 0.0) -> None:
    """Prompt -> tool call -> tool result -> text answer -> end.

    The policy thinks ``think_s`` before its first answer: the CLI's first call (a stream
    opened at once and kept alive by the env) waits that long.
    """
    obs, info = env.reset(seed=0)
    assert info["error_type"] == "", info
    first = json.loads(obs)
    tool = env_tool(first)
    assert tool is not None, [t["function"]["name"] for t in first["tools"]]
    users = [m for m in first["messages"] if m["role"] == "user"]
    assert any(PROMPT in json.dumps(m["content"]) for m in users), first["messages"]
    observed = [first["request_id"]]

    time.sleep(think_s)
    obs, rew, terminated, truncated, info = env.step(call_tool(tool, {"a": 20, "b": 22}))
    assert (terminated, truncated, info["error_type"], rew) == (False, False, "", 0.0), info
    with calls.lock:
        assert calls.seen == [(20, 22)]  # the tool really ran, over the bridge
    second = json.loads(obs)
    assert second["request_id"] not in observed  # a new call, not the first one again
    observed.append(second["request_id"])
    results = [m for m in second["messages"] if m["role"] == "tool"]
    assert len(results) == 1 and "42" in json.dumps(results[0]["content"]), second["messages"]
    (asked,) = [
        c for m in second["messages"] if m["role"] == "assistant" for c in m.get("tool_calls", [])
    ]
    assert asked["id"] == results[0]["tool_call_id"] and asked["function"]["name"] == tool
    # The CLI kept its history: the first call's messages, our answer, then what is new.
    assert (first["extends"], second["extends"]) == (False, True), second["messages"]
    assert second["messages"][: len(first["messages"])] == first["messages"]
    assert results[0] in second["messages"][second["new_from"] :]

    obs, rew, terminated, truncated, info = env.step("The sum is 42.")
    assert (terminated, truncated, info["error_type"]) == (True, False, ""), info
    assert rew == 0.75  # reward_fn's, on the reply that ended the turn
    with calls.lock:
        assert calls.seen == [(20, 22)]
    final = json.loads(obs)["messages"]
    assert final[-1]["role"] == "assistant" and "42" in final[-1]["content"]

    # Every main call was a step, once: none retried, none served twice, none unseen.
    # Side calls (titles, summaries) were answered by the env and only recorded.
    main = [c for c in env.trajectory.calls if not c.side]
    assert [c.request_id for c in main] == observed, env.trajectory.calls
    assert [c.retries for c in env.trajectory.calls] == [0] * len(env.trajectory.calls)
    assert all(c.status == 200 and c.completion is not None for c in env.trajectory.calls)


@real_cli(timeout=240)
@pytest.mark.parametrize("tier", ["auto", "strict"])
@pytest.mark.parametrize("cli", list(CLIS))
def test_tool_call_then_text_ends_the_episode_with_the_reward(
    cli: str, tier: str, make_env: Any
) -> None:
    """Confined as by default, and in the env's own network namespace (``"strict"``)."""
    if tier == "strict" and sandbox.report("strict")["missing"]:
        pytest.skip(f"strict is not available here: {sandbox.report('strict')['missing']}")
    calls = Calls()
    env = make_env(calls, PROMPT, reward_fn=reward, sandbox=tier)
    try:
        episode(env, calls)
    finally:
        env.close()


@real_cli(timeout=300)
@pytest.mark.parametrize("cli", list(CLIS))
def test_a_policy_that_takes_20_s_causes_no_retry_and_no_duplicate_step(
    cli: str, make_env: Any
) -> None:
    calls = Calls()
    env = make_env(calls, PROMPT, reward_fn=reward)
    try:
        episode(env, calls, think_s=SLOW_S)
    finally:
        env.close()


@real_cli(timeout=240)
@pytest.mark.parametrize("cli", list(CLIS))
def test_a_malformed_action_is_invalid_action(cli: str, make_env: Any) -> None:
    calls = Calls()
    env = make_env(calls, PROMPT, reward_fn=reward)
    try:
        for action in (
            call_tool("no_such_tool", {}),  # a tool the request did not offer
            None,  # the env tool, with arguments that are no object
        ):
            obs, info = env.reset()
            assert info["error_type"] == "", info
            if action is None:
                tool = env_tool(json.loads(obs))
                assert tool is not None
                action = call_tool(tool, [20, 22])
            _, rew, terminated, truncated, info = env.step(action)
            assert (terminated, truncated, rew) == (True, False, 0.0), info
            assert info["error_type"] == Outcome.INVALID_ACTION, info
            with calls.lock:
                assert calls.seen == []
    finally:
        env.close()


@real_cli(timeout=240)
@pytest.mark.parametrize("cli", list(CLIS))
def test_sigkill_while_the_policy_holds_a_call_is_harness_crashed(cli: str, make_env: Any) -> None:
    calls = Calls()
    env = make_env(calls, PROMPT, reward_fn=reward)
    try:
        obs, info = env.reset()
        assert info["error_type"] == "", info
        tool = env_tool(json.loads(obs))
        assert tool is not None
        process = HarnessEnv.of(env).process
        assert process is not None and process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        _, _, terminated, truncated, info = env.step(call_tool(tool, {"a": 20, "b": 22}))
        assert info["error_type"] == Outcome.HARNESS_CRASHED, info
        assert (terminated, truncated) == (True, False), info
        with calls.lock:
            assert calls.seen == []
    finally:
        env.close()


@real_cli(timeout=180)
@pytest.mark.parametrize("cli", ["gemini_cli"])
def test_an_answer_after_policy_timeout_is_policy_timeout(cli: str, make_env: Any) -> None:
    calls = Calls()
    env = make_env(calls, PROMPT, reward_fn=reward, policy_timeout_s=2.0)
    try:
        obs, info = env.reset()
        assert info["error_type"] == "", info
        first = json.loads(obs)
        tool = env_tool(first)
        assert tool is not None
        endpoint = env._mode.endpoint  # it says when the CLI got its 504
        assert endpoint is not None
        deadline = time.monotonic() + 60
        while endpoint.lapses()[0] < 1:
            assert time.monotonic() < deadline, "the call never timed out"
            time.sleep(0.05)
        obs, rew, terminated, truncated, info = env.step(call_tool(tool, {"a": 20, "b": 22}))
        assert (terminated, truncated) == (False, True), info
        assert info["error_type"] == Outcome.POLICY_TIMEOUT, info
        assert first["request_id"] in info["error"] and "not delivered" in info["error"]
        assert rew == 0.25  # reward_fn scored the truncated turn, without the sum
        with calls.lock:
            assert calls.seen == []  # the late tool call never reached the CLI
        final = json.loads(obs)  # the conversation up to the last answer: none reached it
        assert (final["request_id"], final["messages"]) == ("", [])
        main = [c for c in env.trajectory.calls if not c.side]
        assert main and main[0].request_id == first["request_id"] and main[0].status == 504
        assert all(c.completion is None for c in main)
    finally:
        env.close()
