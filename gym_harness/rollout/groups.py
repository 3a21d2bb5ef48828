"""Grouped rollouts: one prefix per task, forked into a group (``--group G --fork-at K``).

``run_task`` is what a rollout worker (local or a Ray actor) runs for one episode of
the plan: ``run_episode``, or with ``group`` set, ``run_group``: the task runs once to
step ``fork_at`` (user turns in turn mode, model calls answered in model mode), then
``HarnessEnv.fork`` makes ``group`` children that go on under the policy (model mode)
or the follow-up messages (turn mode), each recorded on its own. The records share a
``group_id`` and name their ``parent_id`` and ``fork_step``. A fork that fails (the
harness cannot fork, the replay diverged, the prefix ended the episode) is a record
with ``outcome`` and ``error_type`` ``"fork_failed"`` and the cause in ``error``, never an
exception (any ``Exception`` of ``fork``: ``ForkUnsupported``, ``ForkDiverged``,
``ForkFailed``, an ``OSError``). A prefix whose episode ends before ``fork_at`` is one
record of that finished episode (its outcome and reward as they were), and the group's
other members are records with ``outcome`` ``"not_forked"`` saying why.

Threads: the calling worker's thread only.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium

from gym_harness.env import HarnessEnv
from gym_harness.errors import ConfigError, PolicyError
from gym_harness.rollout.episode import (
    DEFAULT_MAX_STEPS,
    Policy,
    answer_calls,
    load_policy,
    policy_action,
    run_episode,
)

__all__ = ["FORK_FAILED", "NOT_FORKED", "group_settings", "run_group", "run_task"]

#: A grouped record's outcome (and error type) when its fork failed.
FORK_FAILED = "fork_failed"
#: A grouped record's outcome (and error type) when the prefix ended before the fork step.
NOT_FORKED = "not_forked"


def group_settings(group: int | None, fork_at: int) -> dict[str, int]:
    """The worker settings of a grouped rollout (``{}`` without ``group``), checked.

    Raises:
        ConfigError: A group size below 1, or a fork step below 0.
    """
    if group is not None and (type(group) is not int or group < 1):
        raise ConfigError(f"group must be a positive int (episodes per prefix), got {group!r}.")
    if type(fork_at) is not int or fork_at < 0:
        raise ConfigError(f"fork_at must be an int >= 0 (steps before the fork), got {fork_at!r}.")
    return {} if group is None else {"group": group, "fork_at": fork_at}


def run_task(
    env: gymnasium.Env[str, str],
    task: dict[str, Any],
    *,
    group: int | None = None,
    fork_at: int = 0,
    keep_task: bool = True,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """One episode of a rollout's plan: ``[run_episode's record]``, or with ``group`` the
    records of ``run_group`` (same keywords); without ``keep_task``, their ``task`` is
    ``None`` (a Ray actor's: the driver puts its own copy back)."""
    if group is None:
        records = [run_episode(env, task, **kwargs)]
    else:
        records = run_group(env, task, group=group, fork_at=fork_at, **kwargs)
    if not keep_task:
        for record in records:
            record["task"] = None
    return records


def run_group(
    env: gymnasium.Env[str, str],
    task: dict[str, Any],
    *,
    env_id: str,
    seed: int,
    index: int,
    max_turns: int,
    follow_up: str,
    group: int,
    fork_at: int,
    policy: Policy | str | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> list[dict[str, Any]]:
    """Run ``task`` to step ``fork_at``, fork it ``group`` times, run each child to its end.

    Args:
        env, task, env_id, seed, max_turns, follow_up, policy, max_steps: As for
            ``run_episode``; a child's turns and steps count the prefix's.
        index: Which group of this task it is: child ``g`` is ``episode_index``
            ``index * group + g``.
        group: Children per prefix.
        fork_at: Steps before the fork (turns in turn mode, answers in model mode).

    Returns:
        ``group`` records, each with ``group_id`` (the prefix's episode id),
        ``parent_id`` and ``fork_step``; when the prefix ended before ``fork_at``, the
        finished episode's record and ``group - 1`` ``"not_forked"`` records.
    """
    started = time.monotonic()
    parent = HarnessEnv.of(env)
    answer = None if policy is None else load_policy(policy)
    obs, _ = env.reset(seed=seed, options={"task": task})
    message = obs
    for step in range(fork_at):
        try:
            action = message if answer is None else policy_action(answer, obs)
        except PolicyError as exc:  # the prefix ends as policy_error; nothing to fork
            parent.truncate(policy_error=str(exc) or type(exc).__name__)
            return _ended(parent, step, env_id, seed, index, group, fork_at, started)
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return _ended(parent, step + 1, env_id, seed, index, group, fork_at, started)
        message = follow_up
    group_id = parent.trajectory.episode_id
    records = []
    for member in range(group):
        ids: dict[str, Any] = {"env_id": env_id, "index": index * group + member, "seed": seed}
        began = time.monotonic()
        try:
            child, child_obs, _ = parent.fork()
        except Exception as exc:  # ForkUnsupported, ForkDiverged, ForkFailed, OSError ...
            record = parent.trajectory.to_record(**ids, total_s=0.0, group_id=group_id)
            why = f"{type(exc).__name__}: {exc}"
            record.update(outcome=FORK_FAILED, error_type=FORK_FAILED, error=why)
            record.update(parent_id=group_id, fork_step=fork_at)
            records.append(record)
            continue
        try:
            if answer is not None:
                answer_calls(child, child_obs, answer, max(max_steps - fork_at, 0))
            else:
                for _ in range(max(max_turns - len(child.trajectory.turns), 0)):
                    _, _, terminated, truncated, _ = child.step(follow_up)
                    if terminated or truncated:
                        break
            total = (began - started) + (time.monotonic() - began)
            records.append(child.trajectory.to_record(**ids, total_s=total, group_id=group_id))
        finally:
            child.close()
    return records


def _ended(
    parent: HarnessEnv,
    steps: int,
    env_id: str,
    seed: int,
    index: int,
    group: int,
    fork_at: int,
    started: float,
) -> list[dict[str, Any]]:
    """The records of a group whose prefix ended at ``steps``, before the fork step: the
    finished episode's, then ``group - 1`` not forked."""
    group_id = parent.trajectory.episode_id
    total = time.monotonic() - started
    ids: dict[str, Any] = {"env_id": env_id, "seed": seed, "group_id": group_id}
    finished = parent.trajectory.to_record(**ids, index=index * group, total_s=total)
    records = [finished]
    why = (
        f"the episode ended at step {steps} ({finished['outcome']}, reward "
        f"{finished['reward']:g}) before the fork step {fork_at}: it is recorded once, "
        f"as episode {index * group}"
    )
    for member in range(1, group):
        record = parent.trajectory.to_record(**ids, index=index * group + member, total_s=0.0)
        record.update(outcome=NOT_FORKED, error_type=NOT_FORKED, error=why, reward=0.0)
        record.update(parent_id=group_id, fork_step=fork_at)
        records.append(record)
    return records
