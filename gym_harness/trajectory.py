"""The record of an episode: every turn, every event, the reward context.

``HarnessEnv.trajectory`` is a ``Trajectory``; ``to_dict()`` is what
``gym-harness rollout`` writes, one JSON line per episode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gym_harness.events import EventType, HarnessEvent

__all__ = ["RewardContext", "RewardFn", "Trajectory", "TurnRecord"]


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
        truncated: The turn was cut short (a timeout).
        task: The episode's task as a dict, or ``None``.
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

    @property
    def tool_calls(self) -> int:
        """How many tool calls the harness made in this turn."""
        return sum(1 for e in self.events if e.type is EventType.TOOL_CALL)

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
        turns: One record per ``step``.
        reset_s: Seconds ``reset`` took.
    """

    episode_id: str
    harness: str
    task: Mapping[str, Any] | None = None
    startup_events: list[HarnessEvent] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    reset_s: float = 0.0

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

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (one rollout record)."""
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
        }

    def _repr_html_(self) -> str:
        """The episode as HTML, for Jupyter (see ``gym_harness.display``)."""
        from gym_harness.display import trajectory_html

        return trajectory_html(self)

    def transcript(self) -> str:
        """The episode as plain text, one block per turn (``render_mode="ansi"``)."""
        lines = [f"episode {self.episode_id} ({self.harness})"]
        if self.task is not None:
            lines.append(f"task {self.task.get('id')}: {self.task.get('prompt', '')}")
        for t in self.turns:
            lines.append(f"--- turn {t.turn} ({t.elapsed_s:.3f}s, reward {t.reward:g})")
            lines.append(f"user: {t.message}")
            for e in t.events:
                if e.type is EventType.TOOL_CALL:
                    lines.append(f"  tool call {e.data.get('name')} {e.data.get('arguments')}")
                elif e.type is EventType.TOOL_RESULT:
                    lines.append(f"  tool result {e.data.get('name')}: {e.data.get('content')}")
            lines.append(f"harness: {t.response}")
            if t.error_type:
                lines.append(f"[{t.error_type}] {t.error}")
        return "\n".join(lines) + "\n"
