"""mode="model": the env is the harness's model, each main model call a step.

Real harness processes (the Reference agent's ``openai`` policy, and a line-protocol
Command agent, ``support/scripts/model_agent.py``) call the env's own loopback model
endpoint and run tool calls over the real MCP bridge; nothing of ours is mocked.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import time
from typing import Any

import gymnasium
import numpy as np
import psutil
import pytest
from support import LINE_AGENT, MODEL_AGENT
from support.clock import Clock
from support.envs import model_env

import gym_harness  # noqa: F401  (registers the env ids)
from gym_harness import ConfigError, HarnessEnv, RewardContext
from gym_harness.outcome import Outcome

RAN: list[tuple[int, int]] = []  # every call of the env tool, in this process


def add(a: int, b: int) -> int:
    """Add two integers."""
    RAN.append((a, b))
    return a + b


def reward(ctx: RewardContext) -> float:
    return 1.0 if "5" in ctx.response else 0.25


TASKS = [{"id": "t", "prompt": "what is 2+3?"}]
KINDS = ["reference", "command"]


def call_add(a: int = 2, b: int = 3, **extra: Any) -> str:
    return json.dumps(
        {"content": "", "tool_calls": [{"name": "add", "arguments": {"a": a, "b": b}}], **extra}
    )


def tool_names(request: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in request["tools"]]


@pytest.mark.parametrize("kind", KINDS)
def test_episode_prompt_tool_result_text_end_and_final_conversation(kind: str) -> None:
    """(a) (b) (c) (l): prompt and tool first, a tool call runs, text ends it, scored."""
    RAN.clear()
    env = model_env(kind, [add], reward_fn=reward)
    try:
        obs, info = env.reset(seed=0)
        assert info["error_type"] == "", info["error"]
        request = json.loads(obs)
        assert set(request) >= {"request_id", "api", "model", "messages", "tools", "sampling"}
        assert request["request_id"] and request["api"] == "chat"
        assert request["messages"][-1] == {"role": "user", "content": "what is 2+3?"}
        assert "add" in tool_names(request)

        obs, rew, term, trunc, info = env.step(call_add(token_ids=[7, 8], logprobs=[-0.5, -0.1]))
        assert (rew, term, trunc, info["error_type"]) == (0.0, False, False, "")
        assert RAN == [(2, 3)]  # the tool really ran, in this process
        nxt = json.loads(obs)
        assert nxt["request_id"] != request["request_id"]
        assert nxt["messages"][-2]["role"] == "assistant"
        assert nxt["messages"][-2]["tool_calls"][0]["function"]["name"] == "add"
        assert nxt["messages"][-1]["role"] == "tool" and nxt["messages"][-1]["content"] == "5"

        obs, rew, term, trunc, info = env.step("2 + 3 = 5")
        assert (rew, term, trunc, info["error_type"]) == (1.0, True, False, "")
        final = json.loads(obs)  # (l) the terminal observation: the whole conversation
        assert final["request_id"] == ""
        assert final["messages"][: len(nxt["messages"])] == nxt["messages"]
        assert final["messages"][-1] == {"role": "assistant", "content": "2 + 3 = 5"}

        main = [c for c in env.trajectory.calls if not c.side]
        assert [c.request_id for c in main] == [request["request_id"], nxt["request_id"]]
        assert main[0].token_ids == [7, 8] and main[1].token_ids is None
        assert len(env.trajectory.turns) == 1 and env.trajectory.turns[0].reward == 1.0
    finally:
        env.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_json_object_without_message_keys_is_text(kind: str) -> None:
    env = model_env(kind, [add], reward_fn=reward)
    try:
        env.reset(seed=0)
        obs, rew, term, _, info = env.step('{"answer": 5}')
        assert (rew, term, info["error_type"]) == (1.0, True, "")
        assert json.loads(obs)["messages"][-1]["content"] == '{"answer": 5}'
    finally:
        env.close()


BAD_ACTIONS = {
    "unknown tool": ('{"tool_calls": [{"name": "nope", "arguments": {}}]}', "nope"),
    "arguments not an object": ('{"tool_calls": [{"name": "add", "arguments": [1, 2]}]}', "add"),
    "arguments text not an object": (
        '{"tool_calls": [{"name": "add", "arguments": "[1]"}]}',
        "add",
    ),
    "content not text": ('{"content": 5}', "content"),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", sorted(BAD_ACTIONS))
def test_malformed_action_is_invalid_action(kind: str, case: str) -> None:
    """(d): a bad action is data: terminated, reward 0.0, the reason in info."""
    action, needle = BAD_ACTIONS[case]
    RAN.clear()
    env = model_env(kind, [add], reward_fn=reward)
    try:
        env.reset(seed=0)
        obs, rew, term, trunc, info = env.step(action)
        assert (rew, term, trunc) == (0.0, True, False)
        assert info["error_type"] == Outcome.INVALID_ACTION
        assert needle in info["error"]
        assert RAN == []
        assert json.loads(obs)["request_id"] == ""
        with pytest.raises(gymnasium.error.ResetNeeded):
            env.step("again")
        obs, info = env.reset(seed=1)  # the env goes on with a new episode
        assert info["error_type"] == "" and json.loads(obs)["request_id"]
    finally:
        env.close()


@pytest.mark.parametrize("kind", KINDS)
def test_sigkill_while_the_policy_holds_a_call_is_harness_crashed(kind: str) -> None:
    """(e)"""
    env = model_env(kind, [add], reward_fn=reward)
    try:
        env.reset(seed=0)
        assert env.process is not None and env.process.pid is not None
        pid = env.process.pid
        os.kill(pid, signal.SIGKILL)
        psutil.Process(pid).wait(30) if psutil.pid_exists(pid) else None
        _, rew, term, trunc, info = env.step(call_add())
        assert info["error_type"] == Outcome.HARNESS_CRASHED, info["error"]
        assert (rew, term, trunc) == (0.25, True, False)  # scored as in turn mode
    finally:
        env.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_slow_policy_causes_no_retry_and_no_duplicate_step(kind: str, clock: Clock) -> None:
    """(f): the policy thinks 20 s on one call (on the env's clock); the harness waits for it.

    The harness's side of the rule is its own HTTP timeout, which outwaits the policy's
    (checked on the reference agent's command line); the env's side, no policy timeout
    and no second record of the call, is checked after 20 s on the env's clock.
    """
    env = model_env(kind, [add], reward_fn=reward, policy_timeout_s=40.0)
    try:
        obs, _ = env.reset(seed=0)
        if kind == "reference":  # its HTTP client outwaits the policy
            assert env.process is not None and env.process.pid is not None
            cmdline = psutil.Process(env.process.pid).cmdline()
            assert cmdline[cmdline.index("--request-timeout") + 1] == "100.0"
        clock.advance(20)
        obs2, _, term, _, info = env.step(call_add())
        assert info["error_type"] == "" and not term, info["error"]
        _, rew, term, _, info = env.step("5")
        assert (rew, term, info["error_type"]) == (1.0, True, "")
        calls = env.trajectory.calls
        assert [c.request_id for c in calls] == [json.loads(o)["request_id"] for o in (obs, obs2)]
        assert [c.retries for c in calls] == [0, 0]
        assert [c.status for c in calls] == [200, 200]
        assert len(env.trajectory.turns) == 1
    finally:
        env.close()


@pytest.mark.parametrize("vectorization_mode", ["sync", "async"])
def test_vector_env_gives_n_requests_per_step_and_autoresets(vectorization_mode: str) -> None:
    """(g)"""
    envs = gymnasium.make_vec(
        "gym_harness/Reference-v0",
        num_envs=4,
        vectorization_mode=vectorization_mode,
        mode="model",
        tools=[add],
        tasks=TASKS,
        reward_fn=reward,
    )
    try:
        obs, _ = envs.reset(seed=0)
        first = [json.loads(o) for o in obs]
        assert len({r["request_id"] for r in first}) == 4
        assert all(r["messages"][-1]["content"] == "what is 2+3?" for r in first)
        obs, rew, term, trunc, _ = envs.step(np.array([call_add(a=i, b=1) for i in range(4)]))
        results = [json.loads(o)["messages"][-1] for o in obs]
        assert [m["content"] for m in results] == [str(i + 1) for i in range(4)]
        assert not term.any() and not trunc.any() and (rew == 0.0).all()
        obs, rew, term, trunc, _ = envs.step(np.array(["5"] * 4))
        assert term.all() and not trunc.any() and (rew == 1.0).all()
        assert all(json.loads(o)["request_id"] == "" for o in obs)
        obs, rew, term, _, _ = envs.step(np.array(["ignored"] * 4))  # the autoreset step
        again = [json.loads(o) for o in obs]
        assert all(r["request_id"] and len(r["messages"]) == 1 for r in again)
        assert not term.any() and (rew == 0.0).all()
        obs, rew, term, _, _ = envs.step(np.array(["no 4"] * 4))
        assert term.all() and (rew == 0.25).all()
    finally:
        envs.close()


@pytest.mark.parametrize("kind", KINDS)
def test_user_fn_sends_a_second_user_message(kind: str) -> None:
    """(h)"""
    seen: list[int] = []

    def user_fn(trajectory: Any) -> str | None:
        seen.append(len(trajectory.turns))
        return "and 1+4?" if len(trajectory.turns) == 1 else None

    env = model_env(kind, [add], reward_fn=reward, user_fn=user_fn)
    try:
        env.reset(seed=0)
        obs, rew, term, trunc, info = env.step("2+3 is 5")
        assert (term, trunc, info["error_type"]) == (False, False, "")
        assert rew == 1.0  # the ended turn's reward, with the next turn's first call
        request = json.loads(obs)
        assert request["request_id"]
        assert [m["role"] for m in request["messages"]][-3:] == ["user", "assistant", "user"]
        assert request["messages"][-1]["content"] == "and 1+4?"
        obs, rew, term, _, info = env.step("it is 7")
        assert (rew, term, info["error_type"]) == (0.25, True, "")
        assert seen == [1, 2]
        assert [t.message for t in env.trajectory.turns] == ["what is 2+3?", "and 1+4?"]
    finally:
        env.close()


def test_user_fn_by_import_string() -> None:
    env = model_env("reference", [add], reward_fn=reward, user_fn="json:dumps")
    env.close()


@pytest.mark.parametrize("model_calls", ["main", "all"])
def test_side_calls_get_a_fixed_answer_or_become_steps(model_calls: str) -> None:
    """(i): the Command agent makes a side call (model gym-side) before the main one."""
    env = model_env(
        "command", [add], reward_fn=reward, prompt="side: what is 2+3?", model_calls=model_calls
    )
    try:
        obs, info = env.reset(seed=0)
        request = json.loads(obs)
        if model_calls == "all":
            assert request["model"] == "gym-side" and request["tools"] == []
            obs, rew, term, _, info = env.step("Sums")
            assert (rew, term, info["error_type"]) == (0.0, False, "")
            request = json.loads(obs)
        assert request["model"] == "main" and "add" in tool_names(request)
        _, rew, term, _, info = env.step("5")
        assert (rew, term, info["error_type"]) == (1.0, True, "")
        calls = env.trajectory.calls
        assert [c.side for c in calls] == [True, False]
        side = calls[0].completion
        assert side is not None
        assert side.content == ("Sums" if model_calls == "all" else "OK")
        assert env.trajectory.turns[0].response == "5"
        texts = [e.data.get("text") for e in env.trajectory.turns[0].events]
        assert f"[title: {side.content}] " in texts
    finally:
        env.close()


@pytest.mark.parametrize("limit", ["turn_timeout_s", "idle_timeout_s"])
def test_a_harness_stalling_after_the_answer_times_out(limit: str) -> None:
    """(j): after an action, the turn and idle limits bound the wait for the next call."""
    # Room for the reset's turn (the agent's start, its first call) on a loaded machine.
    limits = {"turn_timeout_s": 60.0, "idle_timeout_s": 60.0, limit: 5.0}
    env = model_env("command", [add], reward_fn=reward, prompt="stall: what is 2+3?", **limits)
    try:
        env.reset(seed=0)
        _, rew, term, trunc, info = env.step(call_add())
        expected = Outcome.TURN_TIMEOUT if limit == "turn_timeout_s" else Outcome.IDLE_TIMEOUT
        assert info["error_type"] == expected, info["error"]
        assert (rew, term, trunc) == (0.25, False, True)  # scored as in turn mode
    finally:
        env.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_policy_thinking_between_steps_never_times_the_turn_out(kind: str, clock: Clock) -> None:
    """(j): the limits count from each answer, not while the policy holds the call."""
    # Limits the harness's own work between two calls fits in even on a machine so loaded
    # that a process stalls for seconds (5 s was seen to be too little), and a policy that
    # thinks (on the moved clock) longer than both.
    env = model_env(kind, [add], reward_fn=reward, turn_timeout_s=15.0, idle_timeout_s=12.0)
    try:
        env.reset(seed=0)
        clock.advance(16)
        _, _, term, trunc, info = env.step(call_add())
        assert (term, trunc, info["error_type"]) == (False, False, ""), info["error"]
        _, rew, term, trunc, info = env.step("5")
        assert (rew, term, trunc, info["error_type"]) == (1.0, True, False, "")
    finally:
        env.close()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"mode": "x"}, "mode must be one of ['turns', 'model']"),
        ({"mode": "model", "capture": True, "upstream": "http://127.0.0.1:9"}, "drop capture"),
        (
            {"mode": "model", "model_calls": "some"},
            "model_calls must be one of ['main', 'all']",
        ),
        ({"mode": "model", "policy_timeout_s": 0}, "policy_timeout_s must be"),
        ({"mode": "model", "policy_timeout_s": -1.0}, "policy_timeout_s must be"),
        ({"mode": "model", "upstream": "ftp://127.0.0.1:9"}, "needs upstream='http(s)"),
        ({"mode": "model", "user_fn": 3}, "user_fn must be a callable"),
        ({"mode": "model", "user_fn": "no_such_module_xyz:fn"}, "no_such_module_xyz"),
    ],
)
def test_bad_model_mode_config_raises_at_construction(kwargs: dict[str, Any], needle: str) -> None:
    """(k)"""
    with pytest.raises(ConfigError) as caught:
        HarnessEnv("reference", **kwargs)
    assert needle in str(caught.value)


def test_a_harness_that_never_starts_gives_a_json_observation_and_startup_failed() -> None:
    command = [sys.executable, str(LINE_AGENT), "exit_at_start"]
    env = HarnessEnv("command", command=command, mode="model", tasks=TASKS)
    try:
        obs, info = env.reset(seed=0)
        assert info["error_type"] == Outcome.STARTUP_FAILED
        request = json.loads(obs)
        assert request["request_id"] == ""
        assert request["messages"] == [{"role": "user", "content": "what is 2+3?"}]
        obs, _, term, _, info = env.step("anything")
        assert (term, info["error_type"]) == (True, Outcome.STARTUP_FAILED)
        assert json.loads(obs)["request_id"] == ""
    finally:
        env.close()


@pytest.mark.parametrize(("prompt", "outcome"), [("crash", Outcome.HARNESS_CRASHED), ("hi", "")])
def test_a_turn_that_ends_before_any_model_call_is_told_at_reset(prompt: str, outcome: str) -> None:
    """The first turn ended without a model call: reset's info says how, the step ends it."""
    task = [{"id": "t", "prompt": prompt}]
    env = HarnessEnv("command", command=[sys.executable, str(LINE_AGENT)], mode="model", tasks=task)
    try:
        obs, info = env.reset(seed=0)
        assert (info["error_type"], json.loads(obs)["request_id"]) == (outcome, "")
        _, _, term, trunc, info = env.step("anything")
        assert (term, trunc, info["error_type"]) == (True, False, outcome)
        assert env.trajectory.turns[-1].message == prompt
    finally:
        env.close()


# -- answers that never reached the harness -----------------------------------------------------


def until_timed_out(env: HarnessEnv, count: int = 1) -> None:
    """Wait (bounded) until ``count`` model calls got the endpoint's 504 for the policy timeout."""
    endpoint = env._mode.endpoint  # type: ignore[attr-defined]  # model mode's endpoint
    assert endpoint is not None  # it says when its 504s went out
    deadline = time.monotonic() + 60
    while endpoint.lapses()[0] < count:
        assert time.monotonic() < deadline, "no model call timed out"
        time.sleep(0.02)


def error_events(info: dict[str, Any]) -> list[str]:
    return [e["data"].get("error_type", "") for e in info["events"] if e["type"] == "error"]


@pytest.mark.parametrize("kind", KINDS)
def test_an_answer_after_policy_timeout_is_not_delivered_and_truncates(kind: str) -> None:
    """The harness got a 504; the late answer is not shown or scored as delivered."""
    RAN.clear()
    env = model_env(kind, [add], reward_fn=reward, policy_timeout_s=1.0)
    try:
        env.reset(seed=0)
        obs, _, term, trunc, info = env.step(call_add())  # in time
        assert (term, trunc, info["error_type"]) == (False, False, ""), info["error"]
        late = json.loads(obs)
        until_timed_out(env)
        obs, rew, term, trunc, info = env.step("the sum is 5")  # too late
        assert (term, trunc, info["error_type"]) == (False, True, Outcome.POLICY_TIMEOUT)
        assert late["request_id"] in info["error"] and "policy_timeout_s=1" in info["error"]
        assert "not delivered" in info["error"] and error_events(info) == ["policy_timeout"]
        assert rew == 0.25  # reward_fn scored the truncated turn; "5" never was its reply
        assert RAN == [(2, 3)]
        final = json.loads(obs)  # the conversation up to the last answer delivered
        assert final["request_id"] == "" and "the sum is 5" not in json.dumps(final)
        assert final["messages"][-1]["role"] == "assistant"
        assert final["messages"][-1]["tool_calls"][0]["function"]["name"] == "add"
        assert env.trajectory.final_messages() == final["messages"]
        record = env.trajectory.to_record(env_id="e", index=0, seed=0, total_s=1.0)
        assert record["messages"] == final["messages"]
        assert (record["outcome"], record["error_type"]) == ("policy_timeout",) * 2
        (turn,) = env.trajectory.turns
        assert (turn.truncated, turn.error_type, turn.reward) == (True, "policy_timeout", 0.25)
        assert "the sum is 5" not in turn.response
        main = [c for c in env.trajectory.calls if not c.side]
        assert [c.status for c in main[:2]] == [200, 504]
        assert main[1].request_id == late["request_id"] and main[1].completion is None
        assert all(c.completion is None for c in main[1:])
        with pytest.raises(gymnasium.error.ResetNeeded, match="policy_timeout"):
            env.step("again")
        obs, info = env.reset(seed=1)  # the env goes on with a new episode
        assert info["error_type"] == "" and json.loads(obs)["request_id"]
    finally:
        env.close()


def test_calls_timing_out_while_the_policy_is_late_are_all_told() -> None:
    """The harness retries while the policy thinks; each retry times out too."""
    RAN.clear()
    env = model_env(
        "command", [add], reward_fn=reward, prompt="retry: what is 2+3?", policy_timeout_s=1.0
    )
    try:
        obs, _ = env.reset(seed=0)
        first = json.loads(obs)["request_id"]
        until_timed_out(env, 2)  # the call, and the harness's retry of it
        _, rew, term, trunc, info = env.step(call_add())
        assert (term, trunc, info["error_type"]) == (False, True, Outcome.POLICY_TIMEOUT)
        found = re.search(r"(\d+) more model call\(s\) \(the harness's retries\)", info["error"])
        assert found is not None and int(found.group(1)) >= 1, info["error"]
        assert first in info["error"] and rew == 0.25 and RAN == []
        calls = env.trajectory.calls
        assert len(calls) >= 2 and calls[0].request_id == first
        assert all(c.completion is None and c.status == 504 for c in calls)
    finally:
        env.close()


def test_a_turn_ended_as_if_done_after_a_timed_out_call_is_policy_timeout() -> None:
    """No answer went out after the call's 504, yet the harness ended the turn "cleanly"."""
    command = [sys.executable, str(MODEL_AGENT), "--ask-at-start"]
    scored: list[str] = []

    def reward_fn(ctx: RewardContext) -> float:
        scored.append(ctx.error_type)
        return 0.5

    env = HarnessEnv(
        "command", command=command, mode="model", tasks=TASKS, reward_fn=reward_fn,
        policy_timeout_s=1.0,
    )  # fmt: skip
    try:
        obs, info = env.reset(seed=0)  # its call before "ready" timed out: the turn ended
        assert info["error_type"] == Outcome.POLICY_TIMEOUT, info["error"]
        assert json.loads(obs)["request_id"] == ""
        (call,) = env._mode.endpoint.calls() if env._mode.endpoint else ()
        assert (call.status, call.completion) == (504, None)
        assert call.request_id in info["error"] and "as if done" in info["error"]
        _, rew, term, trunc, info = env.step("anything")
        assert (term, trunc, info["error_type"]) == (False, True, Outcome.POLICY_TIMEOUT)
        assert (rew, scored) == (0.5, ["policy_timeout"]) and call.request_id in info["error"]
        assert env.trajectory.turns[-1].response == "model error 504"
        assert [c.status for c in env.trajectory.calls] == [504]
    finally:
        env.close()


# -- user_fn faults ---------------------------------------------------------------------------


def test_a_user_fn_that_raises_is_user_fn_error(caplog: pytest.LogCaptureFixture) -> None:
    def user_fn(trajectory: Any) -> str | None:
        raise RuntimeError("no next message")

    env = gymnasium.make(
        "gym_harness/Reference-v0", mode="model", tools=[add], tasks=TASKS, reward_fn=reward,
        user_fn=user_fn,
    )  # fmt: skip
    try:
        env.reset(seed=0)
        with caplog.at_level(logging.ERROR, logger="gym_harness"):
            _, rew, term, trunc, info = env.step("2+3 is 5")
        assert (term, trunc, info["error_type"]) == (True, False, Outcome.USER_FN_ERROR)
        assert rew == 1.0  # the turn is kept and scored
        assert "RuntimeError: no next message (at " in info["error"]
        assert "user_fn" in info["error"] and "\n" not in info["error"]
        logged = [r for r in caplog.records if r.exc_info]
        assert len(logged) == 1 and "user_fn" in logged[0].getMessage()
        (turn,) = HarnessEnv.of(env).trajectory.turns
        assert (turn.error_type, turn.reward, turn.terminated) == ("user_fn_error", 1.0, True)
        with pytest.raises(gymnasium.error.ResetNeeded):
            env.step("again")
    finally:
        env.close()


def test_a_user_fn_that_returns_no_str_is_user_fn_error() -> None:
    env = model_env("reference", [add], reward_fn=reward, user_fn=lambda trajectory: 5)
    try:
        env.reset(seed=0)
        _, rew, term, trunc, info = env.step("2+3 is 5")
        assert (term, trunc, info["error_type"]) == (True, False, Outcome.USER_FN_ERROR)
        assert rew == 1.0 and "returned int 5" in info["error"] and "a str" in info["error"]
        assert env.trajectory.turns[-1].error_type == Outcome.USER_FN_ERROR
    finally:
        env.close()
