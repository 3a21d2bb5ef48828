"""Interrupts, stray closes and dropped envs: nothing is left, and no reply shifts.

* Ctrl-C (SIGINT to the env's own process) at random instants of reset, step and close,
  in turn and model mode: after ``close()`` no process, keeper, thread or workspace is
  left, and a step never answers another step's message
  (``support/scripts/interrupted.py`` runs the trials in a process of its own: a test
  cannot interrupt pytest itself).
* Ctrl-C while the env stops a harness that is slow to die.
* ``close()`` from another thread during a step; an env dropped without ``close()``.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium
import psutil
import pytest
from gymnasium.error import ResetNeeded
from support import LINE_AGENT, SUPPORT
from support.signals import default_sigint, ignores_sigint

import gym_harness  # noqa: F401  (registers the env ids)
from gym_harness import ConfigError, HarnessEnv

INTERRUPTED = SUPPORT / "scripts" / "interrupted.py"
TRIALS = 50
#: SIGINTs come at random within this long after each trial starts: a trial's resets,
#: steps and close take about that long.
SPREAD_S = {"turns": 1.5, "model": 1.5}
ROOT = Path(__file__).resolve().parents[2]


def child_env(tmp: Path) -> dict[str, str]:
    """The child's environment: this checkout first, and a temporary directory of its own
    (so the workspaces it counts are its own)."""
    path = os.pathsep.join([str(ROOT), str(SUPPORT.parent)])
    return {**os.environ, "PYTHONPATH": path, "TMPDIR": str(tmp)}


def listening() -> set[int]:
    """The TCP ports this process listens on (the env's loopback servers)."""
    return {
        c.laddr.port
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


def root_of(env: gymnasium.Env[Any, Any]) -> Path:
    """The directory of ``env``'s episodes (its current workspace's grandparent)."""
    workspace = HarnessEnv.of(env).workspace
    assert workspace is not None
    return workspace.parent.parent


def gone(pids: list[int], timeout_s: float) -> list[int]:
    """The pids of ``pids`` still alive after ``timeout_s`` (zombies count as gone)."""
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _alive(pid)]
        time.sleep(0.05)
    return alive


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
@pytest.mark.timeout(300)  # 50 trials of about a second each, and their checks
@pytest.mark.parametrize("mode", ["turns", "model"])
def test_ctrl_c_at_random_instants_leaves_nothing_and_shifts_no_reply(
    mode: str, tmp_path: Path
) -> None:
    rng = random.Random(f"interrupts-{mode}")
    argv = [sys.executable, str(INTERRUPTED), mode]
    child = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(tmp_path),
        preexec_fn=default_sigint,
    )
    reports: list[dict[str, Any]] = []
    try:
        assert child.stdin is not None and child.stdout is not None
        assert json.loads(child.stdout.readline()) == {"ready": True}
        assert not ignores_sigint(child.pid)
        landed = 0
        while landed < TRIALS:
            time.sleep(rng.uniform(0.0, SPREAD_S[mode]))
            child.send_signal(signal.SIGINT)
            line = child.stdout.readline()  # each SIGINT ends a trial, and its check
            assert line, "the trial process died"
            report = json.loads(line)
            reports.append(report)
            landed += report["phase"] in ("reset", "step", "close")
        child.stdin.close()  # no more trials: the next SIGINT ends the one under way
        child.send_signal(signal.SIGINT)
        tail = [json.loads(line) for line in child.stdout]
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()
    assert tail[-1].keys() == {"held"}
    reports += tail[:-1]
    wrong = [r for r in reports if r["leftover"]]
    assert wrong == []
    phases = {r["phase"] for r in reports}
    assert {"reset", "step"} <= phases, phases


SLOW_TO_DIE = """
import json, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: None)  # dies only by SIGKILL, after the grace
print(json.dumps({"type": "ready"}), flush=True)
for line in sys.stdin:
    print(json.dumps({"type": "turn_complete", "response": "ok"}), flush=True)
"""

STOP_UNDER_CTRL_C = """
import json, os, signal, sys, threading, time
import psutil
from gym_harness import HarnessEnv
env = HarnessEnv("command", command=[sys.executable, "-c", sys.argv[1]], stop_grace_s=2.0)
env.reset()
root = str(env.workspace.parent.parent)
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
started = time.monotonic()
try:
    env.close()
    outcome = "returned"
except KeyboardInterrupt:
    outcome = "interrupted"
left = [p.pid for p in psutil.Process().children(recursive=True)]
ports = [c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == "LISTEN"]
print(json.dumps({"outcome": outcome, "after_s": time.monotonic() - started, "left": left,
                  "ports": ports, "root_exists": os.path.exists(root),
                  "sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN}), flush=True)
"""


def test_ctrl_c_while_a_slow_harness_stops_is_raised_once_the_tree_is_gone(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [sys.executable, "-c", STOP_UNDER_CTRL_C, SLOW_TO_DIE],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(tmp_path),
        check=False,
        preexec_fn=default_sigint,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert not report["sigint_ignored"]
    assert report["outcome"] == "interrupted"  # late, not lost
    assert report["after_s"] >= 1.5  # it waited for the grace: the stop ran whole
    assert report["left"] == [] and report["ports"] == [] and not report["root_exists"]


def test_close_from_another_thread_during_a_step_ends_it_and_stays_closed() -> None:
    ports = listening()
    env = gymnasium.make("gym_harness/Command-v0", command=[sys.executable, str(LINE_AGENT)])
    env.reset()
    root = root_of(env)
    assert listening() - ports  # the bridge
    inner = HarnessEnv.of(env)
    assert inner.process is not None
    harness = inner.process.pid
    closer = threading.Timer(0.5, env.close)
    closer.start()
    try:
        with pytest.raises(ResetNeeded, match="close"):
            env.step("stall")  # silent until closed
    finally:
        closer.join(10)
    assert not closer.is_alive()
    with pytest.raises(ConfigError, match="closed"):
        env.reset()
    with pytest.raises(ResetNeeded):
        env.step("again")
    env.close()  # idempotent
    assert gone([harness], 5) == []
    assert not root.exists()
    assert listening() - ports == set()


def test_an_env_dropped_without_close_ends_its_harness_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    threads, ports = {t.ident for t in threading.enumerate()}, listening()
    env = gymnasium.make("gym_harness/Command-v0", command=[sys.executable, str(LINE_AGENT)])
    env.reset()
    root = root_of(env)
    assert listening() - ports  # the bridge
    assert env.step("hi")[0] == "echo: hi"
    ours = [p.pid for p in psutil.Process().children(recursive=True)]  # keeper and harness
    assert len(ours) >= 2
    with caplog.at_level(logging.WARNING, logger="gym_harness"):
        del env
        gc.collect()
    assert gone(ours, 5) == []
    assert not root.exists()
    assert listening() - ports == set()
    dropped = [r for r in caplog.records if "dropped without close()" in r.getMessage()]
    assert len(dropped) == 1
    deadline = time.monotonic() + 5
    while (started := _started_since(threads)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started == set()


#: Threads of the process, not of an env: the keepers' watcher, started with the first.
PROCESS_WIDE = {"gym-harness-keepers"}


def _started_since(threads: set[int | None]) -> set[str]:
    return {
        t.name
        for t in threading.enumerate()
        if t.ident not in threads and t.name not in PROCESS_WIDE
    }
