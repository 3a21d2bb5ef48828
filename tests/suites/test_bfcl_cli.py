"""BFCL-v0 with real CLIs on loopback: Codex in model mode (the ground truth scores 1.0),
and ``gym-harness rollout`` in turn mode, Codex with a stand-in model server, every user
turn sent by ``scripted_user`` and the CLI's own call scored by BFCL's checker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.bfcl import play
from support.cli import cli_path, real_cli
from support.model_server import ScriptedModelServer

from gym_harness.suites.bfcl import BFCLEnv, GroundTruthPolicy, tasks
from gym_harness.suites.bfcl.data import load_category

#: A task on the file system alone whose first turn's ground truth is ``ls(a=True)``.
TASK = "multi_turn_base_1"


@real_cli(timeout=600)
def test_codex_in_model_mode_completes_a_task_with_the_ground_truth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    env = BFCLEnv(
        harness="codex",
        mode="model",
        model="m1",
        executable=cli_path("codex"),
        startup_timeout_s=60,
        turn_timeout_s=120,
        idle_timeout_s=90,
    )
    try:
        task = next(t for t in env.suite if t.id == TASK)
        # Codex adds user messages of its own: the env says which turn is under way.
        policy = GroundTruthPolicy(task, turn=lambda: env.backends.turn)
        reward, info, requests = play(env, task, policy)
        assert reward == 1.0, info["bfcl"]
        assert info["bfcl"]["turn_valid"] == [True] * len(task.turns)
        assert any(tool["function"]["name"].endswith("ls") for tool in requests[0]["tools"])
    finally:
        env.close()


@real_cli(timeout=600)
def test_rollout_runs_every_turn_of_a_task_on_codex_in_turn_mode(tmp_path: Path) -> None:
    task = next(t for t in tasks("base") if t.id == TASK)
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text(json.dumps(task.to_dict()) + "\n")
    out = tmp_path / "out.jsonl"
    with ScriptedModelServer(tool="ls", arguments={"a": True}) as model:
        settings = {
            "harness": "codex",
            "executable": cli_path("codex"),
            "model": "scripted-model",
            "base_url": model.openai_base_url,
            "turn_timeout_s": 120,
            "idle_timeout_s": 90,
        }
        sets = [f"{key}={json.dumps(value)}" for key, value in settings.items()]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "gym_harness.rollout.cli",
                "rollout",
                str(task_file),
                "--env",
                "gym_harness/BFCL-v0",
                *(arg for pair in sets for arg in ("--set", pair)),
                "--policy",
                "gym_harness.suites.bfcl:scripted_user",
                "--max-turns",
                "10",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=480,
            env={**os.environ, "OPENAI_API_KEY": "test-key"},
            check=False,
        )
        assert result.returncode == 0, result.stderr
        asked = len(model.requests(api="responses"))
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    full = next(t for t in load_category("base") if t.id == TASK)
    assert [turn["message"] for turn in record["turns"]] == list(full.turns), record
    assert asked >= task.turns
    # Turn 0 made the ground truth's one call, ls(a=True), through the bridge; the calls of
    # turn 1 were never made: the checker fails the task there, and the reward is 0.0.
    calls = [e for e in record["turns"][0]["events"] if e["type"] == "tool_call"]
    assert len(calls) == 1, record["turns"][0]["events"]
    assert [turn["reward"] for turn in record["turns"]] == [0.0] * task.turns
    # The user side, not the harness, ended the episode after the task's last turn.
    assert record["outcome"] == "max_turns" and record["reward"] == 0.0
