"""Latency a model call gains on its way through each side, at ~5 and at ~100 messages.

One minimal harness (``benchmarks/chat_harness.py``: sequential Chat Completions calls,
its conversation growing two messages a call, every call timed by the harness itself)
and an instant model, on five paths:

* **bare**: the harness calls the scripted upstream directly (the floor);
* **capture**: gym_harness's capture proxy (``HarnessEnv(capture=True, upstream=...)``)
  in front of the same upstream, driven with ``reset``/``step``;
* **model**: gym_harness's model mode (``HarnessEnv(mode="model")``): the env is the
  model, and the policy answers each ``step`` at once with a precomputed tool call;
* **openenv**: OpenEnv 0.10.0's capture server (``openenv.core.harness.capture``),
  in-process as its ``CaptureServer`` runs it (``create_app`` under uvicorn in a thread,
  bound to 127.0.0.1 rather than 0.0.0.0), one minted session per turn (the session id
  is the harness's API key, as its docs say);
* **verifiers**: verifiers 0.4's ``InterceptionServer`` (``verifiers.v1.interception``),
  on its own event loop, one ``RolloutSession`` per turn acquired as a rollout does
  (``serve_interception``), its eval client relaying to the upstream.

The competitors need other versions of our dependencies, so each lives in its own
virtual environment (``.venv-openenv``, ``.venv-verifiers``, git-ignored), made on
first use with pip. Every side is a driver process that stays up; the parent asks each
for one turn of ``--calls`` calls per round, the sides alternating round by round, so
machine noise hits all alike. Figures: the median per-call time of calls 2-4 (3-7
messages; the first opens a connection) and of the last three (~100 messages), each
side's time over the floor, and the latency each side adds to the floor, with its ratios.

    python benchmarks/model_latency_bench.py [--rounds 10] [--calls 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
HARNESS = HERE / "chat_harness.py"
VENVS = {
    "openenv": (ROOT / ".venv-openenv", "openenv==0.10.0", "import openenv.core.harness.capture"),
    "verifiers": (ROOT / ".venv-verifiers", "verifiers==0.4.0", "import verifiers.v1.interception"),
}
SIDES = ("bare", "capture", "model", "openenv", "verifiers")
EDGE = 3  # calls timed at each end of a turn: calls 2-4 (~5 messages), the last 3 (~100)
INSTALL_TIMEOUT_S, REPLY_TIMEOUT_S = 900.0, 300.0
TOOL_ACTION = json.dumps(
    {"content": "", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}
)


# ---------------------------------------------------------------- the harness, by line protocol


class Harness:
    """``chat_harness.py`` as a child of a driver, pointed at ``base_url`` with ``key``."""

    def __init__(self, base_url: str, key: str) -> None:
        env = {
            **os.environ,
            "GYM_HARNESS_MODEL_BASE_URL": base_url,
            "GYM_HARNESS_MODEL_API_KEY": key,
        }
        self.child = subprocess.Popen(
            [sys.executable, str(HARNESS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env,
        )  # fmt: skip
        assert json.loads(self._line())["type"] == "ready"

    def _line(self) -> str:
        assert self.child.stdout is not None
        line = self.child.stdout.readline()
        if not line:
            raise RuntimeError(f"the harness exited {self.child.wait(REPLY_TIMEOUT_S)}")
        return line

    def turn(self, content: str) -> list[float]:
        assert self.child.stdin is not None
        self.child.stdin.write(json.dumps({"type": "message", "content": content}) + "\n")
        self.child.stdin.flush()
        reply = json.loads(self._line())["response"]
        if reply.startswith("error"):
            raise RuntimeError(f"the harness's turn failed: {reply}")
        times: list[float] = json.loads(reply)
        return times

    def close(self) -> None:
        assert self.child.stdin is not None
        self.child.stdin.close()
        try:
            self.child.wait(REPLY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait(10)


# ---------------------------------------------------------------- drivers (child side)


def bare_driver(upstream: str) -> Any:
    def turn(calls: int) -> list[float]:
        harness = Harness(upstream, "")
        try:
            return harness.turn(f"calls={calls}")
        finally:
            harness.close()

    return turn, lambda: None


def capture_driver(upstream: str) -> Any:
    from gym_harness import HarnessEnv

    env = HarnessEnv("command", command=[sys.executable, str(HARNESS)], capture=True,
                     upstream=upstream)  # fmt: skip

    def turn(calls: int) -> list[float]:
        env.reset()
        reply, _, _, _, info = env.step(f"calls={calls}")
        if info["error_type"] or str(reply).startswith("error"):
            raise RuntimeError(f"capture turn failed: {info['error_type']} {info['error']} {reply}")
        times: list[float] = json.loads(str(reply))
        return times

    return turn, env.close


def model_driver(upstream: str) -> Any:
    from gym_harness import HarnessEnv

    env = HarnessEnv("command", command=[sys.executable, str(HARNESS)], mode="model")

    def turn(calls: int) -> list[float]:
        _, info = env.reset()
        if info["error_type"]:
            raise RuntimeError(f"model-mode reset failed: {info['error_type']} {info['error']}")
        for _ in range(calls):  # the instant policy: a precomputed tool call
            _, _, terminated, truncated, info = env.step(TOOL_ACTION)
            if terminated or truncated:
                raise RuntimeError(f"model-mode step ended: {info['error_type']} {info['error']}")
        env.step("done")
        reply = env.trajectory.turns[-1].response
        times: list[float] = json.loads(reply)
        return times

    return turn, env.close


def openenv_driver(upstream: str) -> Any:
    import asyncio
    import logging

    import uvicorn
    from openenv.core.harness.capture.server import create_app

    logging.getLogger("intercept").setLevel(logging.WARNING)
    app = create_app(llm_url=upstream, model="m", capture_level="text")
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    registry = app.state.registry

    def turn(calls: int) -> list[float]:
        session = registry.create(None)  # a rollout: its id is the harness's API key
        harness = Harness(f"http://127.0.0.1:{port}", session.session_id)
        try:
            return harness.turn(f"calls={calls}")
        finally:
            harness.close()

    def close() -> None:
        server.should_exit = True
        thread.join(10)

    return turn, close


def verifiers_driver(upstream: str) -> Any:
    import asyncio
    import logging

    from verifiers.v1.clients import ModelContext
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.interception import InterceptionServer
    from verifiers.v1.session import RolloutSession
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask

    logging.getLogger("verifiers").setLevel(logging.WARNING)
    os.environ.setdefault("BENCH_UPSTREAM_KEY", "unused")
    runner = asyncio.Runner()
    server = InterceptionServer()
    runner.run(server.start())
    ctx = ModelContext(
        model="m",
        client=EvalClientConfig(base_url=f"{upstream}/v1", api_key_var="BENCH_UPSTREAM_KEY"),
    )

    async def run_turn(calls: int) -> list[float]:
        trace: Any = Trace(task=TraceTask(type="bench", data={}), agent=AgentInfo(config={}))
        session = RolloutSession(ctx=ctx, trace=trace)
        async with server.acquire(session) as (base_url, secret, _):
            harness = await asyncio.to_thread(Harness, base_url, secret)
            try:
                return await asyncio.to_thread(harness.turn, f"calls={calls}")
            finally:
                await asyncio.to_thread(harness.close)

    def close() -> None:
        runner.run(server.stop())
        runner.close()

    return lambda calls: runner.run(run_turn(calls)), close


DRIVERS = {
    "bare": bare_driver,
    "capture": capture_driver,
    "model": model_driver,
    "openenv": openenv_driver,
    "verifiers": verifiers_driver,
}


def driver(kind: str, upstream: str) -> None:
    """Child: set the side up, then one JSON line per ``turn N`` command."""
    turn, close = DRIVERS[kind](upstream)
    turn(3)  # warm: imports, connections, first requests
    print(json.dumps({"ready": True}), flush=True)
    try:
        for line in sys.stdin:
            command, _, arg = line.strip().partition(" ")
            if command != "turn":
                break
            print(json.dumps({"times": turn(int(arg))}), flush=True)
    finally:
        close()


# ---------------------------------------------------------------- parent side


def ensure_venv(kind: str) -> Path:
    """The virtual environment of a competitor, made (with pip) unless it is there."""
    venv, spec, probe = VENVS[kind]
    python = venv / "bin" / "python"
    if (
        python.exists()
        and subprocess.run([python, "-c", probe], capture_output=True).returncode == 0
    ):
        return python
    print(f"creating {venv} with {spec} (first use only) ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([python, "-m", "pip", "install", "--quiet", spec], check=True,
                   timeout=INSTALL_TIMEOUT_S)  # fmt: skip
    return python


class Child:
    """A driver (or the upstream) process, commanded line by line."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, cwd=ROOT, env=env)  # fmt: skip

    def line(self) -> str:
        assert self.child.stdout is not None
        line = self.child.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.child.args[:3]} exited {self.child.wait(REPLY_TIMEOUT_S)}")
        return line

    def ask(self, command: str) -> str:
        assert self.child.stdin is not None
        self.child.stdin.write(command + "\n")
        self.child.stdin.flush()
        return self.line()

    def close(self) -> None:
        try:
            assert self.child.stdin is not None
            self.child.stdin.close()
            self.child.wait(REPLY_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            self.child.kill()
            self.child.wait(10)


def compare(rounds: int, calls: int, sides: tuple[str, ...]) -> dict[str, list[list[float]]]:
    pythons = {s: str(ensure_venv(s)) if s in VENVS else sys.executable for s in sides}
    upstream = Child(
        [sys.executable, str(HERE / "model_mode_bench.py"), "--serve"], dict(os.environ)
    )
    drivers: dict[str, Child] = {}
    turns: dict[str, list[list[float]]] = {s: [] for s in sides}
    try:
        url = f"http://127.0.0.1:{int(upstream.line())}"
        for side in sides:
            env = dict(os.environ)
            if side in VENVS:  # the competitor's interpreter gets nothing of ours on its path
                env.pop("PYTHONPATH", None)
            argv = [pythons[side], __file__, "--driver", side, "--upstream", url]
            drivers[side] = Child(argv, env)
            drivers[side].line()  # ready
        for _ in range(rounds):
            for side, child in drivers.items():
                turns[side].append(json.loads(child.ask(f"turn {calls}"))["times"])
            json.loads(upstream.ask("take"))  # the upstream forgets the round's bodies
    finally:
        for child in (*drivers.values(), upstream):
            child.close()
    return turns


def figures(turns: dict[str, list[list[float]]]) -> dict[str, dict[str, float]]:
    """Per side: median ms of calls 2 to EDGE + 1 and of the last EDGE calls of each turn."""
    out = {}
    for side, per_turn in turns.items():
        early = [t for turn in per_turn for t in turn[1 : 1 + EDGE]]  # the 1st opens a connection
        late = [t for turn in per_turn for t in turn[-EDGE:]]
        out[side] = {"early_ms": statistics.median(early) * 1e3,
                     "late_ms": statistics.median(late) * 1e3}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--calls", type=int, default=50, help="calls per turn (~2 messages each)")
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated sides")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--driver", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        return driver(args.driver, args.upstream)
    sides = tuple(s for s in args.sides.split(",") if s)
    if "bare" not in sides:
        raise SystemExit("--sides must include bare (the floor)")
    turns = compare(args.rounds, args.calls, sides)
    fig = figures(turns)
    if args.json:
        print(json.dumps({"figures": fig, "rounds": args.rounds, "calls": args.calls}))
        return
    first, last = 2 * EDGE + 1, 2 * args.calls - 1
    print(f"$ python {' '.join(sys.argv)}")
    print(f"one turn of {args.calls} calls per side per round, {args.rounds} interleaved rounds; "
          f"'~5 msgs' = calls 2-{EDGE + 1} (3-{first} messages), '~100 msgs' = the last {EDGE} "
          f"(up to {last} messages); medians, per call, timed by the harness")  # fmt: skip
    bare = fig["bare"]
    print(f"{'side':<10} {'~5 msgs':>9} {'x floor':>8} {'added':>9}   "
          f"{'~100 msgs':>9} {'x floor':>8} {'added':>9}")  # fmt: skip
    added: dict[str, tuple[float, float]] = {}
    for side, f in fig.items():
        a5, a100 = f["early_ms"] - bare["early_ms"], f["late_ms"] - bare["late_ms"]
        added[side] = (a5, a100)
        print(f"{side:<10} {f['early_ms']:7.3f}ms {f['early_ms'] / bare['early_ms']:7.2f}x "
              f"{a5:7.3f}ms   {f['late_ms']:7.3f}ms {f['late_ms'] / bare['late_ms']:7.2f}x "
              f"{a100:7.3f}ms")  # fmt: skip
    if "model" in added:
        m5, m100 = added["model"]
        print(f"model mode added at ~100 msgs / at ~5 msgs: {m100 / m5:.2f}x   (goal <= 1.2x)")
        if "capture" in added:
            ratio = m100 / added["capture"][1]
            print(f"model mode added / capture added, at ~100 msgs: {ratio:.2f}x   (goal <= 1.0x)")
        for other in ("openenv", "verifiers"):
            if other in added:
                late, early = added[other][1] / m100, added[other][0] / m5
                print(f"{other} added / model mode added: {late:.1f}x at ~100 msgs, "
                      f"{early:.1f}x at ~5 msgs")  # fmt: skip


if __name__ == "__main__":
    main()
