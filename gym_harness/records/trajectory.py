"""What leaves an episode: the info of each step, and the record of the whole.

``StepInfo`` is the info dict of every ``reset`` and ``step``
(``Trajectory.step_info`` builds one). ``HarnessEnv.of(env).trajectory`` is a ``Trajectory``;
``Trajectory.to_record()`` is the one record ``gym-harness rollout`` writes per
episode, locally or on Ray (a lost Ray worker's record included).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypedDict

from gym_harness.outcome import Outcome
from gym_harness.records.calls import ModelCall, assistant_message
from gym_harness.records.events import EventType, HarnessEvent, TurnResult

__all__ = ["RewardContext", "RewardFn", "StepInfo", "Trajectory", "TurnRecord", "event_line"]

#: The messages of a record: each turn's user message, then its reply.
_ROLES = (("user", "message"), ("assistant", "response"))


class StepInfo(TypedDict):
    """The info dict of ``reset`` and ``step``: the same keys and types on every call.

    Vector envs stack infos key by key, so no key is ever missing or of another type.

    Keys:
        turn: The turn number, from 1 (0 at ``reset``).
        error_type: ``""``, or the ``Outcome`` value of a failed turn (or start).
        error: What went wrong, in words (``""`` when nothing did).
        events: The turn's events (at ``reset``: the harness's startup events), as
            ``HarnessEvent.to_dict()`` dicts, model calls included under ``capture``.
        tool_calls: How many env tool calls the harness made in the turn.
        elapsed_s: Seconds the turn took (0.0 at ``reset``).
        exit_code: The harness's own exit status when it exited by itself or was killed
            by someone else (``-N`` for signal N); 0 while it runs or when the env stopped
            it; -1 when unknown (its worker was lost: a vector worker, a Ray actor).
        stderr_tail: The last lines of the harness's stderr.
        episode_id: The episode's id (``Trajectory.episode_id``).
        task_id: The episode's task id, ``""`` without a task.
    """

    turn: int
    error_type: str
    error: str
    events: list[dict[str, Any]]
    tool_calls: int
    elapsed_s: float
    exit_code: int
    stderr_tail: str
    episode_id: str
    task_id: str


@dataclass(frozen=True)
class RewardContext:
    """What a reward function sees after each turn (in the env process only).

    Args:
        message: The action of the turn (the user message).
        response: The harness's reply.
        events: Every event of the turn.
        workspace: The episode's workspace directory.
        turn: The turn number, from 1.
        error_type: ``""`` or the outcome name of a failed turn.
        terminated: The turn ends the episode (done, or a fault).
        truncated: The turn was cut short: by a timeout, or by a step limit
            (``HarnessEnv.truncate``: gymnasium's ``TimeLimit``, a rollout's or a
            trainer's step budget). A cut episode is scored like any other.
        task: The episode's task as a dict, or ``None``.
        hidden_dir: The directory holding the task's ``hidden_files`` (outside the
            workspace; a confined harness cannot read it), or ``None``.
        cause: Why the episode was cut: the timeout's outcome (``"turn_timeout"``,
            ``"idle_timeout"``, ``"episode_timeout"``, ``"policy_timeout"``),
            ``"policy_error"`` when the policy could not answer (its model server failed),
            or ``"max_steps"`` for a step limit; ``""`` when it was not cut.
    """

    message: str
    response: str
    events: tuple[HarnessEvent, ...]
    workspace: Path
    turn: int
    error_type: str
    terminated: bool
    truncated: bool
    task: Mapping[str, Any] | None = None
    hidden_dir: Path | None = None
    cause: str = ""


class RewardFn(Protocol):
    """A callable that scores a turn: ``reward_fn(ctx) -> float``."""

    def __call__(self, ctx: RewardContext, /) -> float: ...


@dataclass(frozen=True)
class TurnRecord:
    """One turn of an episode."""

    turn: int
    message: str
    response: str
    events: tuple[HarnessEvent, ...]
    reward: float
    terminated: bool
    truncated: bool
    error_type: str
    error: str
    started_at: float
    elapsed_s: float

    @classmethod
    def of_turn(
        cls,
        turn: int,
        message: str,
        result: TurnResult,
        started_at: float,
        elapsed_s: float,
        terminated: bool,
        truncated: bool,
    ) -> TurnRecord:
        """The record of a finished turn, not scored yet (reward 0.0; see ``scored``)."""
        return cls(
            turn=turn,
            message=message,
            response=result.response,
            events=result.events,
            reward=0.0,
            terminated=terminated,
            truncated=truncated,
            error_type=str(result.error_type),
            error=result.error,
            started_at=started_at,
            elapsed_s=elapsed_s,
        )

    @property
    def tool_calls(self) -> int:
        """How many tool calls the harness made in this turn."""
        return sum(1 for e in self.events if e.type is EventType.TOOL_CALL)

    def reward_context(
        self, workspace: Path, hidden_dir: Path | None, task: Mapping[str, Any] | None
    ) -> RewardContext:
        """What the reward function sees of this turn."""
        return RewardContext(
            message=self.message,
            response=self.response,
            events=self.events,
            workspace=workspace,
            turn=self.turn,
            error_type=self.error_type,
            terminated=self.terminated,
            truncated=self.truncated,
            task=task,
            hidden_dir=hidden_dir,
            cause=(self.error_type or "max_steps") if self.truncated else "",
        )

    def scored(self, reward: float, outcome: Outcome, why: str) -> TurnRecord:
        """This turn with its reward, or with the reward function's failure (``why``).

        A failed scoring (``outcome`` ``REWARD_ERROR`` or ``REWARD_TIMEOUT``) becomes the
        turn's outcome, unless the turn already had a fault of its own: that one stays,
        and ``why`` is added to its ``error``.
        """
        if outcome is Outcome.OK:
            return replace(self, reward=reward)
        if self.error_type:
            return replace(self, error=f"{self.error}; {why}")
        return replace(
            self,
            error_type=outcome.value,
            error=why,
            terminated=outcome.terminates,
            truncated=outcome.truncates,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "turn": self.turn,
            "message": self.message,
            "response": self.response,
            "events": [e.to_dict() for e in self.events],
            "reward": self.reward,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "error_type": self.error_type,
            "error": self.error,
            "started_at": self.started_at,
            "elapsed_s": self.elapsed_s,
        }


@dataclass
class Trajectory:
    """Everything that happened in one episode, in order.

    Args:
        episode_id: The episode's id (also ``info["episode_id"]``).
        harness: The harness's registered name.
        task: The episode's task as a dict, or ``None``.
        startup_events: Events seen while the harness started.
        turns: One record per ``step`` (per user turn in model mode).
        reset_s: Seconds ``reset`` took.
        calls: In model mode, every model call of the episode (``ModelCall``), in order.
        sandbox: The protections the episode's harness ran under: ``{"tier", "enforced":
            [layer, ...], "missing": {layer: why}}`` (README, "Confinement").
        forked_from: A forked episode's parent: ``{"episode_id", "step"}`` (the parent's
            steps when it was forked; README, "Forking"); ``None`` for an episode of its own.
    """

    episode_id: str
    harness: str
    task: Mapping[str, Any] | None = None
    startup_events: list[HarnessEvent] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    reset_s: float = 0.0
    calls: list[ModelCall] = field(default_factory=list)
    sandbox: Mapping[str, Any] = field(default_factory=dict)
    forked_from: Mapping[str, Any] | None = None

    @property
    def events(self) -> list[HarnessEvent]:
        """Every event of the episode, startup first."""
        out = list(self.startup_events)
        for record in self.turns:
            out.extend(record.events)
        return out

    @property
    def total_reward(self) -> float:
        """Sum of the turns' rewards."""
        return sum(record.reward for record in self.turns)

    @property
    def outcome(self) -> str:
        """``"running"``, ``"done"``, ``"truncated"``, or the last turn's error type."""
        if not self.turns:
            return "running"
        last = self.turns[-1]
        if last.error_type:
            return last.error_type
        if last.terminated:
            return "done"
        return "truncated" if last.truncated else "running"

    def step_info(
        self,
        turn: int,
        error_type: str,
        error: str,
        events: Sequence[HarnessEvent],
        elapsed_s: float,
        exit_code: int,
        stderr_tail: str,
    ) -> StepInfo:
        """The ``StepInfo`` of one reset (turn 0, the startup events) or step of this episode."""
        return {
            "turn": turn,
            "error_type": str(error_type),
            "error": error,
            "events": [e.to_dict() for e in events],
            "tool_calls": sum(1 for e in events if e.type is EventType.TOOL_CALL),
            "elapsed_s": float(elapsed_s),
            "exit_code": exit_code,
            "stderr_tail": stderr_tail,
            "episode_id": self.episode_id,
            "task_id": "" if self.task is None else str(self.task.get("id", "")),
        }

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (the core of a rollout record; see ``to_record``)."""
        return {
            "episode_id": self.episode_id,
            "harness": self.harness,
            "task_id": None if self.task is None else self.task.get("id"),
            "task": None if self.task is None else dict(self.task),
            "startup_events": [e.to_dict() for e in self.startup_events],
            "turns": [t.to_dict() for t in self.turns],
            "reward": self.total_reward,
            "outcome": self.outcome,
            "reset_s": self.reset_s,
            "sandbox": dict(self.sandbox),
            "forked_from": None if self.forked_from is None else dict(self.forked_from),
        }

    def to_record(
        self,
        *,
        env_id: str,
        index: int,
        seed: int,
        total_s: float,
        fault: Outcome | None = None,
        error: str = "",
        group_id: str | None = None,
    ) -> dict[str, Any]:
        """Return the rollout record of the episode (JSON-ready; one line of the output).

        The keys of ``to_dict()``, then ``env_id``, ``episode_index``, ``seed``,
        ``messages`` (each turn's user message and reply, as chat messages),
        ``error_type`` and ``error`` (the last turn's, ``""`` if none), ``timings``
        (``reset_s``, ``turns_s``, ``total_s``), and ``group_id``, ``parent_id`` and
        ``fork_step`` (a grouped rollout's fork: its group, ``forked_from``'s episode id
        and step; ``None`` otherwise). An episode still running is recorded
        with ``outcome`` ``"max_turns"``: the rollout, not the harness, stopped it.

        Args:
            env_id: The env id the episode ran on.
            index: Which episode of its task it is (0 .. n-1).
            seed: The seed of the episode's reset.
            total_s: Seconds the whole episode took.
            fault: An outcome that ended the episode outside its turns
                (``Outcome.WORKER_LOST``: the worker running it died); it becomes the
                record's ``outcome`` and ``error_type``.
            error: With ``fault``, what happened.
            group_id: The group of a grouped rollout's fork (its prefix's episode id).

        Returns:
            The record.
        """
        record = self.to_dict()
        turns = record["turns"]
        error_type = turns[-1]["error_type"] if turns else ""
        if fault is not None:
            record["outcome"] = error_type = fault.value
        else:
            error = turns[-1]["error"] if turns else ""
            if record["outcome"] == "running":  # the rollout stopped it, not the harness
                record["outcome"] = "max_turns"
        record.update(
            env_id=env_id,
            episode_index=index,
            seed=seed,
            rollout_id=f"{self.episode_id}-{index}",
            messages=[{"role": r, "content": t[k]} for t in turns for r, k in _ROLES],
            error_type=error_type,
            error=error,
            timings={
                "reset_s": record["reset_s"],
                "turns_s": [t["elapsed_s"] for t in turns],
                "total_s": total_s,
            },
            group_id=group_id,
            parent_id=None if self.forked_from is None else self.forked_from["episode_id"],
            fork_step=None if self.forked_from is None else self.forked_from["step"],
        )
        if self.calls:  # model mode: the message-level shape trainers consume
            record["calls"] = [call_record(call) for call in self.calls]
            if final := self.final_messages():
                record["messages"] = final
        return record

    def final_messages(self) -> list[dict[str, Any]]:
        """Model mode: the last main call's messages with its answer (``[]`` if none)."""
        for call in reversed(self.calls):
            if not call.side and call.observation is not None and call.completion is not None:
                return [*call.observation["messages"], assistant_message(call.completion)]
        return []

    def training_trace(
        self, is_side: Callable[[Mapping[str, Any]], bool] | None = None
    ) -> dict[str, Any]:
        """The episode's token-level training trace, a plain dict (``records/training.py``).

        One entry per main model call with the engine's own ids: in model mode from the
        actions (``token_ids``, ``logprobs``, ``prompt_token_ids``), in capture mode from
        the upstream's answers (``capture_tokens=True``). A call without them is listed
        as text-level and the trace says ``token_level: False``; nothing is re-tokenised.
        ``gym_harness.openenv.training_trace`` validates it as OpenEnv's ``TrainingTrace``.

        Args:
            is_side: Tells a captured side call from a main one (default: its request
                names the side model); model mode's calls say so themselves.
        """
        from gym_harness.records.training import training_trace

        calls = [call_record(call) for call in self.calls]
        events = [e.to_dict() for e in self.events]
        return training_trace(calls, events, is_side=is_side, episode_id=self.episode_id)

    def _repr_html_(self) -> str:
        """The episode as HTML, for Jupyter (see ``gym_harness.records.display``)."""
        from gym_harness.records.display import trajectory_html

        return trajectory_html(self.to_dict())

    def transcript(self) -> str:
        """The episode as plain text, one block per turn (``render_mode="ansi"``).

        The task's prompt is shown once: as the first turn's user message, or in the
        header while no turn has sent it.
        """
        lines = [self.header()]
        for t in self.turns:
            lines.append(f"--- turn {t.turn} ({t.elapsed_s:.3f}s, reward {t.reward:g})")
            lines.append(f"user: {t.message}")
            lines.extend(line for e in t.events if (line := event_line(e)) is not None)
            lines.append(f"harness: {t.response}")
            if t.error_type:
                lines.append(f"[{t.error_type}] {t.error}")
        return "\n".join(lines) + "\n"

    def header(self) -> str:
        """The transcript's first line: the episode, the harness and the task."""
        line = f"episode {self.episode_id} ({self.harness})"
        if self.task is None:
            return line
        line += f", task {self.task.get('id')}"
        prompt = str(self.task.get("prompt", ""))
        if not (self.turns and self.turns[0].message == prompt):
            line += f": {prompt}"
        return line


def event_line(event: HarnessEvent) -> str | None:
    """A tool call or tool result as one transcript line; ``None`` for other events."""
    if event.type is EventType.TOOL_CALL:
        return f"  tool call {event.data.get('name')} {event.data.get('arguments')}"
    if event.type is EventType.TOOL_RESULT:
        return f"  tool result {event.data.get('name')}: {event.data.get('content')}"
    return None


def call_record(call: ModelCall) -> dict[str, Any]:
    """One model call as a rollout record's ``calls`` entry: what the policy saw (messages,
    tools, whether the request ``extends`` the previous call and where its new messages
    start), what it answered (``completion``: content, tool calls, stop reason), and the
    ``token_ids``/``logprobs``/``prompt_token_ids``/``usage``/``policy_version`` its action
    carried."""
    seen = call.observation or {}
    completion = call.to_dict()["completion"]
    return {
        "request_id": call.request_id,
        "api": call.api,
        "side": call.side,
        "messages": seen.get("messages"),
        "tools": seen.get("tools"),
        "sampling": seen.get("sampling"),
        "extends": bool(seen.get("extends")),
        "new_from": int(seen.get("new_from") or 0),
        "completion": completion,
        "token_ids": call.token_ids,
        "logprobs": call.logprobs,
        "prompt_token_ids": call.prompt_token_ids,
        "usage": call.usage,
        "policy_version": call.policy_version,
        "error": call.error,
        "retries": call.retries,
        "truncated": call.truncated,
    }
