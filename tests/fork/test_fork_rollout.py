"""Grouped rollouts (``gym-harness rollout --group G --fork-at K``), as a user runs them.

Each task runs once to step K, then forks into G episodes, each a record with the
group's ``group_id``, its ``parent_id`` and ``fork_step``; a fork that fails is a
record too. Real subprocesses: the CLI, the Reference agent, the line agent.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import LINE_AGENT

import gym_harness  # noqa: F401  (registers the env ids)
from gym_harness import ConfigError
from gym_harness.rollout import local_rollout
from gym_harness.tasks import load_tasks

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # a whole rollout or runtime per test

TASKS = [
    '{"id": "add", "prompt": "/call add {\\"a\\": 2, \\"b\\": 3}"}',
    '{"id": "echo", "prompt": "hello"}',
]


def rollout(tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "out.jsonl"
    tasks.write_text("\n".join(TASKS) + "\n")
    tests = str(ROOT / "tests")  # the policy module
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gym_harness.rollout.cli",
            "rollout",
            str(tasks),
            "--out",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": path},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


def check_groups(records: list[dict[str, Any]], size: int, step: int) -> None:
    """``size`` records a task, one group each: a shared group and parent, own episodes."""
    assert Counter(r["task_id"] for r in records) == {"add": size, "echo": size}
    for task in ("add", "echo"):
        mine = [r for r in records if r["task_id"] == task]
        assert len({r["group_id"] for r in mine}) == 1
        assert all(r["parent_id"] == r["group_id"] and r["fork_step"] == step for r in mine)
        assert all(r["forked_from"] == {"episode_id": r["parent_id"], "step": step} for r in mine)
        assert len({r["episode_id"] for r in mine}) == size
        assert mine[0]["group_id"] not in {r["episode_id"] for r in mine}
        assert sorted(r["episode_index"] for r in mine) == list(range(size))


def test_a_turn_mode_group_of_4_forked_at_turn_2(tmp_path: Path) -> None:
    records = rollout(tmp_path, "--group", "4", "--fork-at", "2", "--max-turns", "3")
    check_groups(records, 4, 2)
    for record in records:
        assert record["outcome"] == "max_turns" and record["error_type"] == "", record["error"]
        assert [t["message"] for t in record["turns"]][1:] == ["Continue.", "Continue."]
        assert len(record["turns"]) == 3  # two of the prefix, one of its own


def test_a_model_mode_group_of_4_forked_at_call_2(tmp_path: Path) -> None:
    policy = "support.policies:add_twice_then_answer"
    args = ["--mode", "model", "--policy", policy, "--group", "4", "--fork-at", "2"]
    records = rollout(tmp_path, *args)
    check_groups(records, 4, 2)
    for record in records:
        assert (record["outcome"], record["error_type"]) == ("done", ""), record["error"]
        main = [c for c in record["calls"] if not c["side"]]
        assert len(main) == 3  # two of the prefix, the child's own answer
        assert main[-1]["completion"]["content"] == "The sum is 5, twice."
        assert len({c["request_id"] for c in main}) == 3


def test_a_fork_that_fails_is_a_record_not_a_crash(tmp_path: Path) -> None:
    command = "command=" + json.dumps([sys.executable, str(LINE_AGENT)])
    args = ["--env", "gym_harness/Command-v0", "--set", command, "--group", "2", "--fork-at", "1"]
    records = rollout(tmp_path, *args)
    assert len(records) == 4
    for record in records:
        assert (record["outcome"], record["error_type"]) == ("fork_failed", "fork_failed")
        assert "ForkUnsupported" in record["error"] and "'command' harness" in record["error"]
        assert record["parent_id"] == record["group_id"] and record["fork_step"] == 1


def test_local_rollout_takes_the_same_keywords(tmp_path: Path) -> None:
    tasks_file = tmp_path / "t.jsonl"
    tasks_file.write_text(TASKS[1] + "\n")
    out = io.StringIO()
    written = local_rollout(
        "gym_harness/Reference-v0", {}, load_tasks(tasks_file), n=1, seed=0, max_turns=2,
        follow_up="more", out=out, group=3, fork_at=1,
    )  # fmt: skip
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert written == 3 and len({r["group_id"] for r in records}) == 1
    assert [r["turns"][-1]["message"] for r in records] == ["more"] * 3


@pytest.mark.parametrize(("group", "fork_at"), [(0, 1), (2, -1), (True, 1)])
def test_bad_group_settings_raise_at_once(group: Any, fork_at: Any) -> None:
    with pytest.raises(ConfigError, match=r"group must be|fork_at must be"):
        local_rollout(
            "gym_harness/Reference-v0", {}, [], n=1, seed=0, max_turns=1, follow_up="",
            out=io.StringIO(), group=group, fork_at=fork_at,
        )  # fmt: skip


def test_a_prefix_that_ends_before_the_fork_is_one_record_and_the_rest_not_forked(
    tmp_path: Path,
) -> None:
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "out.jsonl"
    tasks.write_text('{"id": "fin", "prompt": "/done Jupiter"}\n')
    argv = [sys.executable, "-m", "gym_harness.rollout.cli", "rollout", str(tasks)]
    argv += ["--group", "3", "--fork-at", "5", "--max-turns", "6", "--out", str(out)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["episode_index"] for r in records] == [0, 1, 2]
    finished, *others = records
    assert finished["outcome"] == "done" and finished["error_type"] == "", finished["error"]
    assert len(finished["turns"]) == 1 and finished["reward"] == finished["turns"][0]["reward"]
    assert finished["forked_from"] is None
    for record in others:
        assert (record["outcome"], record["error_type"]) == ("not_forked", "not_forked")
        assert "ended at step 1 (done" in record["error"] and "fork step 5" in record["error"]
        assert record["reward"] == 0.0
        assert record["group_id"] == finished["group_id"] == finished["episode_id"]
