"""What the env calls to drive an episode (:class:`Mode`), and where every turn is recorded.

The env builds one mode when it is made and calls it: ``serve`` before each launch (model
mode's endpoint, whose address the harness is given), ``start`` once the harness runs,
``step`` per action, ``end`` when the episode ends. A mode drives the turn runner
(``turn.py``) and hands each finished turn to the :class:`Recorder`, which records it in
the trajectory before any user code (``reward_fn``) runs on it, then scores it.

Nothing here calls the env: what the recorder needs of it (whether it was closed, its
current ``reward_fn``) are callbacks the env hands over when it builds the mode.

Threads: the caller's thread only (the env's reset/step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_harness.outcome import Outcome
from gym_harness.records.events import HarnessEvent, TurnResult
from gym_harness.records.trajectory import RewardFn, Trajectory, TurnRecord
from gym_harness.turn import end_flags

if TYPE_CHECKING:
    from gym_harness.capture.proxy import ModelProxy
    from gym_harness.lifecycle import Liveness
    from gym_harness.turn import TurnRunner
    from gym_harness.usercode import TurnScorer

__all__ = ["Episode", "HeldCall", "Mode", "Opening", "Recorder", "Served", "Start"]

#: ``start(make)``: ``make()`` (a loopback server that runs once made), owned by the env
#: whole: its ``close()`` stops it.
Start = Callable[[Callable[[], Any]], Any]


@dataclass(frozen=True)
class Episode:
    """What a mode drives: one episode, made by the env at each ``reset``.

    Args:
        runner: The episode's turns; ``None`` when the harness did not start.
        startup_error: ``(outcome, error)`` of a failed start (``Outcome.OK`` if none).
        trajectory: The episode's record (turns, and in model mode calls, are added to it).
        deadline: When the episode's wall budget runs out (``time.monotonic()``), if set.
        task: The episode's task (as ``Task.to_dict()``), if any; ``reward_fn`` sees it.
        scored_dirs: The episode's workspace and its directory of hidden task files.
        proxy: The capture proxy, if the env runs one (a call still waiting upstream is
            cut into the turn that ends).
    """

    runner: TurnRunner | None
    startup_error: tuple[Outcome, str]
    trajectory: Trajectory
    deadline: float | None
    task: dict[str, Any] | None
    scored_dirs: tuple[Path, Path]
    proxy: ModelProxy | None = None


@dataclass(frozen=True)
class Opening:
    """What ``reset`` returns of a started episode.

    Attributes:
        observation: The first observation (the task's prompt; in model mode the first call).
        events: The startup's events, and in model mode those of the turn so far.
        error_type: The episode's outcome so far (``""``: none).
        error: Why, if ``error_type`` is set.
    """

    observation: str
    events: list[HarnessEvent]
    error_type: str
    error: str


@dataclass(frozen=True)
class Served:
    """Where the env serves the harness's model (model mode), for one episode's launch.

    Attributes:
        base_url: The model endpoint's origin.
        api_key: The episode's key (calls of earlier episodes are refused).
        policy_timeout_s: How long the policy may take to answer a call.
        liveness: The endpoint, a sign of life for the turn runner's idle deadline.
    """

    base_url: str
    api_key: str
    policy_timeout_s: float
    liveness: Liveness


@dataclass(frozen=True)
class HeldCall:
    """Where a model-mode episode stands between two steps: what a fork replays up to.

    Attributes:
        observation: The observation of the model call the policy holds (``None``: it
            holds none, as when the harness did not start or ended its turn).
        message: The user message of the turn under way.
        all_calls: Side calls are steps too (``model_calls="all"``).
    """

    observation: dict[str, Any] | None
    message: str
    all_calls: bool


class Recorder:
    """The one place a finished turn is recorded (both modes hand theirs here).

    The turn goes into the trajectory first, then ``reward_fn`` scores it: user code only
    ever runs on a turn already kept.

    Args:
        scorer: The env's ``TurnScorer`` (``reward_timeout_s``).
        reward_fn: ``reward_fn()``: the env's current ``reward_fn`` (users may swap it).
        check_open: ``check_open(turn)`` raises ``ResetNeeded`` when the env was closed
            (from another thread) during ``turn``.
    """

    def __init__(
        self,
        scorer: TurnScorer,
        reward_fn: Callable[[], RewardFn | None],
        check_open: Callable[[int], None],
    ) -> None:
        self.scorer = scorer
        self.reward_fn = reward_fn
        self.check_open = check_open

    def record(
        self,
        episode: Episode,
        turn: int,
        message: str,
        result: TurnResult,
        started_at: float,
        elapsed: float,
        truncated: bool = False,
    ) -> TurnRecord:
        """Record the turn in ``episode``'s trajectory, then score it; return its record.

        ``truncated``: a limit outside the turn cut it (``HarnessEnv.truncate``).

        Raises:
            ResetNeeded: The env was closed during the turn (nothing is recorded).
        """
        self.check_open(turn)
        if episode.proxy is not None:  # a call still waiting upstream is cut into the turn
            result = episode.proxy.close_turn(result)
        terminated, cut = end_flags(result)
        record = TurnRecord.of_turn(
            turn, message, result, started_at, elapsed, terminated, cut or truncated
        )
        episode.trajectory.turns.append(record)
        reward_fn = self.reward_fn()
        if reward_fn is not None and result.error_type != Outcome.INVALID_ACTION:
            # An invalid action scores 0.0, unscored.
            record = self.scorer.score(reward_fn, record, episode.scored_dirs, episode.task)
            episode.trajectory.turns[-1] = record
        return record


class Mode:
    """An episode's driver: what ``HarnessEnv`` calls, whichever its ``mode``.

    Args:
        recorder: Where each finished turn is recorded and scored.
    """

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        #: The episode under way (``None`` before the first ``start``).
        self.episode: Episode | None = None

    def serve(self, start: Start, proxy: ModelProxy | None) -> Served | None:
        """Before a launch: where the harness's model is served this episode, or ``None``
        (the harness calls its own, as in turn mode).

        Args:
            start: Starts and owns a server of the env's (the first time one is needed).
            proxy: The capture proxy (its token rotated for this episode), if any.
        """
        return None

    def start(self, episode: Episode, prompt: str, events: Sequence[HarnessEvent]) -> Opening:
        """The harness runs (or failed to start): begin ``episode`` with the task's
        ``prompt``; ``events`` are the startup's."""
        raise NotImplementedError

    def step(self, action: str) -> tuple[str, TurnRecord]:
        """One ``env.step(action)``: the observation, and the step's record."""
        raise NotImplementedError

    def end(self, trajectory: Trajectory) -> None:
        """The harness is stopped: end what still waits, recorded in ``trajectory``."""

    def truncate(self, policy_error: str = "") -> bool:
        """A step limit outside the env cut the episode: record the turn under way (turn
        mode: the last turn, again) as truncated and score it; ``False`` when there is
        nothing to cut. The env then stops the harness. ``policy_error`` (model mode):
        the policy failed to answer, and the turn is recorded as ``policy_error``."""
        return False

    def held(self) -> HeldCall | None:
        """Model mode: where the episode stands, for a fork (``None`` in turn mode)."""
        return None

    def rebase(self, trajectory: Trajectory) -> None:
        """The episode's record is now ``trajectory`` (a fork's child takes its parent's)."""
        if self.episode is not None:
            self.episode = replace(self.episode, trajectory=trajectory)

    @property
    def started(self) -> Episode:
        """The episode under way (the env steps only a started one)."""
        assert self.episode is not None, "step() before start()"
        return self.episode
