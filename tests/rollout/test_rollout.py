"""The rollout scheduler: order, the concurrency bound, lost workers and raising episodes.

The scheduler is driven through ``EpisodeWorker``s written here (a backend of its
own, as the Ray actors are one), and once end to end through real reference
harness envs (``local_rollout``).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

import pytest

from gym_harness import ConfigError, Task, Trajectory, WorkerLost, load_tasks
from gym_harness.agents.demo import demo_tasks_path
from gym_harness.rollout.local import Episode, EpisodeWorker, episodes, local_rollout, schedule

TASKS = [Task.from_dict({"id": "a", "prompt": "A"}), Task.from_dict({"id": "b", "prompt": "B"})]


class Backend:
    """Makes workers and logs what the scheduler asks of them, from which thread."""

    def __init__(self, *, lose: int = -1, fail: int = -1, barrier: int = 0) -> None:
        self.lose, self.fail = lose, fail
        self.barrier = threading.Barrier(barrier) if barrier else None
        self.lock = threading.Lock()
        self.made: list[Worker] = []
        self.started: list[int] = []
        self.running = self.most_running = 0

    def new_worker(self) -> EpisodeWorker:
        worker = Worker(self, len(self.made))
        with self.lock:
            self.made.append(worker)
        return worker


class Worker:
    def __init__(self, backend: Backend, number: int) -> None:
        self.backend, self.number = backend, number
        self.threads = {threading.get_ident()}
        self.closed = self.lost = False

    def run(self, episode: Episode) -> dict[str, Any]:
        backend = self.backend
        assert not self.closed and not self.lost  # a lost worker runs nothing more
        self.threads.add(threading.get_ident())
        with backend.lock:
            backend.started.append(episode.number)
            backend.running += 1
            backend.most_running = max(backend.most_running, backend.running)
        try:
            if backend.barrier is not None:  # passes only with `parties` episodes at once
                backend.barrier.wait(timeout=30)
            if episode.number == backend.lose:
                self.lost = True
                raise WorkerLost(f"worker {self.number} died")
            if episode.number == backend.fail:
                raise ValueError(f"episode {episode.number} failed")
        finally:
            with backend.lock:
                backend.running -= 1
        trajectory = Trajectory(f"ep{episode.number}", "test", episode.task.to_dict())
        record = trajectory.to_record(
            env_id="test/Env-v0", index=episode.index, seed=episode.seed, total_s=0.0
        )
        return record | {"worker": self.number}

    def abort(self) -> None:
        if self.backend.barrier is not None:  # a run waiting there gives up
            self.backend.barrier.abort()

    def close(self) -> None:
        self.threads.add(threading.get_ident())
        self.closed = True


def roll(backend: Backend, concurrency: int, n: int = 3) -> tuple[list[dict[str, Any]], list[int]]:
    out, seen = io.StringIO(), []
    written = schedule(
        episodes(TASKS, n, seed=5),
        backend.new_worker,
        env_id="test/Env-v0",
        out=out,
        concurrency=concurrency,
        progress=lambda done, outcome: seen.append(done),
    )
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert written == len(records) and seen == list(range(1, written + 1))
    return records, seen


def test_episodes_are_task_major_with_one_seed_each() -> None:
    plan = episodes(TASKS, 2, seed=7)
    assert [(e.number, e.task.id, e.index, e.seed) for e in plan] == [
        (0, "a", 0, 7),
        (1, "a", 1, 8),
        (2, "b", 0, 9),
        (3, "b", 1, 10),
    ]


def test_one_worker_runs_the_plan_in_order_in_the_callers_thread() -> None:
    backend = Backend()
    records, _ = roll(backend, concurrency=1)
    assert [(r["task_id"], r["episode_index"], r["seed"]) for r in records] == [
        ("a", 0, 5),
        ("a", 1, 6),
        ("a", 2, 7),
        ("b", 0, 8),
        ("b", 1, 9),
        ("b", 2, 10),
    ]
    (worker,) = backend.made
    assert worker.closed and worker.threads == {threading.get_ident()}
    assert {r["outcome"] for r in records} == {"max_turns"}  # never stepped: the rollout ended it


def test_workers_run_at_most_concurrency_episodes_at_once() -> None:
    backend = Backend(barrier=3)  # three episodes must run at once, or the barrier breaks
    records, _ = roll(backend, concurrency=3)
    assert backend.most_running == 3
    assert sorted(r["seed"] for r in records) == list(range(5, 11))
    assert sorted(backend.started) == list(range(6))
    assert len(backend.made) == 3 and all(w.closed for w in backend.made)
    for worker in backend.made:  # made, used and closed in one thread, not the caller's
        assert len(worker.threads) == 1 and threading.get_ident() not in worker.threads


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_lost_worker_is_recorded_and_replaced(concurrency: int) -> None:
    backend = Backend(lose=1)
    records, _ = roll(backend, concurrency=concurrency)
    (lost,) = [r for r in records if r["outcome"] == "worker_lost"]
    assert lost["error_type"] == "worker_lost" and lost["error"].endswith("died")
    assert (lost["task_id"], lost["episode_index"], lost["seed"]) == ("a", 1, 6)
    assert lost["task"] == TASKS[0].to_dict() and lost["turns"] == lost["messages"] == []
    kept = [r for r in records if r is not lost]
    assert len(kept) == 5 and all(set(r) - {"worker"} == set(lost) for r in kept)
    assert all(w.closed for w in backend.made) and sum(w.lost for w in backend.made) == 1
    if concurrency == 1:  # a new worker took the episodes after the lost one
        assert len(backend.made) == 2 and [r["worker"] for r in kept] == [0, 1, 1, 1, 1]


def test_a_raising_episode_stops_the_rollout_in_order() -> None:
    backend = Backend(fail=2)
    with pytest.raises(ValueError, match="episode 2 failed"):
        roll(backend, concurrency=1)
    assert backend.started == [0, 1, 2]  # nothing after it started
    assert all(w.closed for w in backend.made)


def test_a_raising_episode_stops_every_worker_thread() -> None:
    backend = Backend(fail=0, barrier=2)  # episode 0 raises; episode 2 waits to be aborted
    with pytest.raises(ValueError, match="episode 0 failed"):
        roll(backend, concurrency=2)
    assert len(backend.made) == 2 and all(w.closed for w in backend.made)
    assert len(backend.started) < 6  # the rollout stopped early
    assert backend.running == 0


def test_concurrency_below_one_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="concurrency must be at least 1"):
        schedule(
            episodes(TASKS, 1, 0),
            Backend().new_worker,
            env_id="x",
            out=io.StringIO(),
            concurrency=0,
        )


def _deterministic(record: dict[str, Any]) -> dict[str, Any]:
    keep = ("task_id", "episode_index", "seed", "outcome", "reward", "messages", "error_type")
    return {k: record[k] for k in keep} | {"turns": len(record["turns"])}


def test_local_rollout_on_two_envs_writes_the_records_of_one() -> None:
    tasks = [t for t in load_tasks(demo_tasks_path()) if t.id in ("add", "finish")]
    runs = {}
    for concurrency in (1, 2):
        out = io.StringIO()
        written = local_rollout(
            "gym_harness/Reference-v0",
            {},
            tasks,
            n=2,
            seed=3,
            max_turns=2,
            follow_up="Continue.",
            out=out,
            concurrency=concurrency,
        )
        records = [json.loads(line) for line in out.getvalue().splitlines()]
        assert written == len(records) == 4
        runs[concurrency] = records
    assert [(r["task_id"], r["episode_index"]) for r in runs[1]] == [
        ("add", 0),
        ("add", 1),
        ("finish", 0),
        ("finish", 1),
    ]
    one, two = (
        {(r["task_id"], r["episode_index"]): _deterministic(r) for r in runs[c]} for c in runs
    )
    assert one == two
    assert {r["outcome"] for r in runs[1]} >= {"done", "max_turns"}
    assert len({r["episode_id"] for r in runs[2]}) == 4


def model_rollout(out: TextIO, policy: Any, **options: Any) -> int:
    """One Reference episode of "what is 2+3?" in model mode, answered by ``policy``."""
    tasks = [Task(id="add", prompt="what is 2+3?", meta={"expect": "5"})]
    return local_rollout(
        "gym_harness/Reference-v0",
        {"mode": "model"},
        tasks,
        n=1,
        seed=0,
        max_turns=1,
        follow_up="",
        out=out,
        policy=policy,
        **options,
    )


def test_local_rollout_in_model_mode_answers_calls_with_the_policy() -> None:
    from support.policies import add_then_answer, not_an_action

    seen: list[dict[str, Any]] = []

    def policy(request: dict[str, Any]) -> str | dict[str, Any]:
        seen.append(request)
        return add_then_answer(request)

    out = io.StringIO()
    written = model_rollout(out, policy)
    (record,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert written == 1 and len(seen) == 2
    assert (record["reward"], record["outcome"]) == (1.0, "done")
    assert [c["request_id"] for c in record["calls"]] == [r["request_id"] for r in seen]
    assert record["messages"][-1] == {"role": "assistant", "content": "The sum is 5."}

    out = io.StringIO()  # max_steps stops an episode the policy keeps going
    keep_adding = lambda request: add_then_answer({"messages": [{"role": "user"}]})  # noqa: E731
    model_rollout(out, keep_adding, max_steps=3)
    record = json.loads(out.getvalue())
    assert record["outcome"] == "max_turns" and len(record["calls"]) == 3

    with pytest.raises(TypeError, match="policy must return a str or a dict"):
        model_rollout(io.StringIO(), not_an_action)
    with pytest.raises(ConfigError, match="policy must be a callable"):
        model_rollout(io.StringIO(), "json:__doc__")


def test_local_rollout_defaults_are_the_commands(tmp_path: Path) -> None:
    """``local_rollout`` with only its required arguments writes what ``gym-harness rollout``
    writes with none of its options."""
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text(
        '{"id": "add", "prompt": "/call add {\\"a\\": 2, \\"b\\": 3}", "meta": {"expect": "5"}}\n'
        '{"id": "fin", "prompt": "/done Jupiter", "meta": {"expect": "Jupiter"}}\n'
    )
    out = io.StringIO()
    local_rollout("gym_harness/Reference-v0", {}, load_tasks(tasks_file), out=out)
    ours = [_deterministic(json.loads(line)) for line in out.getvalue().splitlines()]
    command = tmp_path / "out.jsonl"
    ran = subprocess.run(
        [sys.executable, "-m", "gym_harness", "rollout", str(tasks_file), "--out", str(command)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    theirs = [_deterministic(json.loads(line)) for line in command.read_text().splitlines()]
    assert ours == theirs
    assert [(r["task_id"], r["seed"], r["turns"]) for r in ours] == [("add", 0, 1), ("fin", 1, 1)]
