"""gym_harness.openenv at its edges: cut episodes, bad model steps, late answers, timeouts.

* An episode a limit cuts mid-turn (``max_turns``) is scored as truncated: OpenEnv's own
  ``rollout_func`` gets a reward for every row, from ``reward_fn``, which saw
  ``ctx.truncated`` and the cause.
* A ``model_step`` whose ids cannot be trained (6 completion ids, 4 logprobs) fails the
  rollout before the harness gets the answer.
* An answer that came after ``policy_timeout_s`` (the harness got an API error instead)
  is in no row, and the env's own trace agrees.
* ``wait_for_completion(timeout_s)`` raises ``TimeoutError`` once ``timeout_s`` runs out,
  without waiting for a harness that ignores SIGTERM to be stopped; ``close`` then ends it.
* ``HarnessSessionFactory(sampling=...)`` (what TRL's black-box worker passes) reaches the
  capture upstream on every request.

The harnesses are real processes (the reference agent, a line-protocol script), the model
endpoint, bridge and capture proxy are the env's own, on loopback.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import psutil
import pytest

pytest.importorskip("openenv.core.harness")

from openenv.core.harness import (
    HarnessRunLimits,
    ModelStepResult,
    ResourceSession,
    build_harness_rollout_func,
)
from openenv.core.llm_client import LLMResponse, ToolCall
from support import HARNESS_SCRIPT, TOKEN_AGENT
from support.cli import Calls
from support.model_server import ScriptedModelServer

from gym_harness import RewardContext
from gym_harness.openenv import BadModelStep, HarnessSessionFactory, ModelModeAdapter
from gym_harness.openenv.adapter import check_step


class Scores:
    """A ``reward_fn`` that keeps what it saw: 0.75 when the reply gives the sum, else 0.25."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, str]] = []

    def __call__(self, ctx: RewardContext) -> float:
        self.seen.append((ctx.truncated, ctx.cause))
        return 0.75 if "42" in ctx.response else 0.25


def policy(ids: tuple[int, int] = (3, 2), think_s: float = 0.0) -> Any:
    """A ``model_step`` that asks for the env tool once, then gives the sum; its ids are
    ``ids[0]`` prompt ids and ``ids[1]`` completion ids (with as many logprobs) per call,
    each new; it thinks ``think_s`` before its first answer."""
    produced: list[tuple[list[int], list[int], list[float]]] = []

    def step(messages: list[dict[str, Any]], tools: list[Any], sampling: Any) -> ModelStepResult:
        if not produced:
            time.sleep(think_s)
        tool = next((t.name for t in tools if t.name.endswith("add")), None)
        if tool is not None and not any(m.get("role") == "tool" for m in messages):
            response = LLMResponse(content="", tool_calls=[ToolCall("", tool, {"a": 20, "b": 22})])
        else:
            response = LLMResponse(content="The sum is 42.")
        base = 1000 + 100 * len(produced)
        prompt = list(range(base, base + ids[0]))
        completion = list(range(base + 50, base + 50 + ids[1]))
        logprobs = [-0.5] * len(completion)
        produced.append((prompt, completion, logprobs))
        return ModelStepResult(response, prompt, completion, logprobs[: ids[1]])

    step.produced = produced  # type: ignore[attr-defined]
    return step


def reference(scores: Scores, calls: Calls, **changes: Any) -> HarnessSessionFactory:
    options = {"harness": "reference", "mode": "model", "tools": calls.tools()}
    return HarnessSessionFactory(options, reward_fn=scores, **changes)


@pytest.mark.timeout(300)
def test_a_rollout_cut_by_max_turns_gives_every_row_a_reward() -> None:
    """max_turns=1 on episodes that need 2 model calls: every row scored as truncated."""
    scores, calls, policies = Scores(), Calls(), []

    def builder(trainer: Any, session: ResourceSession) -> Any:
        policies.append(policy())
        return policies[-1]

    rollout_func = build_harness_rollout_func(
        session_factory=reference(scores, calls),
        harness_adapter=ModelModeAdapter(),
        model_step_builder=builder,
        limits=HarnessRunLimits(max_turns=1),
    )
    out = rollout_func(["please add 20 and 22", "add 20 and 22"], "the trainer")
    assert out["env_reward"] == [0.25, 0.25]  # reward_fn's (no sum was given yet)
    assert scores.seen == [(True, "max_steps")] * 2
    assert [m["outcome"] for m in out["verify_metrics"]] == ["truncated"] * 2
    assert all(m["truncated"] for m in out["verify_metrics"])
    for i, step in enumerate(policies):
        ((prompt, completion, logprobs),) = step.produced  # one call answered, in its row
        assert out["prompt_ids"][i] == prompt and out["completion_ids"][i] == completion
        assert out["logprobs"][i] == logprobs
    with calls.lock:
        assert calls.seen == [(20, 22)] * 2  # each answer reached its harness


@pytest.mark.timeout(300)
def test_a_bad_model_step_fails_the_rollout_before_the_harness_gets_it() -> None:
    scores, calls = Scores(), Calls()
    step = policy(ids=(3, 6))

    def short(*args: Any) -> ModelStepResult:  # 6 completion ids, 4 logprobs
        found = step(*args)
        return ModelStepResult(
            found.response, found.prompt_ids, found.completion_ids, found.logprobs[:4]
        )

    session = reference(scores, calls).create("please add 20 and 22")
    try:
        with pytest.raises(BadModelStep, match="6 completion_ids and 4 logprobs"):
            ModelModeAdapter().run_white_box(short, session)
    finally:
        session.close()
    with calls.lock:
        assert calls.seen == []  # the tool call was never delivered, so never run
    trajectory = session.env.trajectory
    assert trajectory.calls and not any(c.completion is not None for c in trajectory.calls)
    assert scores.seen == []


def test_check_step_refuses_what_cannot_be_trained() -> None:
    answer = LLMResponse(content="hi")
    check_step(ModelStepResult(answer), 0)  # a text-level step: nothing to check
    check_step(ModelStepResult(answer, [1, 2], [3], [-0.1]), 0)
    bad = [
        ([1], [3, 4], [-0.1], "2 completion_ids and 1 logprobs"),
        ([], [3], [-0.1], "without prompt_ids"),
        ([1], [-3], [-0.1], r"completion_ids\[0\] is -3"),
        ([1, True], [3], [-0.1], r"prompt_ids\[1\] is True"),
        ([1], [2**40], [-0.1], "not a token id"),
        ([1], [3], [float("nan")], "not a log-probability"),
        ([1], [3], [0.5], "not a log-probability"),
    ]
    for prompt, completion, logprobs, why in bad:
        with pytest.raises(BadModelStep, match=why):
            check_step(ModelStepResult(answer, prompt, completion, logprobs), 4)


@pytest.mark.timeout(300)
def test_an_answer_past_policy_timeout_is_in_no_row() -> None:
    scores, calls = Scores(), Calls()
    session = reference(scores, calls, policy_timeout_s=1.0).create("please add 20 and 22")
    try:
        late = policy(think_s=3.0)
        result = ModelModeAdapter().run_white_box(late, session)
        verified = session.verify(result.messages)
        trace = session.env.trajectory.training_trace()
    finally:
        session.close()
    assert len(late.produced) == 1  # answered once, too late: the episode ended there
    assert result.metrics["undelivered"] == 1 and result.metrics["outcome"] == "policy_timeout"
    assert (result.prompt_ids, result.completion_ids, result.logprobs) == ([], [], [])
    assert trace["turns"] == []  # the env's own trace agrees: nothing was delivered
    with calls.lock:
        assert calls.seen == []
    assert verified.env_reward == 0.25 and scores.seen == [(True, "policy_timeout")]


@pytest.mark.timeout(120)
def test_wait_for_completion_returns_when_its_timeout_runs_out() -> None:
    """The turn never ends and the harness ignores SIGTERM: ``wait_for_completion(2)``
    raises while the harness still runs, so no part of the stop grace (3 s, after which
    the harness is SIGKILLed) was waited for; ``close`` then ends it. A wait that added
    the grace would return with the harness gone."""
    factory = HarnessSessionFactory(
        {"harness": "command"},
        command=[sys.executable, str(HARNESS_SCRIPT), "ignore_term"],
        allow_plain_text=True,
        stop_grace_s=3.0,
        turn_timeout_s=600,
    )
    session = factory.create({"id": "t", "prompt": "hello"})
    try:
        assert session.env.process is not None
        harness = psutil.Process(session.env.process.pid)
        with pytest.raises(TimeoutError, match=r"wait_for_completion\(timeout_s=2"):
            session.wait_for_completion(timeout_s=2)
        assert harness.is_running()  # not stopped yet: the timeout did not wait for it
        assert session.wait_for_completion(timeout_s=2) == 1  # ended: its code, at once
        assert session.fetch_training_trace().turns == []
        assert session.verify([]).env_reward is None  # no turn ended: unscored
    finally:
        session.close()
    assert not harness.is_running()


@pytest.mark.timeout(240)
def test_sampling_from_trls_worker_reaches_the_upstream() -> None:
    sampling = {"temperature": 0.6, "top_p": 1.0, "top_k": -1, "min_p": 0.0}
    with ScriptedModelServer() as srv:
        factory = HarnessSessionFactory(
            {"harness": "reference", "policy": "openai", "model": "m"},
            sampling=sampling,
            command=[sys.executable, str(TOKEN_AGENT), "plain"],
            capture=True,
            upstream=srv.base_url,
            capture_tokens=True,
            turn_timeout_s=180,
        )
        session = factory.create({"id": "x", "prompt": "x y"})
        try:
            assert session.wait_for_completion() == 0
            trace = session.fetch_training_trace()
        finally:
            session.close()
        bodies = [r.body for r in srv.requests("chat")]
    assert bodies and all(isinstance(b, dict) for b in bodies)
    for body in bodies:
        assert {k: body[k] for k in sampling} == sampling
    main = [t for t in trace.turns if not t.metadata["side"]]
    assert main and json.dumps(main[0].request).count('"temperature": 0.6') == 1


@pytest.mark.timeout(300)
def test_a_multi_call_episode_refused_gives_an_empty_row_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scores, calls = Scores(), Calls()
    session = reference(scores, calls).create("please add 20 and 22")
    try:
        step = policy()
        with caplog.at_level("WARNING", logger="gym_harness.openenv.adapter"):
            result = ModelModeAdapter(multi_call="refuse").run_white_box(step, session)
    finally:
        session.close()
    assert result.done and len(step.produced) == 2  # a tool call, then the answer
    assert (result.prompt_ids, result.completion_ids, result.logprobs) == ([], [], [])
    assert result.metrics["calls_left_out"] == 2
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "gym_harness.training.trl.rollout_func" in warning and "no ids" in warning
