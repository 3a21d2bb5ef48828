"""An owner of harnesses for the tests that kill it; prints one JSON report line first.

    owner.py                              a HarnessProcess running the family script:
                                          {"family": [harness, child, grandchild, daemon],
                                           "keeper": pid}
    owner.py process MODE PIDFILE [--no-cgroup]
                                          a HarnessProcess running a hostile mode of
                                          harness.py: {"harness": pid, "keeper": pid}
    owner.py env [TIER]                   a HarnessEnv mid-episode (one turn done) on
                                          tests/support/line_agent.py, with sandbox=TIER
                                          (default "auto"): {"root": dir, "harness": pid,
                                          "netns": the harness's network namespace inode}
    owner.py vector N                     an AsyncVectorEnv of N such envs after reset:
                                          {"workers": [pid, ...], "harnesses": [pid, ...]}

Then it reads commands on stdin, one per line, and answers each with a JSON line:
``write TEXT`` (to the harness), ``lost`` (wait until the keeper is seen lost),
``terminate`` (``close(terminate=True)`` of the vector env). Without a command it
waits to be killed (bounded: 60 s).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from gym_harness.config import HarnessConfig, ProcessSpec
from gym_harness.process.harness_process import HarnessProcess
from gym_harness.readiness import start_ready

SCRIPT = Path(__file__).with_name("harness.py")
AGENT = str(Path(__file__).parent.parent / "line_agent.py")


def report(data: dict[str, Any]) -> None:
    print(json.dumps(data), flush=True)


def family() -> None:
    proc = HarnessProcess(ProcessSpec(command=(sys.executable, str(SCRIPT), "family")))
    start_ready(proc, lambda line: "ready" in line)
    pids = json.loads(proc.read_line(10) or "{}")["pids"]
    report({"family": pids, "keeper": proc.keeper_pid})
    time.sleep(60)  # bounded: the test kills us long before this


def process(mode: str, pidfile: str, cgroup: bool) -> HarnessProcess:
    config = HarnessConfig(
        command=(sys.executable, str(SCRIPT), mode, pidfile), stop_grace_s=0.3, cgroup=cgroup
    )
    proc = HarnessProcess(config.process_spec())
    start_ready(proc, lambda line: "ready" in line)
    report({"harness": proc.pid, "keeper": proc.keeper_pid})
    return proc


def serve(proc: HarnessProcess | None, envs: Any = None) -> None:
    for line in sys.stdin:
        command, _, arg = line.rstrip("\n").partition(" ")
        if command == "write" and proc is not None:
            proc.write_line(arg, timeout_s=10)
            report({"written": arg})
        elif command == "lost" and proc is not None:
            deadline = time.monotonic() + 30
            while not proc.keeper_lost and time.monotonic() < deadline:
                time.sleep(0.01)
            report({"keeper_lost": proc.keeper_lost, "tail": proc.stderr_tail()})
        elif command == "terminate" and envs is not None:
            envs.close(terminate=True)
            report({"closed": True})
    time.sleep(60)  # stdin closed: wait to be killed (bounded)


def main() -> None:
    if len(sys.argv) < 2:
        family()
        return
    kind = sys.argv[1]
    if kind == "process":
        proc = process(sys.argv[2], sys.argv[3], "--no-cgroup" not in sys.argv)
        serve(proc)
    elif kind == "env":
        from gym_harness.env import HarnessEnv

        tier = sys.argv[2] if len(sys.argv) > 2 else "auto"
        env = HarnessEnv("command", command=[sys.executable, AGENT], sandbox=tier)
        env.reset(seed=0)
        env.step("hello")  # mid-episode: one turn done, the next not asked
        assert env.workspace is not None and env.process is not None
        pid = env.process.pid
        netns = os.stat(f"/proc/{pid}/ns/net").st_ino
        report({"root": str(env.workspace.parent.parent), "harness": pid, "netns": netns})
        serve(None)
    elif kind == "vector":
        import gymnasium

        import gym_harness  # noqa: F401  (registers the env ids)

        envs = gymnasium.make_vec(
            "gym_harness/Command-v0", num_envs=int(sys.argv[2]), command=[sys.executable, AGENT]
        )
        envs.reset(seed=0)
        harnesses = [
            p.pid
            for p in psutil.Process().children(recursive=True)
            if AGENT in " ".join(p.cmdline())
        ]
        report({"workers": [p.pid for p in envs.processes], "harnesses": harnesses})
        serve(None, envs)


if __name__ == "__main__":
    main()
