"""gym_harness.openenv with OpenEnv's own rollout function, as TRL calls it.

``build_harness_rollout_func`` (OpenEnv's, unchanged) gets our ``HarnessSessionFactory``
and ``ModelModeAdapter`` and a deterministic ``model_step`` that returns known token
ids; ``rollout_func(prompts, trainer)`` must hand back, per prompt, exactly those ids
with their logprobs and our ``reward_fn``'s reward. The harness is a real process (the
Reference agent, and one real CLI in the loopback-only namespace) calling the env's own
model endpoint; its tool calls run over the real MCP bridge. Sessions are also OpenEnv
``TrainableSession``s whose ``fetch_training_trace()`` passes OpenEnv's validation, in
model mode and in capture mode against a loopback upstream answering like vLLM.

Needs the extra (``gym_harness[openenv]``): the module is skipped without it.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("openenv.core.harness")

from openenv.core.harness import (
    HarnessRunLimits,
    ModelStepResult,
    ResourceSession,
    TrainableSession,
    TrainingTrace,
    build_harness_rollout_func,
)
from openenv.core.llm_client import LLMResponse, ToolCall
from support import TOKEN_AGENT
from support.cli import Calls, cli_path, real_cli
from support.model_server import ScriptedModelServer, token_id

from gym_harness import RewardContext
from gym_harness.errors import ConfigError
from gym_harness.openenv import (
    EnvSession,
    HarnessSessionFactory,
    ModelModeAdapter,
    TextLevelTrace,
)

#: The pieces the scripted model server answers "x y" with (one token id each).
PIECES = ["you", " said:", " x", " y"]
pytestmark = pytest.mark.slow  # a whole rollout or runtime per test


def reward(ctx: RewardContext) -> float:
    """0.75 when the reply gives the sum (either value tells it came from here)."""
    return 0.75 if "42" in ctx.response else 0.25


class Policy:
    """A deterministic ``model_step``: asks for the env tool once, then says the sum.

    Every id it returns is new (a counter), so each can be traced to the call that
    produced it; ``with_ids=False`` returns none (a text-level policy).
    """

    def __init__(self, with_ids: bool = True) -> None:
        self.with_ids = with_ids
        self.ids = itertools.count(1000)
        self.produced: list[tuple[list[int], list[int], list[float]]] = []
        self.seen: list[tuple[list[dict[str, Any]], list[str], dict[str, Any]]] = []

    def __call__(
        self, messages: list[dict[str, Any]], tools: list[Any], sampling: dict[str, Any]
    ) -> ModelStepResult:
        names = [t.name for t in tools]
        self.seen.append((messages, names, sampling))
        tool = next((n for n in names if n.endswith("add")), None)
        if tool is not None and not any(m.get("role") == "tool" for m in messages):
            call = ToolCall(id="", name=tool, args={"a": 20, "b": 22})
            response = LLMResponse(content="", tool_calls=[call])
        else:
            response = LLMResponse(content="The sum is 42.")
        if not self.with_ids:
            return ModelStepResult(response=response)
        prompt = [next(self.ids) for _ in range(3)]
        completion = [next(self.ids) for _ in range(2 + len(self.produced))]
        logprobs = [-0.5 / (i + 1) for i in range(len(completion))]
        self.produced.append((prompt, completion, logprobs))
        return ModelStepResult(response, prompt, completion, logprobs)


def reference_factory(**changes: Any) -> HarnessSessionFactory:
    calls = Calls()
    options = {"harness": "reference", "mode": "model", "tools": calls.tools()}
    return HarnessSessionFactory(options, reward_fn=reward, **changes)


def rollout(
    factory: HarnessSessionFactory, prompts: list[Any], **limits: Any
) -> tuple[dict[str, list[Any]], list[Policy]]:
    """OpenEnv's rollout_func over ``factory``, called as TRL calls it."""
    policies: list[Policy] = []

    def builder(trainer: Any, session: ResourceSession) -> Callable[..., ModelStepResult]:
        assert trainer == "the trainer" and isinstance(session, EnvSession)
        policies.append(Policy())
        return policies[-1]

    rollout_func = build_harness_rollout_func(
        session_factory=factory,
        harness_adapter=ModelModeAdapter(),
        model_step_builder=builder,
        limits=HarnessRunLimits(**limits),
    )
    return rollout_func(prompts, "the trainer"), policies


def assert_rows(out: dict[str, list[Any]], policies: list[Policy], prompts: int) -> None:
    """Each prompt's row holds exactly the ids its model_step produced, in order."""
    assert len(policies) == prompts
    for key in ("prompt_ids", "completion_ids", "logprobs", "env_reward"):
        assert len(out[key]) == prompts, key
    for i, policy in enumerate(policies):
        assert len(policy.produced) == 2  # the tool call, then the answer
        assert out["prompt_ids"][i] == [t for p, _, _ in policy.produced for t in p]
        assert out["completion_ids"][i] == [t for _, c, _ in policy.produced for t in c]
        assert out["logprobs"][i] == [lp for _, _, ls in policy.produced for lp in ls]
        assert len(out["completion_ids"][i]) == len(out["logprobs"][i])
    assert out["env_reward"] == [0.75] * prompts


@pytest.mark.timeout(300)
def test_openenvs_rollout_func_returns_the_model_steps_ids_and_our_reward() -> None:
    prompts = ["please add 20 and 22", [{"role": "user", "content": "add 20 and 22"}]]
    out, policies = rollout(reference_factory(), prompts)
    assert_rows(out, policies, len(prompts))
    for policy, prompt in zip(policies, ("please add 20 and 22", "add 20 and 22"), strict=True):
        first, second = policy.seen
        assert first[1] == ["add"] and prompt in json.dumps(first[0])
        assert [m["role"] for m in second[0]][-2:] == ["assistant", "tool"]
        assert "42" in json.dumps(second[0][-1])  # the tool really ran over the bridge
    assert all(m["outcome"] == "done" and m["token_level"] for m in out["verify_metrics"])


@pytest.mark.timeout(300)
def test_an_env_id_works_too_and_limits_are_kept() -> None:
    factory = HarnessSessionFactory(
        "gym_harness/Reference-v0", mode="model", tools=Calls().tools(), reward_fn=reward
    )
    session = factory.create({"id": "t", "prompt": "add 20 and 22"})
    try:
        policy = Policy()
        limits = HarnessRunLimits(max_turns=1, sampling={"temperature": 0.5})
        result = ModelModeAdapter().run_white_box(policy, session, limits)
        assert len(policy.seen) == 1 and policy.seen[0][2]["temperature"] == 0.5
        assert result.metrics["turns"] == 1 and not result.done
        assert result.completion_ids == policy.produced[0][1]
        # No turn ended, so nothing was scored: unscored is None, never 0.0.
        assert session.verify(result.messages).env_reward is None
    finally:
        session.close()
    session = factory.create({"id": "t", "prompt": "add 20 and 22"})
    try:
        limits = HarnessRunLimits(max_total_tool_calls=0)
        result = ModelModeAdapter().run_white_box(Policy(), session, limits)
        assert result.metrics["truncated"] is True and result.tool_trace == []
    finally:
        session.close()


@pytest.mark.timeout(300)
def test_a_model_mode_session_is_trainable_and_its_trace_validates() -> None:
    factory = reference_factory()
    session = factory.create("please add 20 and 22")
    try:
        assert isinstance(session, ResourceSession) and isinstance(session, TrainableSession)
        assert [t.name for t in session.list_tools()] == ["add"]
        assert session.call_tool("add", {"a": 1, "b": 2}).data == {"result": 3}
        with pytest.raises(KeyError, match="no served tool"):
            session.call_tool("nope", {})
        policy = Policy()
        result = ModelModeAdapter().run_white_box(policy, session)
        assert result.done and [e.tool_name for e in result.tool_trace] == ["add"]
        trace = session.fetch_training_trace()
    finally:
        session.close()
    assert isinstance(trace, TrainingTrace)
    assert TrainingTrace.model_validate(trace.model_dump()) == trace
    assert len(trace.turns) == len(policy.produced) == 2
    for turn, (prompt, completion, logprobs) in zip(trace.turns, policy.produced, strict=True):
        assert (turn.prompt_token_ids, turn.completion_token_ids) == (prompt, completion)
        assert turn.per_token_logps == logprobs
        assert turn.loss_mask == [0] * len(prompt) + [1] * len(completion)


@pytest.mark.timeout(300)
def test_a_policy_without_ids_gives_a_text_level_trace_and_nothing_made_up() -> None:
    session = reference_factory().create("please add 20 and 22")
    try:
        result = ModelModeAdapter().run_white_box(Policy(with_ids=False), session)
        assert result.done and result.completion_ids == [] and result.prompt_ids == []
        plain = session.env.trajectory.training_trace()
        with pytest.raises(TextLevelTrace, match="text-level"):
            session.fetch_training_trace()
    finally:
        session.close()
    assert plain["token_level"] is False and plain["turns"] == []
    assert [c["why"] for c in plain["text_level_calls"]] == [
        "the policy's action carries no prompt token ids"
    ] * 2


@pytest.mark.timeout(240)
def test_a_captured_black_box_rollout_is_trainable() -> None:
    with ScriptedModelServer() as srv:
        factory = HarnessSessionFactory(
            {"harness": "reference", "policy": "openai", "model": "m"},
            command=[sys.executable, str(TOKEN_AGENT), "plain"],
            capture=True,
            upstream=srv.base_url,
            capture_tokens=True,
            reward_fn=reward,
            turn_timeout_s=180,
        )
        session = factory.create({"id": "x", "prompt": "x y"})
        try:
            assert isinstance(session, TrainableSession)
            assert session.wait_for_completion(timeout_s=180) == 0
            trace = session.fetch_training_trace()
            result = ModelModeAdapter().run_black_box(session)
            verified = session.verify(result.messages)
        finally:
            session.close()
    side, main = trace.turns
    assert side.metadata["side"] and not any(side.loss_mask)  # never trainable
    assert main.completion_token_ids == [token_id(p) for p in PIECES]
    assert main.loss_mask == [0] * len(main.prompt_token_ids) + [1] * len(PIECES)
    assert result.completion_ids == main.completion_token_ids
    assert result.messages[-1] == {"role": "assistant", "content": "you said: x y"}
    assert verified.env_reward == 0.25 and verified.metrics["token_level"] is True


@pytest.mark.timeout(240)
def test_a_harness_that_fails_to_start_is_an_outcome_with_its_reward() -> None:
    """A harness fault is no exception out of the rollout: the env's outcome, scored."""
    factory = HarnessSessionFactory(
        {"harness": "command", "mode": "model"},
        command=[sys.executable, "-c", "pass"],  # exits before it is ready
        reward_fn=reward,
        startup_timeout_s=20,
    )
    out, policies = rollout(factory, ["hello"])
    assert policies[0].seen == []  # no model call was made, so no step was asked for
    assert out["completion_ids"] == [[]] and out["env_reward"] == [0.25]
    assert out["verify_metrics"][0]["outcome"] == "startup_failed"


def test_bad_configuration_says_what_to_do() -> None:
    with pytest.raises(ConfigError, match="env id"):
        HarnessSessionFactory(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="HarnessSessionFactory"):
        HarnessSessionFactory("gym_harness/NoSuch-v0")
    with pytest.raises(ConfigError, match="HarnessSessionFactory"):
        ModelModeAdapter().run_white_box(Policy(), object())  # type: ignore[arg-type]


@pytest.mark.timeout(240)
def test_session_mode_mismatches_are_config_errors() -> None:
    session = HarnessSessionFactory({"harness": "reference"}).create("hello")
    try:
        with pytest.raises(ConfigError, match="mode='model'"):
            ModelModeAdapter().run_white_box(Policy(), session)
        with pytest.raises(ConfigError, match="turn_timeout_s"):
            session.wait_for_completion(timeout_s=0.5)
        with pytest.raises(ConfigError, match="a task is a dict"):
            HarnessSessionFactory({"harness": "reference"}).create(3)
    finally:
        session.close()


#: The real CLI of the white-box test: Codex (a native binary: the quickest to start).
CLI, CLI_COMMAND, CLI_KEY = "codex", "codex", "OPENAI_API_KEY"


@real_cli(timeout=300)
def test_openenvs_rollout_func_trains_a_real_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CLI_KEY, "test-key")  # a dummy: the env gives the CLI its own
    factory = HarnessSessionFactory(
        {"harness": CLI, "mode": "model"},
        model="m1",
        executable=cli_path(CLI_COMMAND),
        tools=Calls().tools(),
        reward_fn=reward,
        startup_timeout_s=60,
        turn_timeout_s=120,
        idle_timeout_s=90,
    )
    out, policies = rollout(factory, ["please add 20 and 22 with the add tool"])
    assert_rows(out, policies, 1)
    (policy,) = policies
    tool = next(n for n in policy.seen[0][1] if n.endswith("add"))
    assert "env" in tool  # the env tool, as the CLI names it
