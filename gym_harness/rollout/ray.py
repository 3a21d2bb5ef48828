"""The rollout on a Ray cluster (the optional extra ``gym_harness[ray]``): ``ray_rollout``.

``ray_rollout`` is what ``gym-harness rollout --ray [ADDRESS]`` runs: the same records as
the local rollout, spread over a pool of actors (``gym_harness.vector.ray_cluster``'s, whose
:class:`~gym_harness.vector.ray_cluster.EnvActor` each runs whole episodes here). The vector env
on Ray, ``RayVectorEnv``, lives in ``gym_harness.vector.ray`` and is importable from here
as before.

Large inputs go through the object store: ``ray.put`` stores the env keywords and each
task once, the actors get ``ObjectRef``s, and Ray pulls each into a node's store once for
every later call there. So a task with megabytes of workspace files crosses the network
once per node, not once per episode, and does not come back: the actor drops ``task``
from the record and the driver puts its own copy in.

Threads: the scheduler's threads drive the actors' calls; the actors run their envs in
their own processes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from gym_harness.errors import WorkerLost
from gym_harness.rollout import episode
from gym_harness.rollout.groups import group_settings, run_task
from gym_harness.rollout.local import Episode, EpisodeWorker, Lines, episodes, schedule
from gym_harness.tasks import Task
from gym_harness.vector.ray import RayVectorEnv
from gym_harness.vector.ray_cluster import (
    DEFAULT_RESOURCES,
    ActorPool,
    EnvActor,
    connect,
    ray_module,
    shutdown,
)

__all__ = ["RayVectorEnv", "connect", "ray_rollout"]

_WHAT = "gym_harness.rollout.ray"


class _EpisodeEnvActor(EnvActor):
    """An env actor that also runs whole episodes (one record each, or a group's)."""

    def episode(self, task: dict[str, Any], **kwargs: Any) -> list[dict[str, Any]]:
        assert self.env is not None
        # The driver has the task: large task files never travel back.
        return run_task(self.env, task, keep_task=False, **kwargs)


def ray_rollout(
    env_id: str,
    env_kwargs: Mapping[str, Any],
    tasks: Sequence[Task],
    *,
    out: Lines,
    n: int = episode.DEFAULT_N,
    seed: int = episode.DEFAULT_SEED,
    max_turns: int = episode.DEFAULT_MAX_TURNS,
    follow_up: str = episode.DEFAULT_FOLLOW_UP,
    progress: Callable[[int, str], None] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    address: str | None = None,
    num_workers: int | None = None,
    resources_per_env: Mapping[str, Any] | None = None,
    timeout_s: float = 3600.0,
    policy: Callable[..., Any] | str | None = None,
    max_steps: int = episode.DEFAULT_MAX_STEPS,
    group: int | None = None,
    fork_at: int = 0,
    skip: Collection[tuple[str, int]] = (),
) -> int:
    """Run ``n`` episodes of every task over a pool of Ray actors; write JSONL.

    The local rollout's scheduler (``gym_harness.rollout.local.schedule``) with one Ray
    actor per worker. Episode ``j`` (task-major order, as the local rollout counts)
    gets seed ``seed + j``, so each record equals the local rollout's for the same
    seed except timings and ids. Records are written as episodes finish (not in
    order; ``task_id`` and ``episode_index`` say which is which). An episode whose
    actor dies is written with ``outcome`` and ``error_type`` ``"worker_lost"``.

    Args:
        env_id: The gymnasium id each actor makes.
        env_kwargs: Its ``gymnasium.make`` keywords.
        tasks: The tasks; each travels to a node once (``ray.put``).
        out: Where the JSON lines go (flushed after each).
        n: Episodes per task (as for ``local_rollout``, with the same defaults).
        seed: Seed of the first episode.
        max_turns: Turns per episode at most.
        follow_up: The message of every turn after the first.
        progress: Called with (episodes done, outcome) after each.
        on_record: Called with each record before it is written (it may add keys).
        address: The cluster (see ``connect``); Ray started here is shut down at the end.
        num_workers: Actors in the pool (default: the cluster's CPUs, at most one per episode).
        resources_per_env: Ray actor options per actor (default ``DEFAULT_RESOURCES``).
        timeout_s: The longest one episode may take before its actor is killed.
        policy: Model mode, as for ``run_episode`` (each actor runs the policy).
        max_steps: Model mode: steps per episode at most.
        group: Fork each episode's prefix this many ways (as for ``local_rollout``).
        fork_at: With ``group``: steps before the fork.
        skip: (task id, episode index) pairs not to run (as for ``local_rollout``).

    Returns:
        How many records were written.

    Raises:
        ConfigError: Ray is missing, or the env cannot be made on a worker.
    """
    grouping = group_settings(group, fork_at)
    plan = episodes(tasks, n, seed, skip)
    if not plan:
        return 0
    ray = ray_module(_WHAT)
    owned = connect(address)
    spare: list[Any] = []
    pool: ActorPool | None = None
    try:
        resources = DEFAULT_RESOURCES if resources_per_env is None else resources_per_env
        pool = ActorPool(env_id, env_kwargs, resources, actor=_EpisodeEnvActor, what=_WHAT)
        spare.append(pool.new())
        pool.check(spare[0], timeout_s)
        settings = dict(env_id=env_id, max_turns=max_turns, follow_up=follow_up, **grouping)
        if policy is not None:
            settings.update(policy=policy, max_steps=max_steps)
        mission = _Mission(pool, tasks, settings, timeout_s)

        def new_worker() -> EpisodeWorker:
            try:
                actor = spare.pop()  # the checked one first
            except IndexError:
                actor = mission.pool.new()
            return _RayEpisodes(mission, actor)

        size = num_workers or int(ray.cluster_resources().get("CPU", 1))
        return schedule(
            plan,
            new_worker,
            env_id=env_id,
            out=out,
            concurrency=max(1, size),
            progress=progress,
            on_record=on_record,
        )
    finally:
        if pool is not None:
            pool.end(spare)
        if owned:
            shutdown()  # the caller's signal handlers kept


class _Mission:
    """What every actor of one Ray rollout shares: the pool, the tasks, the settings."""

    def __init__(
        self, pool: ActorPool, tasks: Sequence[Task], settings: dict[str, Any], timeout_s: float
    ) -> None:
        self.pool, self.settings, self.timeout_s = pool, settings, timeout_s
        self.tasks = {task.id: task.to_dict() for task in tasks}  # ids are unique
        self.refs = {task_id: pool.ray.put(task) for task_id, task in self.tasks.items()}


class _RayEpisodes:
    """An ``EpisodeWorker`` over one Ray actor; its calls run in the driver."""

    def __init__(self, mission: _Mission, actor: Any) -> None:
        self.mission, self.actor = mission, actor
        self.lost = False

    def run(self, episode: Episode) -> list[dict[str, Any]]:
        mission, ray = self.mission, self.mission.pool.ray
        task_id = episode.task.id
        ref = self.actor.episode.remote(
            mission.refs[task_id], seed=episode.seed, index=episode.index, **mission.settings
        )
        try:
            records: list[dict[str, Any]] = ray.get(ref, timeout=mission.timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            self.lost = True
            raise WorkerLost(f"no result within {mission.timeout_s:g} s") from exc
        except ray.exceptions.RayActorError as exc:
            self.lost = True
            raise WorkerLost(f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
        for record in records:
            record["task"] = mission.tasks[task_id]  # the actor sent none back
        return records

    def abort(self) -> None:
        ray = self.mission.pool.ray
        with contextlib.suppress(ray.exceptions.RayError):
            ray.kill(self.actor, no_restart=True)

    def close(self) -> None:
        self.mission.pool.end([self.actor], grace_s=0.0 if self.lost else 30.0)
