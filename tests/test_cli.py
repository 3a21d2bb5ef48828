"""The gym-harness command, end to end, as a user runs it (a real subprocess)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import LINE_AGENT

AGENT = str(LINE_AGENT)
ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gym_harness.rollout.cli", *args],
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


# ---------------------------------------------------------------- a newcomer's first hour


def command_set(*args: str) -> str:
    """A ``--set`` pair running the line agent (JSON, as the shell passes it)."""
    return "command=" + json.dumps([sys.executable, AGENT, *args])


def test_set_with_python_syntax_is_a_json_error_with_a_shell_safe_example() -> None:
    result = cli("run", "--set", f"command=['{sys.executable}', '{AGENT}']")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "is not valid JSON at column 2" in line
    example = line.split("e.g. --set ", 1)[1].rstrip(".")
    # The example, pasted into a real shell, runs.
    shell = f"{shlex.quote(sys.executable)} -m gym_harness run --env gym_harness/Command-v0 "
    shell += f"--set {example} --message /done"
    ran = subprocess.run(shell, shell=True, capture_output=True, text=True, timeout=90)
    assert ran.returncode == 0, ran.stderr
    assert "outcome: done" in ran.stdout


def test_a_bare_word_where_a_list_is_needed_gets_a_shell_safe_example() -> None:
    result = cli("run", "--env", "gym_harness/Command-v0", "--set", "command=python")
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "must be a list of strings, got 'python'" in line
    assert """--set 'command=["python","agent.py"]'""" in line
    example = line.split("gym-harness: --set ", 1)[1].rsplit(")", 1)[0]
    (pair,) = shlex.split(example)  # what the shell hands over: one argument, valid JSON
    assert json.loads(pair.partition("=")[2]) == ["python", "agent.py"]


def test_set_keeps_bare_words_as_strings_and_parses_json() -> None:
    result = cli("run", "--env", "gym_harness/Command-v0", "--set", command_set(),
                 "--set", "idle_timeout_s=30", "--set", "allow_plain_text=false",
                 "--message", "/done")  # fmt: skip
    assert result.returncode == 0, result.stderr
    result = cli("run", "--set", "policy=scripted", "--message", "hi")
    assert result.returncode == 0, result.stderr


def test_unknown_keyword_suggests_the_closest_and_lists_env_keywords() -> None:
    result = cli("run", "--set", "reward=1")
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "did you mean 'reward_fn'" in line
    for name in ("'reward_fn'", "'tasks'", "'tools'", "'render_mode'", "'turn_timeout_s'"):
        assert name in line


@pytest.mark.parametrize(
    ("agent_args", "message", "status", "outcome"),
    [
        ((), "/done", 0, "outcome: done"),
        ((), "hi", 0, "outcome: ok (the episode was still running after 1 turn)"),
        ((), "crash", 1, "outcome: harness_crashed"),
        (("exit_at_start",), "hi", 3, "outcome: startup_failed"),
    ],
    ids=["done", "still_running", "crashed", "startup_failed"],
)
def test_run_exit_status_follows_the_outcome(
    agent_args: tuple[str, ...], message: str, status: int, outcome: str
) -> None:
    result = cli("run", "--env", "gym_harness/Command-v0", "--set", command_set(*agent_args),
                 "--message", message)  # fmt: skip
    assert result.returncode == status, result.stderr
    assert outcome in result.stdout


def test_run_with_a_message_runs_no_demo_task() -> None:
    result = cli("run", "--message", "hi there")
    assert result.returncode == 0, result.stderr
    assert "task message: hi there" in result.stdout
    assert "/call" not in result.stdout  # no demo task's prompt in the header
    assert "outcome: ok" in result.stdout and "reward: 0" in result.stdout


def test_run_with_a_task_reports_its_outcome_and_score() -> None:
    result = cli("run", "--task", "add")
    assert result.returncode == 0, result.stderr
    assert "task add:" in result.stdout and "tool result add: 5555" in result.stdout
    assert "outcome: ok (the episode was still running after 1 turn)   reward: 1" in result.stdout
    assert "running" not in result.stdout.replace("still running", "")


def test_a_task_without_prompt_is_rejected_at_load_with_file_and_line(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "ok", "prompt": "p"}\n\n{"id": "empty"}\n')
    result = cli("rollout", str(tasks), "--out", str(tmp_path / "o.jsonl"))
    assert result.returncode == 2
    assert f"{tasks}:3: the task has no 'prompt'" in result.stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_help_shows_defaults_and_exit_statuses() -> None:
    rollout = cli("rollout", "--help")
    assert rollout.returncode == 0
    assert "--max-turns" in rollout.stdout and "(default: 1)" in " ".join(rollout.stdout.split())
    for args in (("--help",), ("run", "--help")):
        text = " ".join(cli(*args).stdout.split())
        assert "3 the harness never started (startup_failed)" in text
        assert "1 a turn failed" in text


def test_python_dash_m_gym_harness_runs_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gym_harness", "run", "--task", "finish"],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "outcome: done   reward: 1" in result.stdout


def test_install_clis_says_what_it_installs_and_shows_progress(tmp_path: Path) -> None:
    """The script runs against a stand-in npm (the registry is not this test's business)."""
    ci = tmp_path / ".ci"
    ci.mkdir()
    for name in ("install-clis.sh", "clis-package.json"):
        shutil.copy(ROOT / ".ci" / name, ci / name)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    npm = fake_bin / "npm"
    npm.write_text('#!/bin/sh\necho "npm $*"\nmkdir -p node_modules/.bin\n')
    npm.chmod(0o755)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def install() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(ci / "install-clis.sh")],
            capture_output=True, text=True, env=env, timeout=30, check=False,
        )  # fmt: skip

    first = install()
    assert first.returncode == 0, first.stderr
    pinned = json.loads((ci / "clis-package.json").read_text())["dependencies"]
    listed = [line.strip() for line in first.stdout.splitlines() if line.startswith("  ")]
    assert listed == [f"{name}@{version}" for name, version in pinned.items()]
    (npm_line,) = [line for line in first.stdout.splitlines() if line.startswith("npm ")]
    assert "install" in npm_line and "--loglevel=http" in npm_line  # a line per download
    assert first.stdout.index("installing into") < first.stdout.index("npm install")
    again = install()
    assert "already installed" in again.stdout and "npm " not in again.stdout


def model_rollout(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``gym-harness rollout --mode model``, with tests/ importable for the policy module."""
    tests = str(ROOT / "tests")
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "gym_harness.rollout.cli", "rollout", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": path},
        cwd=tmp_path,
    )


def test_model_mode_rollout_with_a_policy_module(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "add", "prompt": "what is 2+3?", "meta": {"expect": "5"}}\n')
    out = tmp_path / "out.jsonl"
    policy = "support.policies:add_then_answer"
    result = model_rollout(
        tmp_path, str(tasks), "-n", "2", "--mode", "model", "--policy", policy, "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and len({r["rollout_id"] for r in records}) == 2
    for record in records:
        assert (record["reward"], record["outcome"], record["error_type"]) == (1.0, "done", "")
        roles = [m["role"] for m in record["messages"]]
        assert roles == ["user", "assistant", "tool", "assistant"]
        assert record["messages"][2]["content"] == "5"
        assert record["messages"][-1]["content"] == "The sum is 5."
        first, second = record["calls"]
        assert first["messages"] == [{"role": "user", "content": "what is 2+3?"}]
        assert "add" in [t["function"]["name"] for t in first["tools"]]
        assert first["completion"]["tool_calls"][0]["name"] == "add"
        assert (first["token_ids"], first["logprobs"]) == ([11, 12], [-0.1, -0.2])
        assert second["messages"] == record["messages"][:3]
        assert second["completion"]["content"] == "The sum is 5."
        assert second["token_ids"] is None and not second["side"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--policy", "support.policies:add_then_answer"], "add --mode model"),
        (["--mode", "model"], "--mode model needs --policy"),
        (["--mode", "model", "--policy", "nowhere_xyz:fn"], "Cannot import policy"),
        (
            ["--mode", "model", "--policy", "support.policies:add_then_answer", "--max-steps", "0"],
            "--max-steps must be at least 1",
        ),
    ],
)
def test_model_mode_rollout_bad_input(tmp_path: Path, args: list[str], needle: str) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "add", "prompt": "what is 2+3?"}\n')
    result = model_rollout(tmp_path, str(tasks), "--out", str(tmp_path / "o.jsonl"), *args)
    assert result.returncode == 2
    assert needle in result.stderr, result.stderr


def test_a_rollout_that_fails_before_a_record_leaves_an_existing_out_file_alone(
    tmp_path: Path,
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "fin", "prompt": "/done Jupiter"}\n')
    out = tmp_path / "out.jsonl"
    out.write_text('{"kept": true}\n')
    result = cli("rollout", str(tasks), "--env", "gym_harness/Nope-v0", "--out", str(out))
    assert result.returncode == 2, result.stderr
    assert "Nope" in result.stderr
    assert out.read_text() == '{"kept": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "tasks.jsonl"]


def test_ctrl_c_mid_rollout_keeps_the_records_written_beside_the_out_file(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "fast", "prompt": "/done one"}\n{"id": "slow", "prompt": "stall"}\n')
    out = tmp_path / "out.jsonl"
    out.write_text('{"kept": true}\n')
    command = json.dumps([sys.executable, AGENT])
    argv = [sys.executable, "-m", "gym_harness.rollout.cli", "rollout", str(tasks)]
    argv += ["--env", "gym_harness/Command-v0", "--set", f"command={command}", "--out", str(out)]
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as child:
        try:
            assert child.stderr is not None
            seen = ""
            while "1/2" not in seen:  # the first record is written
                line = child.stderr.readline()
                assert line, f"the rollout ended early: {seen}"
                seen += line
            child.send_signal(signal.SIGINT)
            assert child.wait(timeout=30) == 130
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    assert out.read_text() == '{"kept": true}\n'
    partial = [
        json.loads(line) for line in (tmp_path / "out.jsonl.partial").read_text().splitlines()
    ]
    assert [record["task_id"] for record in partial] == ["fast"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "out.jsonl",
        "out.jsonl.partial",
        "tasks.jsonl",
    ]
