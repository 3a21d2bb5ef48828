"""Rollouts: many episodes of a task file, one JSON record each (``gym-harness rollout``).

``run_episode`` (``rollout/episode.py``) runs one episode on an env and returns its
record (``Trajectory.to_record()``); ``run_task`` (``rollout/groups.py``) runs a grouped
one (a prefix forked ``group`` ways) when asked. ``schedule`` runs a rollout's episodes on a bounded
pool of workers and writes each record as its episode finishes. The local rollout
(``local_rollout``: harness envs in this process) and the Ray rollout
(``gym_harness.rollout.ray.ray_rollout``: envs in Ray actors) are this one scheduler with
two kinds of ``EpisodeWorker``, so both write the same record for the same seed.

Threads: with ``concurrency=1`` the caller's thread runs every episode (in
task-major order). With more, each worker lives in a thread of its own, which
makes, uses and closes it; the caller's thread writes the records, in the order
the episodes finish.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium

from gym_harness.errors import ConfigError, WorkerLost
from gym_harness.outcome import Outcome
from gym_harness.records.trajectory import Trajectory
from gym_harness.rollout.episode import (
    DEFAULT_FOLLOW_UP,
    DEFAULT_MAX_STEPS,
    DEFAULT_MAX_TURNS,
    DEFAULT_N,
    DEFAULT_SEED,
    Policy,
    load_policy,
    run_episode,
)
from gym_harness.rollout.groups import group_settings, run_task
from gym_harness.tasks import Task

__all__ = [
    "Episode",
    "EpisodeWorker",
    "Lines",
    "episodes",
    "local_rollout",
    "run_episode",
    "schedule",
]

#: How long ``schedule`` waits for its worker threads once it stops early (a raise, Ctrl-C).
JOIN_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Episode:
    """One episode of a rollout.

    Args:
        number: Its place in the rollout, task-major, from 0.
        task: Its task.
        index: Which episode of its task it is (0 .. n-1; the record's ``episode_index``).
        seed: The seed of its reset.
    """

    number: int
    task: Task
    index: int
    seed: int


def episodes(
    tasks: Sequence[Task], n: int, seed: int, skip: Collection[tuple[str, int]] = ()
) -> list[Episode]:
    """``n`` episodes of every task, task-major; episode ``j`` gets seed ``seed + j``.

    The (task id, index) pairs in ``skip`` (recorded by an earlier run) are left out;
    the others keep their number and seed.
    """
    pairs = [(task, k) for task in tasks for k in range(n)]
    plan = [Episode(j, task, k, seed + j) for j, (task, k) in enumerate(pairs)]
    return [episode for episode in plan if (episode.task.id, episode.index) not in skip]


class Lines(Protocol):
    """Where a rollout writes its JSON lines: a text file, or ``outfile.RecordFile``."""

    def write(self, text: str, /) -> int:
        """Write ``text`` (one record's line)."""
        ...

    def flush(self) -> None:
        """Make what was written visible."""
        ...


class EpisodeWorker(Protocol):
    """Runs episodes one at a time: an env in this process, a Ray actor ...

    ``schedule`` makes, uses and closes each worker in one thread; only ``abort``
    comes from another.
    """

    def run(self, episode: Episode) -> dict[str, Any] | list[dict[str, Any]]:
        """Run ``episode`` and return its record (``Trajectory.to_record()``), or a grouped
        episode's records (one per fork).

        Raises:
            WorkerLost: The worker died; the episode is recorded as ``worker_lost``
                and a new worker takes the next one.
        """
        ...

    def abort(self) -> None:
        """Stop a ``run`` under way, from another thread (may do nothing; never raises)."""
        ...

    def close(self) -> None:
        """End the worker and what it holds. Never raises."""
        ...


def schedule(
    plan: Sequence[Episode],
    new_worker: Callable[[], EpisodeWorker],
    *,
    env_id: str,
    out: Lines,
    concurrency: int = 1,
    progress: Callable[[int, str], None] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> int:
    """Run every episode of ``plan`` on at most ``concurrency`` workers; write JSON lines.

    Each record is passed to ``on_record``, written to ``out`` as one line (flushed),
    then counted in ``progress``, in the order the episodes finish (``plan``'s order
    with one worker). An episode whose worker is lost (``WorkerLost``) is written as
    a record with ``outcome`` and ``error_type`` ``"worker_lost"`` and no turns, and
    the worker is replaced. Any other exception stops the rollout: no new episode
    starts, every worker is aborted and closed, and the exception is raised here.

    Args:
        plan: The episodes (see ``episodes``).
        new_worker: Makes a worker; called in the thread that will use it.
        env_id: The env id of the records (a lost episode's record needs it).
        out: Where the JSON lines go.
        concurrency: Workers at most (one thread each when more than one).
        progress: Called with (episodes written, outcome) after each.
        on_record: Called with each record before it is written (it may add keys).

    Returns:
        How many records were written.

    Raises:
        ConfigError: ``concurrency`` is below 1.
    """
    if concurrency < 1:
        raise ConfigError(f"concurrency must be at least 1, got {concurrency}.")
    written = 0

    def write(record: dict[str, Any]) -> None:
        nonlocal written
        if on_record is not None:
            on_record(record)
        out.write(json.dumps(record) + "\n")
        out.flush()
        written += 1
        if progress is not None:
            progress(written, str(record["outcome"]))

    if concurrency == 1 or len(plan) <= 1:
        _in_turn(plan, new_worker, env_id, write)
    else:
        _Threads(plan, new_worker, env_id, min(concurrency, len(plan))).run(write)
    return written


def _in_turn(
    plan: Sequence[Episode],
    new_worker: Callable[[], EpisodeWorker],
    env_id: str,
    write: Callable[[dict[str, Any]], None],
) -> None:
    """Every episode in the caller's thread, one worker at a time."""
    worker: EpisodeWorker | None = None
    try:
        for episode in plan:
            if worker is None:
                worker = new_worker()
            records, worker = _run(worker, episode, env_id)
            for record in records:
                write(record)
    finally:
        if worker is not None:
            worker.close()


def _run(
    worker: EpisodeWorker, episode: Episode, env_id: str
) -> tuple[list[dict[str, Any]], EpisodeWorker | None]:
    """The episode's records, and the worker if it is still usable (closed if not)."""
    try:
        done = worker.run(episode)
    except WorkerLost as exc:
        worker.close()
        return [_lost_record(episode, env_id, str(exc))], None
    return (done if isinstance(done, list) else [done]), worker


def _lost_record(episode: Episode, env_id: str, error: str) -> dict[str, Any]:
    """The record of an episode whose worker died: the usual keys, no turns."""
    trajectory = Trajectory(episode_id="", harness="", task=episode.task.to_dict())
    return trajectory.to_record(
        env_id=env_id,
        index=episode.index,
        seed=episode.seed,
        total_s=0.0,
        fault=Outcome.WORKER_LOST,
        error=error,
    )


_DONE = object()  # a worker thread's last message


class _Threads:
    """``size`` worker threads taking episodes from one plan; results to the caller."""

    def __init__(
        self,
        plan: Sequence[Episode],
        new_worker: Callable[[], EpisodeWorker],
        env_id: str,
        size: int,
    ) -> None:
        self.todo = iter(plan)
        self.new_worker, self.env_id, self.size = new_worker, env_id, size
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.live: list[EpisodeWorker | None] = [None] * size  # for abort, under lock
        # Bounded: a worker waits for the caller to write its last record before the next.
        self.results: queue.Queue[Any] = queue.Queue(maxsize=size)

    def run(self, write: Callable[[dict[str, Any]], None]) -> None:
        threads = [
            threading.Thread(target=self._work, args=(slot,), name=f"rollout-{slot}", daemon=True)
            for slot in range(self.size)
        ]
        for thread in threads:
            thread.start()
        try:
            running = self.size
            while running:
                try:
                    item = self.results.get(timeout=1.0)
                except queue.Empty:
                    if any(t.is_alive() for t in threads):
                        continue
                    break
                if item is _DONE:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    write(item)
        finally:
            self.stop.set()
            with self.lock:
                live = [w for w in self.live if w is not None]
            for worker in live:
                worker.abort()
            deadline = time.monotonic() + JOIN_TIMEOUT_S
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))

    def _work(self, slot: int) -> None:
        worker: EpisodeWorker | None = None
        try:
            while not self.stop.is_set():
                with self.lock:
                    episode = next(self.todo, None)
                if episode is None:
                    break
                if worker is None:
                    worker = self.new_worker()
                    self._hold(slot, worker)
                records, worker = _run(worker, episode, self.env_id)
                if worker is None:
                    self._hold(slot, None)
                for record in records:
                    self._put(record)
        except BaseException as exc:  # the first failure ends the rollout, in the caller
            self._put(exc)
        finally:
            if worker is not None:
                self._hold(slot, None)
                worker.close()
            self._put(_DONE)

    def _hold(self, slot: int, worker: EpisodeWorker | None) -> None:
        with self.lock:
            self.live[slot] = worker
        if worker is not None and self.stop.is_set():
            worker.abort()  # made while the rollout stopped: the caller did not see it

    def _put(self, item: Any) -> None:
        while True:
            try:
                self.results.put(item, timeout=0.5)
                return
            except queue.Full:
                if self.stop.is_set():  # the caller reads no more
                    return


def local_rollout(
    env_id: str,
    env_kwargs: Mapping[str, Any],
    tasks: Sequence[Task],
    *,
    out: Lines,
    n: int = DEFAULT_N,
    seed: int = DEFAULT_SEED,
    max_turns: int = DEFAULT_MAX_TURNS,
    follow_up: str = DEFAULT_FOLLOW_UP,
    progress: Callable[[int, str], None] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    concurrency: int = 1,
    policy: Policy | str | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    group: int | None = None,
    fork_at: int = 0,
    skip: Collection[tuple[str, int]] = (),
) -> int:
    """Run ``n`` episodes of every task on envs in this process; write JSONL.

    Episode ``j`` (task-major) gets seed ``seed + j`` whatever the concurrency. The
    defaults are ``gym-harness rollout``'s.

    Args:
        env_id: The gymnasium id of the envs (``gymnasium.make``).
        env_kwargs: Its ``gymnasium.make`` keywords.
        tasks: The tasks (``gym_harness.load_tasks`` reads a JSONL file into them).
        out: Where the JSON lines go (flushed after each).
        n: Episodes per task.
        seed: Seed of the first episode.
        max_turns: Turns per episode at most (the prompt, then ``follow_up``).
        follow_up: The message of every turn after the first.
        progress: Called with (episodes written, outcome) after each.
        on_record: Called with each record before it is written (it may add keys).
        concurrency: Envs running at once (one thread each when more than one).
        policy: Model mode (``env_kwargs`` with ``mode="model"``): answers each model
            call (see ``run_episode``); an import string is imported here, once.
        max_steps: Model mode: steps per episode at most.
        group: Fork each episode ``group`` ways after ``fork_at`` steps and record the
            forks (``rollout/groups.py``; README, "Forking"); ``None``: no forks.
        fork_at: With ``group``, the steps the shared prefix takes.
        skip: (task id, episode index) pairs not to run (recorded already: ``--resume``).

    Returns:
        How many records were written.

    Raises:
        ConfigError: A bad ``group`` or ``fork_at``.

    Example:
        >>> import io
        >>> from gym_harness import load_tasks
        >>> tasks = load_tasks([{"id": "t", "prompt": "/done hi"}])
        >>> local_rollout("gym_harness/Reference-v0", {}, tasks, out=io.StringIO())
        1
    """
    settings: dict[str, Any] = {"max_turns": max_turns, "follow_up": follow_up}
    settings.update(group_settings(group, fork_at))
    if policy is not None:
        settings.update(policy=load_policy(policy), max_steps=max_steps)

    def new_worker() -> EpisodeWorker:
        return _LocalWorker(env_id, env_kwargs, settings)

    plan = episodes(tasks, n, seed, skip)
    return schedule(
        plan,
        new_worker,
        env_id=env_id,
        out=out,
        concurrency=concurrency,
        progress=progress,
        on_record=on_record,
    )


class _LocalWorker:
    """An ``EpisodeWorker`` over one env of this process."""

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any], settings: dict[str, Any]):
        self.env: gymnasium.Env[str, str] = gymnasium.make(env_id, **env_kwargs)
        self.env_id, self.settings = env_id, settings

    def run(self, episode: Episode) -> dict[str, Any] | list[dict[str, Any]]:
        task = episode.task.to_dict()
        return run_task(
            self.env,
            task,
            env_id=self.env_id,
            seed=episode.seed,
            index=episode.index,
            **self.settings,
        )

    def abort(self) -> None:
        """Nothing: an env's episode ends by its own timeouts."""

    def close(self) -> None:
        self.env.close()
