"""What a fork starts from: the parent episode, and the record its child starts with.

``HarnessEnv.fork`` hands over a :class:`Parent`: the episode's record, what model mode
holds of it (the call under way, the user message of the turn), and a ``spawn`` that
makes a new env configured as the parent's (:class:`Forkable`, the env's interface here).

Threads: the caller's thread only (the parent's, between two of its steps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gym_harness.trajectory import Trajectory

if TYPE_CHECKING:
    from gym_harness.config import HarnessConfig
    from gym_harness.harnesses.base import Harness
    from gym_harness.modes.model import ModelTurns
    from gym_harness.turn import TurnRunner

__all__ = ["Forkable", "Parent", "child_trajectory"]


class Forkable(Protocol):
    """The env a fork makes (a ``HarnessEnv``; this part never imports the env)."""

    trajectory: Trajectory
    harness: Harness
    config: HarnessConfig

    @property
    def workspace(self) -> Path | None: ...

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[str, Any, bool, bool, dict[str, Any]]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Parent:
    """What the env hands over of the running episode it forks.

    Args:
        trajectory: The episode so far (its turns, and in model mode its calls).
        spawn: ``spawn(user_fn=...)`` makes the child: a new env configured as the
            parent's, with that ``user_fn``; it starts nothing until its ``reset``.
        runner: The episode's turn runner (its ``session`` is the running harness's).
        model: Model mode's state (the call the policy holds, the turn's user message).
        user_fn: The env's ``user_fn``, which the child goes on with.
    """

    trajectory: Trajectory
    spawn: Callable[..., Forkable]
    runner: TurnRunner | None
    model: ModelTurns | None
    user_fn: Callable[[Trajectory], str | None] | None

    @property
    def options(self) -> dict[str, Any]:
        """The ``reset`` options that give the child the parent's task."""
        task = self.trajectory.task
        return {} if task is None else {"task": dict(task)}


def child_trajectory(parent: Parent, own: Trajectory, step: int, took: float) -> Trajectory:
    """The child's record: a copy of the parent's so far, under the child's own episode id,
    sandbox and fork time (``reset_s``: ``took``), with ``forked_from`` naming the parent
    episode and its ``step`` count."""
    before = parent.trajectory
    return replace(
        before,
        episode_id=own.episode_id,
        startup_events=list(before.startup_events),
        turns=list(before.turns),
        calls=list(before.calls),
        reset_s=took,
        sandbox=own.sandbox,
        forked_from={"episode_id": before.episode_id, "step": step},
    )
