"""What a fork starts from: the parent episode, and what its child env is made with.

``HarnessEnv.fork`` hands over a :class:`Parent`: the episode's record, its harness and
running session, what model mode holds of it (the call under way, the user message of the
turn: a :class:`~gym_harness.modes.base.HeldCall`), and a ``spawn`` that makes a new env
configured as the parent's from an :class:`Inherited` (:class:`Forkable`, the env's
interface here). A child is made with what it inherits and takes the parent's record through
the ``adopt`` callback ``spawn`` returns with it: nothing here writes an env's attributes.

Threads: the caller's thread only (the parent's, between two of its steps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gym_harness.records.trajectory import Trajectory

if TYPE_CHECKING:
    from gym_harness.harnesses.base import ForkOrigin, Harness, HarnessSession
    from gym_harness.modes.base import HeldCall

__all__ = ["Adopt", "Forkable", "Inherited", "Parent", "Spawn"]


class Forkable(Protocol):
    """The env a fork makes (a ``HarnessEnv``; this part never imports the env)."""

    @property
    def workspace(self) -> Path | None: ...

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[str, Any, bool, bool, dict[str, Any]]: ...

    def close(self) -> None: ...


#: ``adopt(took)``: the child's record becomes the parent's so far (:meth:`Inherited.record`),
#: its fork having taken ``took`` seconds.
Adopt = Callable[[float], None]


@dataclass(frozen=True)
class Inherited:
    """What a fork's child env is made with.

    Args:
        user_fn: The child's ``user_fn`` (model mode: the parent's later user messages,
            then the parent's own).
        parent: The parent's record so far, which the child's becomes (:meth:`record`).
        step: How many steps of the parent the child stands after.
        origin: Turn mode: the parent's session, which the child's first episode resumes
            (its launch is ``Harness.forked(origin)``); its later episodes are its own.
    """

    user_fn: Callable[[Trajectory], str | None] | None
    parent: Trajectory
    step: int
    origin: ForkOrigin | None = None

    def record(self, own: Trajectory, took: float) -> Trajectory:
        """The child's record: a copy of the parent's so far, under the child's own episode
        id, sandbox and fork time (``reset_s``: ``took``), with ``forked_from`` naming the
        parent episode and its ``step`` count."""
        before = self.parent
        return replace(
            before,
            episode_id=own.episode_id,
            startup_events=list(before.startup_events),
            turns=list(before.turns),
            calls=list(before.calls),
            reset_s=took,
            sandbox=own.sandbox,
            forked_from={"episode_id": before.episode_id, "step": self.step},
        )


#: ``spawn(inherited)``: a new env configured as the parent's, made with ``inherited`` (it
#: starts nothing until its ``reset``), and its ``adopt``.
Spawn = Callable[[Inherited], "tuple[Forkable, Adopt]"]


@dataclass(frozen=True)
class Parent:
    """What the env hands over of the running episode it forks.

    Args:
        trajectory: The episode so far (its turns, and in model mode its calls).
        spawn: Makes the child (:data:`Spawn`).
        harness: The parent's harness (its ``fork_session``, its ``replay_noise``).
        session: The running harness's session, if it started.
        max_fork_bytes: The most bytes of workspace and home a turn-mode fork copies.
        held: Model mode: the call the policy holds and the turn's user message (``None``
            in turn mode).
        user_fn: The env's ``user_fn``, which the child goes on with.
    """

    trajectory: Trajectory
    spawn: Spawn
    harness: Harness
    session: HarnessSession | None
    max_fork_bytes: int
    held: HeldCall | None
    user_fn: Callable[[Trajectory], str | None] | None

    @property
    def options(self) -> dict[str, Any]:
        """The ``reset`` options that give the child the parent's task."""
        task = self.trajectory.task
        return {} if task is None else {"task": dict(task)}
