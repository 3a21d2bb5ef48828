"""Turn mode (``mode="turns"``, the default): a step is one user turn.

``step(action)`` sends the action as the user's message, runs the turn to its end
(``TurnRunner.run``) and hands it to the :class:`~gym_harness.modes.base.Recorder`;
the turn's reply is the observation. The harness calls its own model: nothing is served.

Threads: the caller's thread only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from gym_harness.modes.base import Episode, Mode, Opening
from gym_harness.records.events import HarnessEvent, TurnResult
from gym_harness.records.trajectory import TurnRecord

__all__ = ["TurnMode"]


class TurnMode(Mode):
    """The driver of a turn-mode episode."""

    def start(self, episode: Episode, prompt: str, events: Sequence[HarnessEvent]) -> Opening:
        """The observation is the task's prompt; the outcome is the startup's."""
        self.episode = episode
        outcome, error = episode.startup_error
        return Opening(prompt, list(events), str(outcome), error)

    def step(self, action: str) -> tuple[str, TurnRecord]:
        """Send ``action`` as the user's message and run the turn to its end."""
        episode = self.started
        turn = len(episode.trajectory.turns) + 1
        started_at, start = time.time(), time.monotonic()
        if episode.startup_error[0] or episode.runner is None:
            outcome, error = episode.startup_error
            result = TurnResult(error_type=outcome, error=error)
        else:
            result = episode.runner.run(action, episode_deadline=episode.deadline)
        elapsed = time.monotonic() - start
        record = self.recorder.record(episode, turn, action, result, started_at, elapsed)
        return record.response, record

    def truncate(self, policy_error: str = "") -> bool:
        """The last turn, scored again as truncated (its reward replaced), if it ended
        neither terminated nor truncated (no policy answers turns: ``policy_error`` is
        not used)."""
        turns = self.started.trajectory.turns
        if not turns or turns[-1].terminated or turns[-1].truncated:
            return False
        last = turns.pop()
        result = TurnResult(
            last.response, last.events, error_type=last.error_type, error=last.error
        )
        episode = replace(self.started, proxy=None)  # its exchanges are in the turn already
        self.recorder.record(
            episode, last.turn, last.message, result, last.started_at, last.elapsed_s, True
        )
        return True
