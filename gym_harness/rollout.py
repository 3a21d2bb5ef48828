"""One rollout episode as one JSON-ready record (what ``gym-harness rollout`` writes).

``run_episode`` is shared by the local rollout (``gym_harness.cli``) and the Ray
rollout (``gym_harness.ray``), so both write the same record for the same seed:
the trajectory's ``to_dict()`` plus ``env_id``, ``episode_index``, ``seed``,
``messages`` (user/assistant pairs), ``error_type`` and ``timings``.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium

__all__ = ["run_episode"]

_ROLES = (("user", "message"), ("assistant", "response"))


def run_episode(
    env: gymnasium.Env[str, str],
    task: dict[str, Any],
    *,
    env_id: str,
    seed: int,
    index: int,
    max_turns: int,
    follow_up: str,
) -> dict[str, Any]:
    """Run one episode of ``task``: the prompt, then ``follow_up`` until it ends.

    Args:
        env: A harness env (``gymnasium.make`` of a gym_harness id, wrappers allowed).
        task: The task as a dict (``Task.to_dict()``), passed as ``options["task"]``.
        env_id: The env id written into the record.
        seed: The seed of the episode's reset.
        index: Which episode of this task it is (0 .. n-1).
        max_turns: At most this many turns; the rollout then stops the episode.
        follow_up: The message of every turn after the first.

    Returns:
        The rollout record (JSON-ready). ``outcome`` is ``"max_turns"`` when the
        rollout, not the harness, ended the episode.
    """
    started = time.monotonic()
    prompt, _ = env.reset(seed=seed, options={"task": task})
    message = prompt
    for _ in range(max_turns):
        _, _, terminated, truncated, _ = env.step(message)
        if terminated or truncated:
            break
        message = follow_up
    record: dict[str, Any] = env.unwrapped.trajectory.to_dict()  # type: ignore[attr-defined]
    turns = record["turns"]
    if record["outcome"] == "running":  # the rollout stopped it, not the harness
        record["outcome"] = "max_turns"
    record.update(
        env_id=env_id,
        episode_index=index,
        seed=seed,
        messages=[{"role": r, "content": t[k]} for t in turns for r, k in _ROLES],
        error_type=turns[-1]["error_type"] if turns else "",
        timings={
            "reset_s": record["reset_s"],
            "turns_s": [t["elapsed_s"] for t in turns],
            "total_s": time.monotonic() - started,
        },
    )
    return record
