"""The gym-harness command, end to end, as a user runs it (a real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

AGENT = str(Path(__file__).with_name("line_agent.py"))


def cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gym_harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_run_with_no_arguments_runs_a_demo_episode() -> None:
    result = cli("run")
    assert result.returncode == 0, result.stderr
    assert "tool call" in result.stdout and "tool result" in result.stdout
    assert "outcome:" in result.stdout and "reward: 1" in result.stdout


def test_run_with_messages_on_a_command_harness() -> None:
    result = cli(
        "run",
        "--env",
        "gym_harness/Command-v0",
        "--set",
        "command=" + json.dumps([sys.executable, AGENT]),
        "--message",
        "first",
        "--message",
        "/done",
    )
    assert result.returncode == 0, result.stderr
    assert "harness: echo: first" in result.stdout
    assert "outcome: done" in result.stdout


def test_rollout_writes_one_record_per_episode(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        '{"id": "add", "prompt": "/call add {\\"a\\": 2, \\"b\\": 3}", "meta": {"expect": "5"}}\n'
        '{"id": "fin", "prompt": "/done Jupiter", "meta": {"expect": "Jupiter"}}\n'
    )
    out = tmp_path / "out.jsonl"
    result = cli("rollout", str(tasks), "-n", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "4/4" in result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in records] == ["add", "add", "fin", "fin"]
    assert [r["reward"] for r in records] == [1.0, 1.0, 1.0, 1.0]
    assert [r["outcome"] for r in records] == ["max_turns", "max_turns", "done", "done"]
    first = records[0]
    assert first["messages"][0] == {"role": "user", "content": '/call add {"a": 2, "b": 3}'}
    assert first["messages"][1]["role"] == "assistant" and "5" in first["messages"][1]["content"]
    assert [e["type"] for e in first["turns"][0]["events"]][:2] == ["tool_call", "tool_result"]
    assert first["error_type"] == "" and first["timings"]["total_s"] > 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["rollout", "/nonexistent/t.jsonl", "--out", "/tmp/x.jsonl"], "Cannot read tasks file"),
        (["run", "--env", "gym_harness/Nope-v0"], "Nope"),
        (["run", "--set", "turn_timeout_s=-1"], "turn_timeout_s"),
        (["run", "--set", "no_such_option=1"], "Unknown keyword"),
        (["run", "--set", "novalue"], "KEY=VALUE"),
    ],
)
def test_bad_input_exits_nonzero_with_one_line(args: list[str], needle: str) -> None:
    result = cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gym-harness: error:"), result.stderr
    assert needle in lines[0]


def test_bad_json_in_tasks_file(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "ok", "prompt": "p"}\n{broken\n')
    result = cli("rollout", str(tasks), "--out", str(tmp_path / "o.jsonl"))
    assert result.returncode == 2
    assert "tasks.jsonl:2: not valid JSON" in result.stderr
