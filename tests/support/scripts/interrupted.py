"""Episodes that Ctrl-C interrupts at random instants; one JSON report per trial.

    interrupted.py turns|model

Each trial makes an env, then resets, steps and closes it, episode after episode, until
a SIGINT (sent by the test at random times) lands. The interrupt is caught, its phase
noted (``make``, ``reset``, ``step`` or ``close``), and the trial checks, with further
SIGINTs held back, that the env keeps its contract:

* a step after the interrupt raises ``ResetNeeded`` or answers its own message;
* after a reset, a step answers its own message (no reply of an interrupted turn);
* after ``close()``: no process of ours, no thread of the env, no workspace is left.

It prints ``{"trial", "phase", "leftover"}`` (``leftover`` lists what broke) and goes
on to the next trial; a line on stdin (or its end) stops it. A SIGINT that lands while
a trial checks is counted in ``held`` and ignored.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
from gymnasium.error import ResetNeeded

from gym_harness import ConfigError, HarnessEnv

SUPPORT = Path(__file__).resolve().parent.parent
LINE_AGENT = SUPPORT / "line_agent.py"
MODEL_AGENT = SUPPORT / "scripts" / "light_model_agent.py"

phase = "idle"
held = 0


def hold(signum: int, frame: Any) -> None:
    global held
    held += 1


def make(mode: str) -> HarnessEnv:
    # Each answer of the harness takes 0.3 s, so that steps, not only resets, get interrupted.
    if mode == "model":
        command = [sys.executable, str(MODEL_AGENT), "--pause", "0.3"]
        return HarnessEnv("command", command=command, mode="model", policy_timeout_s=30)
    return HarnessEnv("command", command=[sys.executable, str(LINE_AGENT), "--delay", "0.3"])


def answered(mode: str, env: HarnessEnv, message: str) -> bool:
    """Whether a step (after a reset with ``message``) answers that message."""
    if mode == "model":
        obs, _ = env.reset(options={"task": {"id": "t", "prompt": message}})
        request = json.loads(obs)
        return bool(request["messages"]) and request["messages"][-1]["content"] == message
    env.reset()
    reply = env.step(message)[0]
    return reply == f"echo: {message}"


def episode(mode: str, env: HarnessEnv, trial: int) -> None:
    global phase
    for n in range(3):
        phase = "reset"
        message = f"m{trial}-{n}"
        if mode == "model":
            env.reset(options={"task": {"id": "t", "prompt": message}})
            phase = "step"
            env.step("one")  # the harness pauses, then makes its second call
            assert env.step("fine")[2]  # its turn, and the episode, end
        else:
            env.reset()
            phase = "step"
            assert env.step(message)[0] == f"echo: {message}"


def ours(root: str) -> list[str]:
    return sorted(p for p in os.listdir(root) if p.startswith("gym_harness-"))


def check(mode: str, env: HarnessEnv | None, threads: Counter[str], roots: list[str]) -> list[str]:
    """What is wrong after an interrupt (SIGINT held meanwhile)."""
    wrong = []
    if env is not None:
        try:
            reply = env.step("after")
            if mode == "turns" and reply[0] != "echo: after":
                wrong.append(f"a step after the interrupt answered {reply[0]!r}")
        except ResetNeeded:
            pass
        try:
            if not answered(mode, env, "fresh"):
                wrong.append("a fresh episode's first step did not answer its own message")
        except (ResetNeeded, ConfigError):
            pass  # closed by an interrupted close(): it stays closed
        env.close()
    left = [p.pid for p in psutil.Process().children(recursive=True)]
    if left:
        wrong.append(f"processes left: {left}")
    now = Counter(t.name for t in threading.enumerate())
    extra = now - threads
    if extra:
        wrong.append(f"threads left: {dict(extra)}")
    new = sorted(set(ours(tempfile.gettempdir())) - set(roots))
    if new:
        roots.extend(new)  # reported once
        wrong.append(f"workspaces left: {new}")
    return wrong


def main() -> None:
    global phase
    mode = sys.argv[1]
    roots = ours(tempfile.gettempdir())
    warm = make(mode)  # the first env starts the package's process-wide threads
    episode(mode, warm, -1)
    warm.close()
    threads = Counter(t.name for t in threading.enumerate())
    stdin = selectors.DefaultSelector()
    stdin.register(sys.stdin, selectors.EVENT_READ)
    print(json.dumps({"ready": True}), flush=True)
    trial = 0
    while not stdin.select(timeout=0):
        env = None
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            phase = "make"
            env = make(mode)
            while True:
                episode(mode, env, trial)
                phase = "close"
                env.close()
                phase = "make"
                env = make(mode)
        except KeyboardInterrupt:
            landed = phase
        signal.signal(signal.SIGINT, hold)
        wrong = check(mode, env, threads, roots)
        print(json.dumps({"trial": trial, "phase": landed, "leftover": wrong}), flush=True)
        trial += 1
    print(json.dumps({"held": held}), flush=True)


if __name__ == "__main__":
    main()
