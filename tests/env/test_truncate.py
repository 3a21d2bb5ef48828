"""``HarnessEnv.truncate()``: an episode cut by a step limit outside the env is scored.

On the reference agent, a real process: in model mode the turn under way (its call held
by the policy) is recorded as truncated and scored; in turn mode the last turn is scored
again as truncated; ``reward_fn`` sees ``ctx.truncated`` and ``ctx.cause``; the harness is
stopped; an episode that already ended is left as it is.
"""

from __future__ import annotations

import json

import pytest
from gymnasium.error import ResetNeeded
from support.cli import Calls

from gym_harness import HarnessEnv, RewardContext


class Scores:
    """A ``reward_fn`` that keeps what it saw (truncated, cause, response)."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, str, str]] = []

    def __call__(self, ctx: RewardContext) -> float:
        self.seen.append((ctx.truncated, ctx.cause, ctx.response))
        return 0.5 if ctx.truncated else 1.0


@pytest.mark.timeout(240)
def test_model_mode_records_and_scores_the_turn_under_way() -> None:
    scores = Scores()
    env = HarnessEnv("reference", mode="model", tools=Calls().tools(), reward_fn=scores)
    try:
        with pytest.raises(ResetNeeded, match="truncate"):
            env.truncate()
        obs, _ = env.reset(options={"task": {"id": "t", "prompt": "add 20 and 22"}})
        assert json.loads(obs)["request_id"]  # the policy holds the first call
        assert env.truncate() == 0.5
        (turn,) = env.trajectory.turns
        assert (turn.truncated, turn.terminated, turn.error_type) == (True, False, "")
        assert env.trajectory.outcome == "truncated" and scores.seen == [(True, "max_steps", "")]
        assert env.process is not None and not env.process.is_alive()
        assert env.truncate() == 0.5 and len(scores.seen) == 1  # ended: left as it is
        with pytest.raises(ResetNeeded):
            env.step("hello")
    finally:
        env.close()
    with pytest.raises(ResetNeeded, match="truncate"):
        env.truncate()


@pytest.mark.timeout(240)
def test_turn_mode_scores_the_last_turn_again_as_truncated() -> None:
    scores = Scores()
    env = HarnessEnv("reference", reward_fn=scores)
    try:
        env.reset()
        _, reward, terminated, truncated, _ = env.step("hello")
        assert (reward, terminated, truncated) == (1.0, False, False)
        assert env.truncate() == 0.5  # its reward replaced, not added
        (turn,) = env.trajectory.turns
        assert turn.truncated and turn.reward == 0.5 and turn.response == scores.seen[0][2]
        assert [s[:2] for s in scores.seen] == [(False, ""), (True, "max_steps")]
        assert env.trajectory.outcome == "truncated"
        env.reset()  # a new episode as usual
        assert env.truncate() == 0.0 and env.trajectory.turns == []  # no turn yet: nothing
    finally:
        env.close()
