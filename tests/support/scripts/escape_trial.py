"""One env owner that lets the escaper harness try every escape; prints a JSON report.

Usage: ``python escape_trial.py TIER`` (``auto``, ``strict`` or ``off``), as whichever
user the test runs it as. It makes, outside the env: a secret in ``$HOME``, a directory
of its own (the "user's tmp"), a TCP listener and a UDP socket on 127.0.0.1 that are not
env endpoints. Then, through ``gymnasium.make``, it runs
``tests/support/scripts/escaper.py`` with a task whose hidden file the reward function
reads, tries each escape in one step, and prints ``{"attempts": {name: succeeded},
"details": {...}, "reward": r, "sandbox": trajectory.sandbox}`` (or ``{"error": text}`` when
the env cannot be made).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import gymnasium

import gym_harness  # noqa: F401  (registers the env ids)
from gym_harness import HarnessEnv, RewardContext

ESCAPER = str(Path(__file__).with_name("escaper.py"))
ANSWER = "forty-two"


def reward(ctx: RewardContext) -> float:
    assert ctx.hidden_dir is not None
    return float((ctx.hidden_dir / "answer.txt").read_text() == ANSWER)


def main() -> None:
    tier = sys.argv[1]
    home = Path(os.environ["HOME"])
    secret = home / f"secret-{os.getpid()}.txt"
    secret.write_text("the user's secret")
    outside = Path(tempfile.mkdtemp(prefix="gym-harness-outside-"))
    listener = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    task = {"id": "t", "prompt": "p", "hidden_files": {"answer.txt": ANSWER}}
    me = os.getpid()
    attempts: dict[str, dict[str, Any]] = {
        "read_home": {"try": "read", "arg": str(secret)},
        "read_hidden": {"try": "read", "arg": "../hidden/answer.txt"},
        "write_parent": {"try": "write", "arg": "../planted.txt"},
        "write_tmp": {"try": "write", "arg": str(outside / "planted.txt")},
        "connect_loopback": {"try": "connect", "arg": listener.getsockname()[1]},
        "udp": {"try": "udp", "arg": udp.getsockname()[1]},
        "raw": {"try": "raw"},
        "signal_env": {"try": "signal", "arg": me},
        "environ_env": {"try": "environ", "arg": me},
        "ptrace_env": {"try": "ptrace", "arg": me},
        "mount": {"try": "mount"},
        "netns_env": {"try": "netns", "arg": me},
    }
    if tier != "off":  # denied before any packet leaves; "off" would send one
        attempts["connect_outside"] = {"try": "connect", "arg": 9, "host": "192.0.2.1"}
    try:
        env = gymnasium.make(
            "gym_harness/Command-v0",
            command=[sys.executable, ESCAPER],
            tasks=[task],
            reward_fn=reward,
            sandbox=tier,
            turn_timeout_s=30,
        )
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return
    results: dict[str, bool] = {}
    details: dict[str, str] = {}
    try:
        _, info = env.reset(seed=0)
        assert not info["error_type"], info["error"]
        harness = HarnessEnv.of(env).process
        assert harness is not None
        attempts["signal_keeper"] = {"try": "signal", "arg": harness.keeper_pid}
        total = 0.0
        for name, attempt in attempts.items():
            reply, r, _, _, step_info = env.step(json.dumps(attempt))
            assert not step_info["error_type"], step_info["error"]
            answer = json.loads(reply)
            results[name], details[name] = answer["ok"], answer["detail"]
            total += float(r)
        sandbox = dict(HarnessEnv.of(env).trajectory.sandbox)
        workspace = HarnessEnv.of(env).workspace
        assert workspace is not None
        planted = (workspace.parent / "planted.txt").exists()
    finally:
        env.close()
        secret.unlink()
        for path in outside.iterdir():
            path.unlink()
        outside.rmdir()
    report = {
        "attempts": results,
        "details": details,
        "reward": total / len(attempts),
        "sandbox": sandbox,
        "planted": planted,
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
