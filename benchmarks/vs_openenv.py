"""gym_harness beside OpenEnv's RFC 005 runtime on the same line-protocol harness.

OpenEnv 0.10.0 (``openenv.core.harness``: HarnessEnvironment, HarnessProcess,
HarnessMCPBridge) needs fastmcp < 4, so it lives in its own virtual environment,
``.venv-openenv/`` (git-ignored), made on first use (``python -m venv`` and
``pip install openenv==0.10.0``). OpenEnv ships no line-protocol adapter, so its
driver below defines the smallest ``AgenticHarnessAdapter`` that speaks it, on
OpenEnv's own ``HarnessProcess``.

Both sides drive the same harness program with the same interpreter: the
embedded reference agent (``gym_harness/agents/reference.py``, run as a plain
script), whose ``/call echo {...}`` line makes one real MCP tool call through the
env's bridge. Two turn variants: ``ping`` (no tool call) and one tool call per
turn. Each side runs as a child process (a driver printing JSON), alternately,
``--rounds`` times; figures are medians. Memory is the PSS of the driver's whole
process tree (env process, harness, helpers) after the turns.

    python benchmarks/vs_openenv.py [--steps 200] [--resets 15] [--rounds 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-openenv"
VENV_PYTHON = VENV / "bin" / "python"
OPENENV_SPEC = "openenv==0.10.0"
AGENT = ROOT / "gym_harness" / "agents" / "reference.py"
PLAIN, TOOL = "ping", '/call echo {"text": "ping"}'
EXPECT = {PLAIN: "You said: ping", TOOL: "echo -> ping"}
INSTALL_TIMEOUT_S, DRIVER_TIMEOUT_S = 900.0, 600.0


# ---------------------------------------------------------------- drivers (child side)


def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


def run_episodes(
    reset: Any, step: Any, steps: int, resets: int, cold_start: float
) -> dict[str, float]:
    """Time resets and the two turn variants through ``reset()`` / ``step(msg) -> reply``."""
    reset()
    first = time.perf_counter() - cold_start
    reset_times = []
    for _ in range(resets):
        start = time.perf_counter()
        reset()
        reset_times.append(time.perf_counter() - start)
    for _ in range(20):  # warm both variants (the harness's MCP session opens here)
        step(PLAIN)
        step(TOOL)
    turns: dict[str, list[float]] = {PLAIN: [], TOOL: []}
    for _ in range(steps):
        for message in (PLAIN, TOOL):
            start = time.perf_counter()
            reply = step(message)
            turns[message].append(time.perf_counter() - start)
            assert reply.strip() == EXPECT[message], reply
    plain, tool = statistics.median(turns[PLAIN]), statistics.median(turns[TOOL])
    return {
        "cold_start_to_first_reset_s": first,
        "reset_s": statistics.median(reset_times),
        "turn_plain_s": plain,
        "turn_tool_s": tool,
        "tool_call_s": tool - plain,
    }


def drive_ours(harness_python: str, steps: int, resets: int) -> tuple[dict[str, float], Any]:
    cold = time.perf_counter()
    from gym_harness import HarnessEnv

    env = HarnessEnv("command", command=[harness_python, str(AGENT)], tools=[echo])

    def step(message: str) -> str:
        reply, _, terminated, truncated, info = env.step(message)
        assert not (terminated or truncated), info
        return str(reply)

    return run_episodes(lambda: env.reset(), step, steps, resets, cold), env.close


def drive_openenv(harness_python: str, steps: int, resets: int) -> tuple[dict[str, float], Any]:
    cold = time.perf_counter()
    from fastmcp import FastMCP
    from openenv.core.harness import (
        AgenticHarnessAdapter,
        HarnessAction,
        HarnessConfig,
        HarnessEnvironment,
        HarnessError,
        HarnessEvent,
        HarnessEventType,
        HarnessProcess,
    )

    kinds = {
        "text": HarnessEventType.TEXT_OUTPUT,
        "tool_call": HarnessEventType.TOOL_CALL,
        "tool_result": HarnessEventType.TOOL_RESULT,
        "turn_complete": HarnessEventType.TURN_COMPLETE,
        "error": HarnessEventType.ERROR,
    }

    class LineAdapter(AgenticHarnessAdapter):
        """Line protocol v1 on OpenEnv's HarnessProcess (the least such an adapter needs)."""

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.proc: Any = None
            self.url = ""

        async def start(self, working_directory: str) -> None:
            self.proc = HarnessProcess(
                self.config.command,
                cwd=working_directory,
                env_vars={"GYM_HARNESS_MCP_URL": self.url},
                startup_timeout_s=self.config.startup_timeout_s,
            )
            await self.proc.start(ready_check=lambda line: '"ready"' in line)

        async def stop(self) -> None:
            if self.proc is not None:
                await self.proc.stop()

        async def inject_tools(self, tools: list[Any], bridge_url: str | None = None) -> None:
            self.url = bridge_url or ""

        async def is_alive(self) -> bool:
            return self.proc is not None and self.proc.is_running()

        async def send_message_streaming(self, message: str) -> Any:
            await self.proc.write_line(json.dumps({"type": "message", "content": message}))
            while True:
                line = await self.proc.read_line(timeout_s=self.config.session_timeout_s)
                if line is None:
                    raise HarnessError("the harness closed its output mid-turn")
                obj = json.loads(line)
                kind = kinds.get(obj.get("type"))
                if kind is None:
                    continue
                yield HarnessEvent(type=kind, data={k: v for k, v in obj.items() if k != "type"})
                if kind is HarnessEventType.TURN_COMPLETE:
                    return

    workdir = tempfile.mkdtemp(prefix="vs-openenv-")
    config = HarnessConfig(
        name="line", command=[harness_python, str(AGENT)], working_directory=workdir
    )
    env = HarnessEnvironment(LineAdapter(config), mcp=FastMCP("bench", tools=[echo]))

    def step(message: str) -> str:
        obs = env.step(HarnessAction(message=message))
        assert not obs.done, obs.metadata
        return str(obs.metadata["response"])

    return run_episodes(lambda: env.reset(), step, steps, resets, cold), env.close


def driver(side: str, harness_python: str, steps: int, resets: int) -> None:
    """Child: measure one side, print one JSON line, wait for a line on stdin, close."""
    drive = drive_ours if side == "ours" else drive_openenv
    figures, close = drive(harness_python, steps, resets)
    print(json.dumps(figures), flush=True)
    sys.stdin.readline()  # the parent measures this process tree's memory meanwhile
    close()


# ---------------------------------------------------------------- parent side


def ensure_venv() -> None:
    """Make ``.venv-openenv`` with OpenEnv installed, unless it is already there."""
    probe = [str(VENV_PYTHON), "-c", "import openenv.core.harness, fastmcp"]
    if VENV_PYTHON.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return
    print(f"creating {VENV} with {OPENENV_SPEC} (first use only) ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=120)
    subprocess.run(
        [str(VENV_PYTHON), "-m", "pip", "install", "--quiet", OPENENV_SPEC],
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )


def run_side(side: str, steps: int, resets: int) -> dict[str, float]:
    """Run one driver child; return its figures plus its tree's memory (MB)."""
    from _common import tree_pss_mb

    python = sys.executable if side == "ours" else str(VENV_PYTHON)
    argv = [python, __file__, "--driver", side, "--harness-python", sys.executable]
    argv += ["--steps", str(steps), "--resets", str(resets)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    child = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        line = child.stdout.readline()
        if not line:
            raise RuntimeError(f"the {side} driver exited {child.wait(DRIVER_TIMEOUT_S)}")
        figures: dict[str, float] = json.loads(line)
        figures["memory_mb"] = tree_pss_mb(child.pid)
        child.stdin.write("exit\n")
        child.stdin.flush()
        if child.wait(DRIVER_TIMEOUT_S) != 0:
            raise RuntimeError(f"the {side} driver exited {child.returncode}")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    return figures


FIGURES = (
    ("cold start to first reset", "cold_start_to_first_reset_s", "ms", 1e3),
    ("reset (2nd+)", "reset_s", "ms", 1e3),
    ("turn, no tool call", "turn_plain_s", "ms", 1e3),
    ("turn, one tool call", "turn_tool_s", "ms", 1e3),
    ("one bridge tool call (tool turn - plain turn)", "tool_call_s", "ms", 1e3),
    ("memory, env process tree (PSS)", "memory_mb", "MB", 1.0),
)


def compare(steps: int, resets: int, rounds: int) -> list[dict[str, Any]]:
    """Alternate both sides ``rounds`` times; return one dict per figure."""
    ensure_venv()
    runs: dict[str, list[dict[str, float]]] = {"ours": [], "openenv": []}
    for _ in range(rounds):
        for side in runs:
            runs[side].append(run_side(side, steps, resets))
    rows = []
    for label, key, unit, scale in FIGURES:
        ours = statistics.median(r[key] for r in runs["ours"]) * scale
        theirs = statistics.median(r[key] for r in runs["openenv"]) * scale
        rows.append(
            {"figure": label, "unit": unit, "gym_harness": ours, "openenv": theirs,
             "ratio": ours / theirs if theirs else None}
        )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed turns per variant")
    parser.add_argument("--resets", type=int, default=15, help="timed resets per side")
    parser.add_argument("--rounds", type=int, default=2, help="driver runs per side")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--driver", choices=["ours", "openenv"], help=argparse.SUPPRESS)
    parser.add_argument("--harness-python", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        return driver(args.driver, args.harness_python, args.steps, args.resets)
    rows = compare(args.steps, args.resets, args.rounds)
    if args.json:
        print(json.dumps({"rows": rows}))
        return
    print(f"$ python {' '.join(sys.argv)}")
    print(f"harness (both sides): {sys.executable} {AGENT}; OpenEnv: {OPENENV_SPEC}")
    print(f"medians; {args.rounds} runs per side, {args.steps} turns per variant per run")
    width = max(len(r["figure"]) for r in rows)
    print(f"{'figure':<{width}}  {'gym_harness':>11}  {'openenv':>9}  unit  ratio  better")
    for r in rows:
        better = "ours" if r["ratio"] is not None and r["ratio"] < 1 else "openenv"
        print(
            f"{r['figure']:<{width}}  {r['gym_harness']:>11.2f}  {r['openenv']:>9.2f}  "
            f"{r['unit']:<4}  {r['ratio']:.2f}x  {better}"
        )


if __name__ == "__main__":
    main()
