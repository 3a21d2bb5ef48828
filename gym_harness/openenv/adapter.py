"""ModelModeAdapter: OpenEnv's ``HarnessAdapter`` that trains any harness white-box.

``run_white_box(model_step, session, limits)`` drives the session's harness (any CLI, or
the reference agent) in ``mode="model"``: each model call the harness makes is an
observation, handed to ``model_step(messages, tools, sampling)``; the returned
``ModelStepResult`` becomes the env's action (content, tool calls, and the token ids and
logprobs, which the harness never sees) and the harness runs on to its next call. The
rollout result is filled as OpenEnv's own white-box adapter (``MCPHarnessAdapter``) fills
it (one ``model_response`` event per model step, the tool calls the harness ran in
``tool_trace``, ``messages`` the conversation as the harness last sent it), except for
its ids:

Rows in context. OpenEnv 0.10.0's ``build_harness_rollout_func`` makes one row of
``prompt_ids``, ``completion_ids`` and ``logprobs`` and carries no mask, so the
concatenation ``MCPHarnessAdapter`` makes of a multi-call episode (prompt ``p1‖p2``,
completion ``c1‖c2``) would have TRL score ``c1`` after ``p2``: out of context. Here a
single-call episode's row is its call; an episode of several calls gives its last call's
row (``multi_call="last"``: every token scored where it was sampled, the earlier calls
left out and counted in ``metrics["calls_left_out"]``) or an empty one
(``multi_call="refuse"``), and a warning says so once. ``gym_harness.training.trl.rollout_func``
trains every call, as one token chain with TRL's ``env_mask``.

Checked steps. Each ``ModelStepResult`` is checked before the harness gets its answer:
``completion_ids`` and ``logprobs`` of equal length, ids non-negative ints, logprobs
finite numbers; a bad one fails the rollout (:class:`BadModelStep`). An answer the
harness never received (it came after ``policy_timeout_s``) is in no row.

Limits: ``max_turns`` counts model steps; ``max_tool_calls_per_turn`` cuts each
completion's tool calls; ``max_total_tool_calls`` cuts the completion that would pass it
and ends the rollout after it (``metrics["truncated"]``). An episode a limit stopped
mid-turn is cut and scored as truncated (``HarnessEnv.truncate``), so ``verify`` always
has a reward. ``sampling`` is laid over the harness's own sampling parameters.

``run_black_box(session, limits)`` runs a turn-mode session (the harness owns its loop;
capture records its model calls): one turn on the task's prompt.

Threads: the caller's (the session's env is driven synchronously).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from openenv.core.env_server.mcp_types import Tool
from openenv.core.harness import (
    HarnessAdapter,
    HarnessRolloutResult,
    HarnessRunLimits,
    ModelStep,
    ModelStepResult,
    ResourceSession,
    RolloutEvent,
    ToolResult,
    ToolTraceEntry,
)

from gym_harness.errors import ConfigError, HarnessError
from gym_harness.openenv.session import EnvSession, HarnessSessionFactory

__all__ = ["BadModelStep", "ModelModeAdapter"]

logger = logging.getLogger(__name__)

#: Largest token id taken (a vocabulary is far smaller; a larger int is no token id).
MAX_TOKEN_ID = 2**31 - 1
_MULTI_CALL = ("last", "refuse")


class BadModelStep(HarnessError, ValueError):
    """A ``model_step`` returned ids that cannot be trained (lengths differ, no token id,
    a logprob that is no finite number). The rollout fails; the harness never got it."""


class ModelModeAdapter(HarnessAdapter):
    """Drive a :class:`~gym_harness.openenv.EnvSession` with the trainer as its model.

    Args:
        factory: The session factory (or a callable returning one, as TRL's harness
            worker takes it) this adapter will drive, checked now: its env must be in
            ``mode="model"``, else ``ConfigError`` says the fix here rather than at the
            first rollout (where TRL's worker would score every rollout unscorable).
        multi_call: What a rollout result's ids hold for an episode of several model
            calls, which one masked row cannot carry in context: ``"last"`` the last
            call's ids, ``"refuse"`` none (see the module's "Rows in context").

    Raises:
        ConfigError: ``factory`` is not in model mode, or ``multi_call`` is unknown.

    Example:
        >>> from openenv.core.harness import build_harness_rollout_func
        >>> rollout_func = build_harness_rollout_func(  # doctest: +SKIP
        ...     session_factory=HarnessSessionFactory("gym_harness/Codex-v0", mode="model"),
        ...     harness_adapter=ModelModeAdapter(),
        ...     model_step_builder=lambda trainer, session: my_model_step,
        ... )
    """

    def __init__(self, factory: Any = None, *, multi_call: str = "last") -> None:
        if multi_call not in _MULTI_CALL:
            raise ConfigError(f"multi_call must be one of {_MULTI_CALL}, got {multi_call!r}.")
        self.multi_call = multi_call
        self._warned = False
        if factory is not None and not isinstance(factory, HarnessSessionFactory):
            factory = factory() if callable(factory) else factory
        if factory is not None:
            if not isinstance(factory, HarnessSessionFactory):
                raise ConfigError(
                    "ModelModeAdapter(factory) takes a gym_harness.openenv.HarnessSessionFactory "
                    f"(or a callable returning one), got {type(factory).__name__}."
                )
            if not factory.model_mode:
                raise ConfigError(
                    "ModelModeAdapter drives envs in model mode, and this factory's env is "
                    "in turn mode: make it with HarnessSessionFactory(..., mode='model'); for "
                    "black-box rollouts of turn mode use capture=True and no adapter."
                )

    def run_white_box(
        self,
        model_step: ModelStep,
        session: ResourceSession,
        limits: HarnessRunLimits | None = None,
    ) -> HarnessRolloutResult:
        """Run one rollout in model mode, each model call of the harness one ``model_step``.

        Raises:
            ConfigError: ``session`` is no model-mode :class:`EnvSession`.
        """
        ours = _session(session, model_mode=True)
        limits = limits or HarnessRunLimits()
        result = HarnessRolloutResult(messages=list(ours.initial_messages()))
        observation = json.loads(ours.observation)
        info: dict[str, Any] = {"error_type": "", "error": ""}
        total_calls, steps = 0, 0
        delivered: list[ModelStepResult] = []
        if not observation.get("request_id") and not ours.env.trajectory.turns:
            # The turn ended (or the harness failed to start) before any model call: one
            # step records it as the env's outcome, scored like any turn.
            ours.observation, _, _, _, info = ours.env.step("")
            observation = json.loads(ours.observation)
        while steps < limits.max_turns and observation.get("request_id"):
            request_id = str(observation["request_id"])
            tools = [_tool(t) for t in observation.get("tools") or ()]
            sampling = {**(observation.get("sampling") or {}), **limits.sampling}
            step = model_step(observation["messages"], tools, sampling)
            check_step(step, steps)
            calls = list(step.response.tool_calls)[: limits.max_tool_calls_per_turn]
            cut = limits.max_total_tool_calls is not None and (
                total_calls + len(calls) > limits.max_total_tool_calls
            )
            if cut:
                calls = calls[: max(0, (limits.max_total_tool_calls or 0) - total_calls)]
                result.metrics["truncated"] = True
            total_calls += len(calls)
            ours.observation, _, terminated, truncated, info = ours.env.step(_action(step, calls))
            observation = json.loads(ours.observation)
            if _delivered(ours, request_id, info):
                delivered.append(step)
            else:
                result.metrics["undelivered"] = result.metrics.get("undelivered", 0) + 1
            _record(result, steps, step, calls, info)
            steps += 1
            if terminated or truncated or cut:
                result.done = bool(terminated) and not info["error_type"]
                break
        if observation.get("request_id"):  # a limit stopped it mid-turn: cut and scored
            ours.env.truncate()
        self._rows(result, delivered)
        ours.exit_code = 1 if info["error_type"] else 0
        result.messages = list(observation.get("messages") or result.messages)
        result.metrics.update(
            turns=steps,
            tool_calls=len(result.tool_trace),
            outcome=ours.env.trajectory.outcome,
            error_type=info["error_type"],
        )
        return result

    def _rows(self, result: HarnessRolloutResult, delivered: list[ModelStepResult]) -> None:
        """The result's ids: what one row carries in context (the module's "Rows in context")."""
        trained = [s for s in delivered if s.completion_ids]
        if len(trained) > 1:
            result.metrics["calls_left_out"] = len(trained) - (self.multi_call == "last")
            if not self._warned:
                self._warned = True
                kept = "its last call" if self.multi_call == "last" else "no ids"
                logger.warning(
                    "an episode made %d model calls; one OpenEnv row cannot carry them in "
                    "context (it has no mask), so its row holds %s. "
                    "gym_harness.training.trl.rollout_func trains every call as one token "
                    "chain with TRL's env_mask.",
                    len(trained),
                    kept,
                )
            trained = trained[-1:] if self.multi_call == "last" else []
        for step in trained:
            result.prompt_ids.extend(step.prompt_ids)
            result.completion_ids.extend(step.completion_ids)
            result.logprobs.extend(step.logprobs)

    def run_black_box(
        self, session: ResourceSession, limits: HarnessRunLimits | None = None
    ) -> HarnessRolloutResult:
        """Run a turn-mode session: one turn on the task's prompt, the harness's own loop.

        ``prompt_ids``/``completion_ids``/``logprobs`` are filled from the capture
        proxy's records when every main call carried the upstream's token ids
        (``capture_tokens=True``), else left empty.

        Raises:
            ConfigError: ``session`` is no turn-mode :class:`EnvSession`.
        """
        ours = _session(session, model_mode=False)
        code = ours.wait_for_completion()
        trajectory = ours.env.trajectory
        result = HarnessRolloutResult(messages=list(ours.initial_messages()))
        events = trajectory.turns[-1].events if trajectory.turns else ()
        _tools_run(result, [e.to_dict() for e in events])
        reply = trajectory.turns[-1].response if trajectory.turns else ""
        result.messages.append({"role": "assistant", "content": reply})
        result.done = code == 0 and trajectory.outcome in ("done", "running")
        trace = trajectory.training_trace(ours.is_side)
        if trace["token_level"]:
            for turn in trace["turns"]:
                if not turn["metadata"]["side"]:
                    result.prompt_ids.extend(turn["prompt_token_ids"])
                    result.completion_ids.extend(turn["completion_token_ids"])
                    result.logprobs.extend(turn["per_token_logps"])
        result.metrics.update(
            outcome=trajectory.outcome, tool_calls=len(result.tool_trace), exit_code=code
        )
        return result


def _session(session: ResourceSession, *, model_mode: bool) -> EnvSession:
    if not isinstance(session, EnvSession):
        raise ConfigError(
            "ModelModeAdapter drives sessions of gym_harness.openenv.HarnessSessionFactory, "
            f"got {type(session).__name__}."
        )
    if session.model_mode != model_mode:
        want = "mode='model'" if model_mode else "mode='turns' (with capture=True)"
        verb = "run_white_box" if model_mode else "run_black_box"
        raise ConfigError(f"{verb} needs a session whose env has {want}.")
    return session


def check_step(step: ModelStepResult, index: int) -> None:
    """Refuse a ``ModelStepResult`` whose ids cannot be trained.

    Raises:
        BadModelStep: ``completion_ids`` and ``logprobs`` differ in length, completion
            ids come without prompt ids, an id is no int in ``[0, MAX_TOKEN_ID]``, or a
            logprob is no finite number <= 0.
    """
    where = f"model_step {index}"
    if len(step.completion_ids) != len(step.logprobs):
        raise BadModelStep(
            f"{where} returned {len(step.completion_ids)} completion_ids and "
            f"{len(step.logprobs)} logprobs: give one logprob per sampled id (or neither)."
        )
    if step.completion_ids and not step.prompt_ids:
        raise BadModelStep(
            f"{where} returned completion_ids without prompt_ids: a row needs the ids of "
            "the prompt they were sampled from."
        )
    for key in ("prompt_ids", "completion_ids"):
        for i, token in enumerate(getattr(step, key)):
            if not _token_id(token):
                raise BadModelStep(
                    f"{where}: {key}[{i}] is {token!r}, not a token id (an int in "
                    f"[0, {MAX_TOKEN_ID}]): return the engine's ids as they are."
                )
    for i, logprob in enumerate(step.logprobs):
        number = isinstance(logprob, int | float) and not isinstance(logprob, bool)
        if not number or not math.isfinite(logprob) or logprob > 1e-6:
            raise BadModelStep(
                f"{where}: logprobs[{i}] is {logprob!r}, not a log-probability (a finite "
                "number <= 0)."
            )


def _token_id(token: Any) -> bool:
    return isinstance(token, int) and not isinstance(token, bool) and 0 <= token <= MAX_TOKEN_ID


def _delivered(session: EnvSession, request_id: str, info: dict[str, Any]) -> bool:
    """Whether the harness got the answer to ``request_id`` (not after ``policy_timeout_s``)."""
    if info["error_type"] != "policy_timeout":
        return True
    # The episode ended: every call of it is in the trajectory, a late answer's without
    # its completion (the harness got an API error instead).
    for call in session.env.trajectory.calls:
        if call.request_id == request_id:
            return call.completion is not None
    return False


def _tool(spec: dict[str, Any]) -> Tool:
    """An observation's tool (OpenAI function schema) as OpenEnv's ``Tool``."""
    inner = spec.get("function")
    function: dict[str, Any] = inner if isinstance(inner, dict) else spec
    return Tool(
        name=str(function.get("name", "")),
        description=str(function.get("description") or ""),
        input_schema=dict(function.get("parameters") or {"type": "object", "properties": {}}),
    )


def _action(step: ModelStepResult, calls: list[Any]) -> str:
    """The env action of one model step: its message, and the engine's ids when given."""
    action: dict[str, Any] = {
        "content": step.response.content or "",
        "tool_calls": [{"id": c.id or None, "name": c.name, "arguments": c.args} for c in calls],
    }
    for key, values in (
        ("prompt_token_ids", step.prompt_ids),
        ("token_ids", step.completion_ids),
        ("logprobs", step.logprobs),
    ):
        if values:  # none given: the call stays text-level, nothing is made up
            action[key] = list(values)
    return json.dumps(action)


def _record(
    result: HarnessRolloutResult,
    index: int,
    step: ModelStepResult,
    calls: list[Any],
    info: dict[str, Any],
) -> None:
    """One model step into the rollout result's events, as ``MCPHarnessAdapter`` records one."""
    payload = {
        "turn": index,
        "content": step.response.content,
        "tool_calls": [{"id": c.id, "name": c.name, "arguments": dict(c.args)} for c in calls],
    }
    result.events.append(RolloutEvent(type="model_response", payload=payload))
    _tools_run(result, info["events"])


def _tools_run(result: HarnessRolloutResult, events: list[dict[str, Any]]) -> None:
    """The env tool calls the harness ran (its ``tool_call``/``tool_result`` events)."""
    asked: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        data = event.get("data") or {}
        name = str(data.get("name", ""))
        if event.get("type") == "tool_call":
            arguments = data.get("arguments")
            asked.setdefault(name, []).append(arguments if isinstance(arguments, dict) else {})
        elif event.get("type") == "tool_result":
            arguments = asked.get(name, [{}]).pop(0) if asked.get(name) else {}
            error = str(data.get("content")) if data.get("is_error") else None
            outcome = ToolResult(data=data.get("content"), error=error)
            result.tool_trace.append(ToolTraceEntry(name, arguments, outcome))
            payload = {"tool_name": name, "arguments": arguments, "done": False}
            result.events.append(RolloutEvent(type="tool_call", payload=payload))
