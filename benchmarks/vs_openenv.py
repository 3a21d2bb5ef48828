"""gym_harness beside OpenEnv's RFC 005 runtime on the same line-protocol harness.

OpenEnv 0.10.0 (``openenv.core.harness``: HarnessEnvironment, HarnessProcess,
HarnessMCPBridge) needs fastmcp < 4, so it lives in its own virtual environment,
``.venv-openenv/`` (git-ignored), made on first use (``python -m venv`` and
``pip install openenv==0.10.0``). OpenEnv ships no line-protocol adapter, so its
driver below defines the smallest ``AgenticHarnessAdapter`` that speaks it, on
OpenEnv's own ``HarnessProcess``.

How each side is driven, as its own users drive it:

* gym_harness: the sync ``HarnessEnv.reset``/``step`` (gymnasium's API).
* OpenEnv: ``await env.reset_async()`` / ``await env.step_async(HarnessAction)`` on
  one long-lived event loop (an ``asyncio.Runner`` kept for the driver's life), as
  OpenEnv's ``HTTPEnvServer`` awaits them on its own loop; not the sync facade,
  which starts a fresh loop per call.

Both sides drive the same harness program with the same interpreter: the reference
agent (``gym_harness/agents/reference.py``, run as a plain script), whose
``/call echo {...}`` line makes one real MCP tool call through the env's bridge
with the MCP SDK's client. Turn variants: ``ping`` (no tool call) and one tool
call per turn.

Fairness: every driver is a child process that stays up; the parent sends each
one a small batch at a time, alternating sides, so noise on the machine hits
both alike. Cold start (``Popen`` to the end of the first reset, interpreter
start included) and memory (PSS of the driver's whole process tree after warm
turns) are measured for three drivers per round: ours, OpenEnv as installed
(its ``openenv.core`` imports gradio for its web UI), and OpenEnv with gradio's
import blocked (OpenEnv catches that ``ModuleNotFoundError`` itself). The tool
call alone is timed from this process with one client (fastmcp's ``Client`` over
streamable HTTP) against each side's running bridge, alternately.

    python benchmarks/vs_openenv.py [--rounds 3] [--steps 200] [--resets 15] [--calls 300] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
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
INSTALL_TIMEOUT_S, REPLY_TIMEOUT_S = 900.0, 300.0
SIDES = ("ours", "openenv", "openenv_nogradio")
WARM_TURNS = 20
BATCH = 20  # turns per variant per batch; batches alternate between the sides


# ---------------------------------------------------------------- drivers (child side)


def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


class _NoGradio:
    """A meta-path finder that makes ``import gradio`` fail as if it were not installed."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name == "gradio" or name.startswith("gradio."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)


class Ours:
    """gym_harness through its sync gymnasium API."""

    def __init__(self, harness_python: str) -> None:
        from gym_harness import HarnessEnv

        self.env = HarnessEnv("command", command=[harness_python, str(AGENT)], tools=[echo])

    def reset(self) -> None:
        self.env.reset()

    def step(self, message: str) -> str:
        reply, _, terminated, truncated, info = self.env.step(message)
        assert not (terminated or truncated), info
        return str(reply)

    def bridge(self) -> tuple[str, str]:
        bridge = self.env._bridge  # the benchmark reads it; users never need to
        assert bridge is not None
        return bridge.url, bridge.token

    def close(self) -> None:
        self.env.close()


class OpenEnv:
    """OpenEnv's HarnessEnvironment through its async path on one long-lived loop."""

    def __init__(self, harness_python: str) -> None:
        import asyncio
        import logging

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
                    data = {k: v for k, v in obj.items() if k != "type"}
                    yield HarnessEvent(type=kind, data=data)
                    if kind is HarnessEventType.TURN_COMPLETE:
                        return

        # Each client that closes its session makes the mcp 1.x server under OpenEnv's
        # bridge log a ClosedResourceError traceback: noise, not a failed call.
        logging.getLogger("mcp.server.streamable_http").setLevel(logging.CRITICAL)
        self.workdir = tempfile.mkdtemp(prefix="vs-openenv-")
        config = HarnessConfig(
            name="line", command=[harness_python, str(AGENT)], working_directory=self.workdir
        )
        self.action = HarnessAction
        self.env = HarnessEnvironment(LineAdapter(config), mcp=FastMCP("bench", tools=[echo]))
        self.runner = asyncio.Runner()  # one loop for the driver's life, like a server's

    def reset(self) -> None:
        self.runner.run(self.env.reset_async())

    def step(self, message: str) -> str:
        return self.runner.run(self._step(message))

    async def _step(self, message: str) -> str:
        obs = await self.env.step_async(self.action(message=message))
        assert not obs.done, obs.metadata
        return str(obs.metadata["response"])

    def run_batch(self, batch: Any) -> Any:
        """Run a timing batch as one coroutine on the loop (no loop entry per turn)."""
        return self.runner.run(batch)

    def bridge(self) -> tuple[str, str]:
        bridge = self.env._bridge
        assert bridge is not None and bridge.url
        return bridge.url, ""

    def close(self) -> None:
        self.env.close()
        self.runner.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _timed_turns(side: Any, count: int) -> dict[str, list[float]]:
    turns: dict[str, list[float]] = {PLAIN: [], TOOL: []}
    for _ in range(count):
        for message in (PLAIN, TOOL):
            start = time.perf_counter()
            reply = side.step(message)
            turns[message].append(time.perf_counter() - start)
            assert reply.strip() == EXPECT[message], reply
    return turns


async def _timed_turns_async(side: OpenEnv, count: int) -> dict[str, list[float]]:
    turns: dict[str, list[float]] = {PLAIN: [], TOOL: []}
    for _ in range(count):
        for message in (PLAIN, TOOL):
            start = time.perf_counter()
            reply = await side._step(message)
            turns[message].append(time.perf_counter() - start)
            assert reply.strip() == EXPECT[message], reply
    return turns


def _timed_resets(side: Any, count: int) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        side.reset()
        times.append(time.perf_counter() - start)
    for _ in range(3):  # the harness's MCP session opens on its first tool turn
        side.step(TOOL)
    return times


def driver(kind: str, harness_python: str) -> None:
    """Child: build the env, reset once, then obey one command line at a time.

    Prints one JSON line per command. Commands: ``warm``, ``resets N``,
    ``turns N``, ``bridge``, ``exit``.
    """
    if kind == "openenv_nogradio":
        sys.meta_path.insert(0, _NoGradio())  # type: ignore[arg-type]
    side: Any = Ours(harness_python) if kind == "ours" else OpenEnv(harness_python)
    side.reset()
    gradio = "gradio" in sys.modules
    print(json.dumps({"ready": True, "gradio_imported": gradio}), flush=True)
    try:
        for line in sys.stdin:
            command, _, arg = line.strip().partition(" ")
            reply: dict[str, Any]
            if command == "warm":
                for _ in range(WARM_TURNS):
                    side.step(PLAIN)
                    side.step(TOOL)
                reply = {}
            elif command == "resets":
                reply = {"resets": _timed_resets(side, int(arg))}
            elif command == "turns":
                if isinstance(side, OpenEnv):
                    reply = {"turns": side.run_batch(_timed_turns_async(side, int(arg)))}
                else:
                    reply = {"turns": _timed_turns(side, int(arg))}
            elif command == "bridge":
                url, token = side.bridge()
                reply = {"url": url, "token": token}
            else:
                break
            print(json.dumps(reply), flush=True)
    finally:
        side.close()


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


class Driver:
    """One driver child: spawned, timed to its first reset, then commanded line by line."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        python = sys.executable if kind == "ours" else str(VENV_PYTHON)
        argv = [python, __file__, "--driver", kind, "--harness-python", sys.executable]
        env = dict(os.environ)
        if kind != "ours":  # OpenEnv's interpreter gets nothing of ours on its path
            env.pop("PYTHONPATH", None)
        start = time.perf_counter()
        self.child = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env
        )
        ready = self._reply()
        self.cold_start_s = time.perf_counter() - start
        self.gradio_imported = bool(ready["gradio_imported"])

    def ask(self, command: str) -> dict[str, Any]:
        assert self.child.stdin is not None
        self.child.stdin.write(command + "\n")
        self.child.stdin.flush()
        return self._reply()

    def _reply(self) -> dict[str, Any]:
        assert self.child.stdout is not None
        line = self.child.stdout.readline()  # a driver that dies closes its stdout
        if not line:
            code = self.child.wait(REPLY_TIMEOUT_S)
            raise RuntimeError(f"the {self.kind} driver exited {code} (see its stderr above)")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def memory_mb(self) -> float:
        from _common import tree_pss_mb

        return tree_pss_mb(self.child.pid)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.child.stdin is not None
            self.child.stdin.write("exit\n")
            self.child.stdin.close()
        try:
            self.child.wait(REPLY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait(10)


def tool_calls(bridges: dict[str, tuple[str, str]], calls: int, rounds: int) -> dict[str, Any]:
    """p50 of one ``echo`` call per side, one client, alternating in rounds."""
    import asyncio

    from fastmcp import Client
    from fastmcp.client.transports import StreamableHttpTransport

    async def run() -> dict[str, list[float]]:
        samples: dict[str, list[float]] = {side: [] for side in bridges}
        for _ in range(rounds):
            for side, (url, token) in bridges.items():
                transport = StreamableHttpTransport(url, auth=token or None)
                async with Client(transport) as client:
                    for i in range(10 + calls // rounds):
                        start = time.perf_counter()
                        result = await client.call_tool("echo", {"text": f"ping {i}"})
                        if i >= 10:  # the first ten warm the connection
                            samples[side].append(time.perf_counter() - start)
                        assert result.data == f"ping {i}", result
        return samples

    return asyncio.run(run())


def compare(steps: int, resets: int, rounds: int, calls: int) -> dict[str, Any]:
    """Run every measurement, alternating sides; return the samples by figure and side."""
    ensure_venv()
    cold: dict[str, list[float]] = {side: [] for side in SIDES}
    memory: dict[str, list[float]] = {side: [] for side in SIDES}
    gradio: dict[str, bool] = {}
    kept: dict[str, Driver] = {}
    try:
        for r in range(rounds):
            for side in SIDES:
                drv = Driver(side)
                cold[side].append(drv.cold_start_s)
                gradio[side] = drv.gradio_imported
                drv.ask("warm")
                memory[side].append(drv.memory_mb())
                if r == rounds - 1 and side != "openenv_nogradio":
                    kept[side] = drv  # the last round's drivers go on to the timed turns
                else:
                    drv.close()
        reset_s: dict[str, list[float]] = {side: [] for side in kept}
        turn_s: dict[str, dict[str, list[float]]] = {s: {PLAIN: [], TOOL: []} for s in kept}
        for _ in range(max(1, resets // 5)):
            for side, drv in kept.items():
                reset_s[side] += drv.ask(f"resets {min(5, resets)}")["resets"]
        for _ in range(max(1, steps // BATCH)):
            for side, drv in kept.items():
                for message, times in drv.ask(f"turns {BATCH}")["turns"].items():
                    turn_s[side][message] += times
        bridges = {side: tuple(drv.ask("bridge").values()) for side, drv in kept.items()}
        calls_s = tool_calls(bridges, calls, 10)  # type: ignore[arg-type]
    finally:
        for drv in kept.values():
            drv.close()
    return {
        "cold_start_s": cold,
        "memory_mb": memory,
        "gradio_imported": gradio,
        "reset_s": reset_s,
        "turn_plain_s": {s: t[PLAIN] for s, t in turn_s.items()},
        "turn_tool_s": {s: t[TOOL] for s, t in turn_s.items()},
        "tool_call_s": calls_s,
    }


FIGURES = (
    # label, key, their side, unit, scale
    ("cold start to first reset (as installed)", "cold_start_s", "openenv", "ms", 1e3),
    ("cold start to first reset (gradio blocked)", "cold_start_s", "openenv_nogradio", "ms", 1e3),
    ("memory, driver process tree PSS (as installed)", "memory_mb", "openenv", "MB", 1.0),
    ("memory, driver process tree PSS (gradio blocked)", "memory_mb", "openenv_nogradio", "MB", 1),
    ("reset (2nd+)", "reset_s", "openenv", "ms", 1e3),
    ("turn, no tool call", "turn_plain_s", "openenv", "ms", 1e3),
    ("turn, one tool call", "turn_tool_s", "openenv", "ms", 1e3),
    ("one tool call alone (p50, same client)", "tool_call_s", "openenv", "ms", 1e3),
)


def rows(samples: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for label, key, theirs_side, unit, scale in FIGURES:
        ours = statistics.median(samples[key]["ours"]) * scale
        theirs = statistics.median(samples[key][theirs_side]) * scale
        out.append(
            {"figure": label, "unit": unit, "gym_harness": ours, "openenv": theirs,
             "ratio": ours / theirs, "n": len(samples[key]["ours"])}
        )  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="cold starts per driver kind")
    parser.add_argument("--steps", type=int, default=200, help="timed turns per variant")
    parser.add_argument("--resets", type=int, default=15, help="timed resets per side")
    parser.add_argument("--calls", type=int, default=300, help="timed tool calls per side")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--driver", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--harness-python", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        return driver(args.driver, args.harness_python)
    samples = compare(args.steps, args.resets, args.rounds, args.calls)
    table = rows(samples)
    if args.json:
        print(json.dumps({"rows": table, "gradio_imported": samples["gradio_imported"]}))
        return
    print(f"$ python {' '.join(sys.argv)}")
    print(f"harness (both sides): {sys.executable} {AGENT}; OpenEnv: {OPENENV_SPEC}")
    print(f"gradio imported by the driver: {samples['gradio_imported']}")
    print(
        f"medians; {args.rounds} cold starts per kind; turns, resets and tool calls "
        "alternate between the sides in batches"
    )
    width = max(len(r["figure"]) for r in table)
    print(f"{'figure':<{width}}  {'gym_harness':>11}  {'openenv':>9}  unit  ratio    n  better")
    for r in table:
        better = "ours" if r["ratio"] < 1 else "openenv"
        print(
            f"{r['figure']:<{width}}  {r['gym_harness']:>11.2f}  {r['openenv']:>9.2f}  "
            f"{r['unit']:<4}  {r['ratio']:.2f}x  {r['n']:>3}  {better}"
        )


if __name__ == "__main__":
    main()
