"""The gym-harness command, end to end, as a user runs it (a real subprocess)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support import LINE_AGENT
from support.signals import default_sigint, ignores_sigint

from gym_harness.agents.demo import demo_tasks

AGENT = str(LINE_AGENT)
ROOT = Path(__file__).resolve().parents[2]
CompletedRun = subprocess.CompletedProcess[str]


#: The commands here take seconds; the bounds leave room for a machine shared with other
#: test runs (load averages of 30 on 2 cores were seen), never for a hang.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
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
    # Off a terminal: a line per episode, and no control character (no bar drawn over).
    progress = [line for line in result.stderr.splitlines() if "ep/s" in line]
    assert [line.split()[1] for line in progress] == ["1/4", "2/4", "3/4", "4/4"], result.stderr
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", result.stderr), result.stderr
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
        (["run", "--set", "no_such_option=1"], "unknown keyword 'no_such_option'"),
        (["run", "--set", "novalue"], "KEY=VALUE"),
        (["run", "--env", "CartPole-v1"], "gym-harness runs gym_harness env ids"),
        (["run", "--env", "CartPole-v1", "--list-keywords"], "is not a gym_harness env id"),
    ],
)
def test_bad_input_exits_nonzero_with_one_line(args: list[str], needle: str) -> None:
    result = cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gym-harness: error:"), result.stderr
    assert needle in lines[0]


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--env", "Reference-v0"],
        ["--env", "Reference-v0", "run"],  # options before the command are its own
        ["run", "--env", "Reference"],
        ["run", "--env", "gym_harness/Refrence-v0"],
    ],
)
def test_an_env_id_of_ours_misnamed_gets_its_full_id(args: list[str]) -> None:
    result = cli(*args)
    assert result.returncode == 2
    assert result.stderr.startswith("gym-harness: error: Environment `"), result.stderr
    assert "Did you mean `gym_harness/Reference-v0`?" in result.stderr
    assert "--env gym_harness/Reference-v0" in result.stderr


def test_a_misspelled_option_prints_its_commands_usage_and_the_closest_option() -> None:
    result = cli("run", "--tsak", "t1")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: gym-harness run "), result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert (
        error == "gym-harness run: error: unrecognized arguments: --tsak (did you mean --task?), t1"
    )
    rollout = cli("rollout", "t.jsonl", "--out", "o.jsonl", "--max-step", "3", "--follow-upp", "x")
    assert rollout.stderr.startswith("usage: gym-harness rollout "), rollout.stderr
    assert "--follow-upp (did you mean --follow-up?)" in rollout.stderr


def test_the_bare_command_prints_the_short_help() -> None:
    result = cli()
    assert result.returncode == 2
    assert result.stderr.startswith("usage: gym-harness "), result.stderr
    assert "run one episode" in result.stderr and "run N episodes per task" in result.stderr
    assert "start with `gym-harness run`" in result.stderr
    assert "required: command" not in result.stderr


def test_a_missing_cli_is_named_in_the_commands_words() -> None:
    result = cli("run", "--env", "gym_harness/Codex-v0", "--set", "executable=no-such-codex")
    assert result.returncode == 2
    assert "Codex is not installed here: `no-such-codex`" in result.stderr
    assert "pass --set executable=/abs/path/to/codex." in result.stderr
    assert "executable='" not in result.stderr


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
    ran = subprocess.run(shell, shell=True, capture_output=True, text=True, timeout=240)
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


def test_unknown_keyword_leads_with_the_suggestion_and_points_to_the_list() -> None:
    result = cli("run", "--set", "reward=1")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        "gym-harness: error: unknown keyword 'reward' for gym_harness/Reference-v0: "
        "did you mean 'reward_fn'?"
    ), line
    assert line.endswith(
        "`gym-harness run --env gym_harness/Reference-v0 --list-keywords` lists every keyword."
    )
    assert "turn_timeout_s" not in line  # the list is --list-keywords' job, not this line's
    listed = cli("run", "--list-keywords")
    assert listed.returncode == 0, listed.stderr
    for name in ("reward_fn", "tasks", "tools", "render_mode", "turn_timeout_s", "policy"):
        assert f"\n  {name}: " in listed.stdout
    assert "  turn_timeout_s: float = 900.0\n      Wall-clock budget of one turn" in listed.stdout


def test_list_keywords_names_every_config_field_with_the_harness_defaults() -> None:
    from gym_harness import HarnessConfig
    from gym_harness.rollout.keywords import config_fields

    result = cli("run", "--env", "gym_harness/Command-v0", "--list-keywords")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "harness 'reference'" not in text  # Command-v0's harness has no options
    for field in dataclasses.fields(HarnessConfig):
        (keyword,) = [k for k in config_fields() if k.name == field.name]
        assert f"\n  {field.name}: {keyword.type} = {keyword.default}\n" in text


def test_several_unknown_keywords_each_get_their_suggestion() -> None:
    result = cli("run", "--set", "reward=1", "--set", "idel_timeout_s=3")
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "unknown keywords 'reward', 'idel_timeout_s'" in line
    assert "did you mean 'reward_fn' for 'reward'? did you mean 'idle_timeout_s' for" in line


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
    header, *lines = result.stdout.splitlines()
    assert header.startswith("episode ") and header.endswith("(reference)")  # no task
    assert lines[:3] == ["--- turn 1", "user: hi there", "harness: You said: hi there"]
    assert "/call" not in result.stdout  # no demo task's prompt
    assert "outcome: ok" in result.stdout and "reward: 0" in result.stdout


def test_run_indents_continuation_lines_and_says_when_a_reply_is_empty() -> None:
    result = cli("run", "--message", "first line\nsecond line", "--message", "/done")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("user: first line")
    assert lines[start : start + 4] == [
        "user: first line",
        "      second line",
        "harness: You said: first line",
        "         second line",
    ]
    assert "harness: (an empty reply)" in lines


def test_run_with_a_task_reports_its_outcome_and_score() -> None:
    result = cli("run", "--task", "add")
    assert result.returncode == 0, result.stderr
    assert ", task add\n" in result.stdout and "tool result add: 5555" in result.stdout
    assert "outcome: ok (the episode was still running after 1 turn)   reward: 1" in result.stdout
    assert "running" not in result.stdout.replace("still running", "")


def test_run_prints_the_prompt_once_and_each_line_in_the_order_it_happened() -> None:
    result = cli("run", "--task", "finish")
    assert result.returncode == 0, result.stderr
    prompt = next(t["prompt"] for t in demo_tasks() if t["id"] == "finish")
    shown = "user: " + prompt.replace("\n", "\n      ")  # continuation lines indented
    assert result.stdout.count(shown) == 1  # as the user message, not in the header too
    lines = result.stdout.splitlines()
    assert lines[0].startswith("episode ") and lines[0].endswith("(reference), task finish")
    order = ["--- turn 1", "user: ", "  tool call lookup", "  tool result lookup: Jupiter"]
    order += ["harness: ", "(turn 1: ", "outcome: done   reward: 1"]
    found = [next(i for i, line in enumerate(lines) if line.startswith(o)) for o in order]
    assert found == sorted(found), lines
    assert "\x1b" not in result.stdout  # no status line off a terminal


def test_version_names_the_package_version() -> None:
    import gym_harness

    result = cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"gym-harness {gym_harness.__version__} (gymnasium ")


def test_a_task_without_prompt_is_rejected_at_load_with_file_and_line(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "ok", "prompt": "p"}\n\n{"id": "empty"}\n')
    result = cli("rollout", str(tasks), "--out", str(tmp_path / "o.jsonl"))
    assert result.returncode == 2
    assert f"{tasks}:3: the task has no 'prompt'" in result.stderr
    assert not (tmp_path / "o.jsonl").exists()


def help_entries(text: str) -> dict[str, str]:
    """``--help`` output's options: the option's first name -> its help, on one line."""
    entries: dict[str, str] = {}
    current = None
    for line in text.split("options:", 1)[1].split("\n\n", 1)[0].splitlines():
        if line.startswith("  -"):
            current = line.split()[0].rstrip(",")
            entries[current] = line
        elif current is not None:
            entries[current] += " " + line.strip()
    return {name: " ".join(entry.split()) for name, entry in entries.items()}


@pytest.mark.parametrize("command", ["run", "rollout"])
def test_help_shows_every_default(command: str) -> None:
    result = cli(command, "--help")
    assert result.returncode == 0, result.stderr
    entries = help_entries(result.stdout)
    assert {"--env", "--seed", "--set"} <= set(entries)
    for name, entry in entries.items():
        if name not in ("-h", "--list-keywords", "--out"):
            assert "default" in entry, entry
    assert "(default: 0)" in entries["--seed"]
    assert "(default: gym_harness/Reference-v0)" in entries["--env"]
    if command == "rollout":
        assert "(default: 1)" in entries["-n"] and "(default: 1)" in entries["--max-turns"]
        assert "(default: Continue.)" in entries["--follow-up"]
        assert "(default: 100)" in entries["--max-steps"]
        assert "(required)" in entries["--out"]


def test_help_shows_exit_statuses() -> None:
    for args in (("--help",), ("run", "--help")):
        text = " ".join(cli(*args).stdout.split())
        assert "3 the harness never started (startup_failed)" in text
        assert "1 a turn failed" in text


def test_python_dash_m_gym_harness_runs_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gym_harness", "run", "--task", "finish"],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "outcome: done   reward: 1" in result.stdout


def stand_in_clis_install(tmp_path: Path, node_version: str) -> Callable[[], CompletedRun]:
    """``install-clis.sh`` in a copy of ``.ci``, against a stand-in npm and node (the
    registry is not these tests' business); returns a function that runs it."""
    ci = tmp_path / ".ci"
    ci.mkdir()
    for name in ("install-clis.sh", "clis-package.json"):
        shutil.copy(ROOT / ".ci" / name, ci / name)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    npm = fake_bin / "npm"
    npm.write_text('#!/bin/sh\necho "npm $*"\nmkdir -p node_modules/.bin\n')
    node = fake_bin / "node"
    node.write_text(f"#!/bin/sh\necho {node_version}\n")
    for program in (npm, node):
        program.chmod(0o755)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def install() -> CompletedRun:
        return subprocess.run(
            ["bash", str(ci / "install-clis.sh")],
            capture_output=True, text=True, env=env, timeout=30, check=False,
        )  # fmt: skip

    return install


def test_install_clis_says_what_it_installs_and_shows_progress(tmp_path: Path) -> None:
    install = stand_in_clis_install(tmp_path, "v22.11.0")
    first = install()
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""  # a recent enough Node.js: no warning
    assert "about 1.8 GB" in first.stdout
    pinned = json.loads((ROOT / ".ci" / "clis-package.json").read_text())["dependencies"]
    listed = [line.strip() for line in first.stdout.splitlines() if line.startswith("  ")]
    assert listed == [f"{name}@{version}" for name, version in pinned.items()]
    (npm_line,) = [line for line in first.stdout.splitlines() if line.startswith("npm ")]
    assert "install" in npm_line and "--loglevel=http" in npm_line  # a line per download
    assert first.stdout.index("installing into") < first.stdout.index("npm install")
    again = install()
    assert "already installed" in again.stdout and "npm " not in again.stdout


def test_install_clis_checks_the_node_version_first_and_says_what_to_install(
    tmp_path: Path,
) -> None:
    result = stand_in_clis_install(tmp_path, "v18.19.1")()
    assert result.returncode == 1
    assert "npm " not in result.stdout  # checked before anything is installed
    assert "Node.js v18.19.1 is too old for the pinned CLIs (they need 20 or newer)" in (
        result.stderr
    )
    assert "install Node.js 22 or newer" in result.stderr


def test_install_clis_on_node_20_warns_of_the_engine_and_installs(tmp_path: Path) -> None:
    result = stand_in_clis_install(tmp_path, "v20.20.2")()
    assert result.returncode == 0, result.stderr
    assert "@agentclientprotocol/claude-agent-acp asks for 22 or newer" in result.stderr
    assert "EBADENGINE" in result.stderr and "install Node.js 22 or newer" in result.stderr
    assert "npm install" in result.stdout
    pinned = json.loads((ROOT / ".ci" / "clis-package.json").read_text())["dependencies"]
    assert "@agentclientprotocol/claude-agent-acp" in pinned


def model_rollout(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``gym-harness rollout --mode model``, with tests/ importable for the policy module."""
    tests = str(ROOT / "tests")
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "gym_harness.rollout.cli", "rollout", *args],
        capture_output=True,
        text=True,
        timeout=240,
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
    with subprocess.Popen(
        argv, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint
    ) as child:
        try:
            assert child.stderr is not None
            seen = ""
            while "1/2" not in seen:  # the first record is written
                line = child.stderr.readline()
                assert line, f"the rollout ended early: {seen}"
                seen += line
            assert not ignores_sigint(child.pid)
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


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.slow
def test_the_ctrl_c_test_passes_in_a_run_started_with_sigint_ignored(tmp_path: Path) -> None:
    """As under ``nohup`` or ``cmd &``: the run, and all it starts, inherit SIGINT ignored."""
    test = f"{__file__}::test_ctrl_c_mid_rollout_keeps_the_records_written_beside_the_out_file"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test]
    argv += ["--basetemp", str(tmp_path / "run")]
    with subprocess.Popen(
        argv,
        cwd=Path(__file__).parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ignore_sigint,
    ) as run:
        try:
            assert ignores_sigint(run.pid)
            output, _ = run.communicate(timeout=400)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait(10)
    assert run.returncode == 0, output
    assert "1 passed" in output, output


# ---------------------------------------------------------------- modules of the current directory

#: The console script pip writes for ``gym-harness`` (its own directory goes first on
#: sys.path, as for any script), so a test can run it from a directory of its own.
CONSOLE_SCRIPT = "import sys\nfrom gym_harness.rollout.cli import main\nsys.exit(main())\n"


def console_script(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``gym-harness ARGS`` as the installed console script runs, in ``tmp_path/work``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "gym-harness"
    script.write_text(CONSOLE_SCRIPT)
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path / "work",
    )  # fmt: skip


def test_tools_and_policy_modules_in_the_current_directory_import(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "mytools.py").write_text(
        "def add(a: int, b: int) -> int:\n    return a + b\n\nTOOLS = [add]\n"
    )
    (work / "mypolicy.py").write_text(
        "def act(request):\n    return 'The answer is 5.'\n"
    )  # fmt: skip
    result = console_script(
        tmp_path, "run", "--set", "tools=mytools:TOOLS", "--message", '/call add {"a": 2, "b": 3}'
    )
    assert result.returncode == 0, result.stderr
    assert "tool result add: 5" in result.stdout
    (work / "tasks.jsonl").write_text('{"id": "t", "prompt": "what is 2+3?"}\n')
    result = console_script(
        tmp_path, "rollout", "tasks.jsonl", "--mode", "model", "--policy", "mypolicy:act",
        "--out", "out.jsonl",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (record,) = [json.loads(line) for line in (work / "out.jsonl").read_text().splitlines()]
    assert record["messages"][-1]["content"] == "The answer is 5."


def test_a_tools_string_naming_a_function_says_what_it_got_and_what_it_expected(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "mytools.py").write_text("def add(a: int, b: int) -> int:\n    return a + b\n")
    result = console_script(tmp_path, "run", "--set", "tools=mytools:add")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "tools import string 'mytools:add' names the function 'add'" in line
    assert "it must name a FastMCP server or a list of callables" in line
    assert "put `TOOLS = [add]` in mytools and pass 'mytools:TOOLS'" in line


def test_a_module_that_is_not_found_says_where_python_looked(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    result = console_script(tmp_path, "run", "--set", "tools=nowhere_mod:TOOLS")
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "No module named 'nowhere_mod'" in line
    assert "the current directory" in line and "PYTHONPATH" in line
