"""ModelModeAdapter: OpenEnv's ``HarnessAdapter`` that trains any harness white-box.

``run_white_box(model_step, session, limits)`` drives the session's harness (any CLI, or
the reference agent) in ``mode="model"``: each model call the harness makes is an
observation, handed to ``model_step(messages, tools, sampling)``; the returned
``ModelStepResult`` becomes the env's action (content, tool calls, and the token ids and
logprobs, which the harness never sees) and the harness runs on to its next call. The
rollout result is filled the way OpenEnv's own white-box adapter (``MCPHarnessAdapter``)
fills it: one ``model_response`` event per model step, each step's ``prompt_ids``,
``completion_ids`` and ``logprobs`` appended in order, the tool calls the harness ran in
``tool_trace``, and ``messages`` the conversation as the harness last sent it.

Limits: ``max_turns`` counts model steps; ``max_tool_calls_per_turn`` cuts each
completion's tool calls; ``max_total_tool_calls`` cuts the completion that would pass it
and ends the rollout after it (``metrics["truncated"]``). ``sampling`` is laid over the
harness's own sampling parameters.

``run_black_box(session, limits)`` runs a turn-mode session (the harness owns its loop;
capture records its model calls): one turn on the task's prompt.

Threads: the caller's (the session's env is driven synchronously).
"""

from __future__ import annotations

import json
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

from gym_harness.errors import ConfigError
from gym_harness.openenv.session import EnvSession

__all__ = ["ModelModeAdapter"]


class ModelModeAdapter(HarnessAdapter):
    """Drive a :class:`~gym_harness.openenv.EnvSession` with the trainer as its model.

    Example:
        >>> from openenv.core.harness import build_harness_rollout_func
        >>> rollout_func = build_harness_rollout_func(  # doctest: +SKIP
        ...     session_factory=HarnessSessionFactory("gym_harness/Codex-v0", mode="model"),
        ...     harness_adapter=ModelModeAdapter(),
        ...     model_step_builder=lambda trainer, session: my_model_step,
        ... )
    """

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
        if not observation.get("request_id") and not ours.env.trajectory.turns:
            # The turn ended (or the harness failed to start) before any model call: one
            # step records it as the env's outcome, scored like any turn.
            ours.observation, _, _, _, info = ours.env.step("")
            observation = json.loads(ours.observation)
        while steps < limits.max_turns and observation.get("request_id"):
            tools = [_tool(t) for t in observation.get("tools") or ()]
            sampling = {**(observation.get("sampling") or {}), **limits.sampling}
            step = model_step(observation["messages"], tools, sampling)
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
            _record(result, steps, step, calls, info)
            steps += 1
            if terminated or truncated or cut:
                result.done = bool(terminated) and not info["error_type"]
                break
        ours.exit_code = 1 if info["error_type"] else 0
        result.messages = list(observation.get("messages") or result.messages)
        result.metrics.update(
            turns=steps,
            tool_calls=len(result.tool_trace),
            outcome=ours.env.trajectory.outcome,
            error_type=info["error_type"],
        )
        return result

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
    """One model step into the rollout result, as ``MCPHarnessAdapter`` records one."""
    result.prompt_ids.extend(step.prompt_ids)
    result.completion_ids.extend(step.completion_ids)
    result.logprobs.extend(step.logprobs)
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
