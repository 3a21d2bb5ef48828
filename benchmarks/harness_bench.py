"""Reset and per-turn time of the real-CLI harnesses, beside each CLI's own one-shot mode.

Per CLI, against the instant scripted model server (tests/model_server.py) and
the env's MCP bridge, all on 127.0.0.1:

* long-lived: ``HarnessEnv`` reset time (spawn + handshake + tool check) and
  per-turn time (one ``step``) on one long-lived process;
* one-shot: the same turn as a fresh process per turn that resumes the
  conversation (``claude -p --resume SESSION``, ``codex exec resume --json
  THREAD``, stdin closed), with the same private config and MCP server;
* the ratio one-shot / long-lived per turn.

Runs itself inside a fresh loopback-only network namespace (like the tests).

Usage::

    python benchmarks/harness_bench.py [--turns 10] [--resets 3] [--only claude,codex]

Adding a harness: append a ``Bench`` to ``benches()``; ``one_shot`` may be
``None`` where the CLI has no resumable one-shot mode (the ACP agents).
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
CLI_BIN = ROOT / ".clis" / "node_modules" / ".bin"

from model_server import ScriptedModelServer  # noqa: E402

from gym_harness import HarnessEnv  # noqa: E402
from gym_harness.bridge import MCPBridge  # noqa: E402
from gym_harness.config import HarnessConfig  # noqa: E402
from gym_harness.harnesses.base import EpisodeContext, Harness  # noqa: E402
from gym_harness.harnesses.claude_code import ClaudeCodeHarness  # noqa: E402
from gym_harness.harnesses.codex import CodexHarness  # noqa: E402
from gym_harness.tools import load_tools  # noqa: E402

ONE_SHOT_TIMEOUT_S = 60.0


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


# ---------------------------------------------------------------- network namespace


def isolate_network() -> None:
    """Move this process into a new network namespace with only ``lo`` up."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x40000000) != 0:  # CLONE_NEWNET (root)
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(0x10000000 | 0x40000000) != 0:  # CLONE_NEWUSER | CLONE_NEWNET
            sys.exit(f"cannot make a network namespace: {os.strerror(ctypes.get_errno())}")
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        req = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, 0x8913, req))[1]
        fcntl.ioctl(sock, 0x8914, struct.pack("16sh", b"lo", flags | 0x1))


# ---------------------------------------------------------------- one-shot modes


def spawn_env(config: HarnessConfig) -> dict[str, str]:
    """The scrubbed environment HarnessProcess would give ``config``."""
    env = {k: os.environ[k] for k in config.inherit_env if k in os.environ}
    return {**env, **config.env}


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(
        cmd,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=ONE_SHOT_TIMEOUT_S,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed, done.stdout


def claude_one_shot(config: HarnessConfig, cwd: Path, turns: int) -> list[float]:
    """``claude -p MSG --resume SESSION`` per turn, after a first turn that makes the session."""
    base = list(config.command)
    for flag in ("--input-format", "--output-format"):
        i = base.index(flag)
        del base[i : i + 2]
    env = spawn_env(config)
    first = [base[0], "-p", "hello", *base[2:], "--output-format", "json"]
    _, out = run(first, env, cwd)
    parsed = json.loads(out)  # with --verbose: the list of every message
    session = next(m for m in parsed if m.get("type") == "result")["session_id"]
    times = []
    for n in range(turns):
        cmd = [
            base[0],
            "-p",
            f"turn {n}",
            *base[2:],
            "--output-format",
            "json",
            "--resume",
            session,
        ]
        times.append(run(cmd, env, cwd)[0])
    return times


def codex_one_shot(
    config: HarnessConfig, cwd: Path, turns: int, ctx: EpisodeContext
) -> list[float]:
    """``codex exec resume --json THREAD MSG`` per turn (MCP server given with ``-c``)."""
    exe = config.command[0]
    entry = CodexHarness().mcp_server_entry(ctx)
    overrides: list[str] = []
    for key, value in entry.items():
        overrides += ["-c", f"mcp_servers.{ctx.server_name}.{key}={json.dumps(value)}"]
    env = spawn_env(config)
    common = ["--json", "--skip-git-repo-check", *overrides]
    _, out = run([exe, "exec", *common, "hello"], env, cwd)
    thread = next(
        json.loads(line)["thread_id"]
        for line in out.splitlines()
        if line.startswith("{") and json.loads(line).get("type") == "thread.started"
    )
    return [
        run([exe, "exec", "resume", *common, thread, f"turn {n}"], env, cwd)[0]
        for n in range(turns)
    ]


# ---------------------------------------------------------------- benches


@dataclass(frozen=True)
class Bench:
    """One harness to measure: how to build it, and its one-shot mode if it has one."""

    name: str
    cli: str
    make: Callable[[ScriptedModelServer], Harness]
    one_shot: Callable[[HarnessConfig, Path, int, EpisodeContext], list[float]] | None = None


def benches() -> list[Bench]:
    """Every harness the benchmark knows; the ACP presets join when their module exists."""
    found = [
        Bench(
            "claude_code",
            "claude",
            lambda srv: ClaudeCodeHarness(
                executable=str(CLI_BIN / "claude"), model="scripted-model", base_url=srv.base_url
            ),
            lambda config, cwd, turns, ctx: claude_one_shot(config, cwd, turns),
        ),
        Bench(
            "codex",
            "codex",
            lambda srv: CodexHarness(
                executable=str(CLI_BIN / "codex"),
                model="scripted-model",
                base_url=srv.openai_base_url,
            ),
            codex_one_shot,
        ),
    ]
    try:
        from gym_harness.harnesses import acp_presets
    except ImportError:
        return found
    for name, cli, cls in (
        ("opencode", "opencode", "OpenCodeHarness"),
        ("qwen_code", "qwen", "QwenCodeHarness"),
    ):
        preset = getattr(acp_presets, cls, None)
        if preset is not None:
            found.append(
                Bench(
                    name,
                    cli,
                    lambda srv, p=preset, c=cli: p(
                        executable=str(CLI_BIN / c),
                        model="scripted-model",
                        base_url=srv.openai_base_url,
                    ),
                )
            )
    return found


def measure(bench: Bench, resets: int, turns: int) -> dict[str, float | str]:
    with ScriptedModelServer() as srv:
        harness = bench.make(srv)
        env = HarnessEnv(harness, tools=[add], turn_timeout_s=60, idle_timeout_s=30)
        reset_s, turn_s = [], []
        try:
            for _ in range(resets):
                start = time.perf_counter()
                _, info = env.reset()
                reset_s.append(time.perf_counter() - start)
                if info["error_type"]:
                    return {"error": f"reset: {info['error_type']}: {info['error'][:300]}"}
            for n in range(turns + 1):
                start = time.perf_counter()
                _, _, terminated, truncated, info = env.step(f"turn {n}")
                elapsed = time.perf_counter() - start
                if info["error_type"] or terminated or truncated:
                    return {"error": f"step: {info['error_type']}: {info['error'][:300]}"}
                if n:  # the first turn of claude -p includes its start-up: reported apart
                    turn_s.append(elapsed)
                else:
                    first_turn = elapsed
        finally:
            env.close()
        row: dict[str, float | str] = {
            "reset_s": statistics.median(reset_s),
            "first_turn_s": first_turn,
            "turn_s": statistics.median(turn_s),
        }
        if bench.one_shot is not None:
            row["one_shot_turn_s"] = statistics.median(one_shot(bench, srv, harness, turns))
            row["ratio"] = float(row["one_shot_turn_s"]) / float(row["turn_s"])
        return row


def one_shot(bench: Bench, srv: ScriptedModelServer, harness: Harness, turns: int) -> list[float]:
    assert bench.one_shot is not None
    bridge = MCPBridge(load_tools([add]))
    bridge.start()
    try:
        with tempfile.TemporaryDirectory(prefix="harness_bench-") as tmp:
            home, workspace = Path(tmp) / "home", Path(tmp) / "workspace"
            home.mkdir(mode=0o700)
            workspace.mkdir()
            ctx = EpisodeContext(
                episode_id="bench",
                workspace=workspace,
                home=home,
                bridge_url=bridge.url,
                bridge_token=bridge.token,
                tool_names=tuple(spec.name for spec in bridge.list_tools()),
            )
            config = harness.launch(ctx, HarnessConfig())
            return bench.one_shot(config, workspace, turns, ctx)
    finally:
        bridge.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--resets", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated harness names")
    args = parser.parse_args()
    isolate_network()
    # Providers' keys are not needed: the scripted model accepts any.
    os.environ.setdefault("ANTHROPIC_API_KEY", "bench-key")
    os.environ.setdefault("OPENAI_API_KEY", "bench-key")
    wanted = {n for n in args.only.split(",") if n}
    head = ("harness", "reset_s", "turn1_s", "turn_s", "oneshot_s", "ratio")
    print("{:<12} {:>8} {:>8} {:>8} {:>10} {:>7}".format(*head))
    for bench in benches():
        if wanted and bench.name not in wanted:
            continue
        if not (CLI_BIN / bench.cli).exists():
            print(f"{bench.name:<12} skipped: {bench.cli} not installed (bash .ci/install-clis.sh)")
            continue
        row = measure(bench, args.resets, args.turns)
        if "error" in row:
            print(f"{bench.name:<12} failed: {row['error']}")
            continue
        shot = row.get("one_shot_turn_s")
        shot_s = f"{shot:>10.3f}" if isinstance(shot, float) else f"{'-':>10}"
        ratio = row.get("ratio")
        ratio_s = f"{ratio:>6.1f}x" if isinstance(ratio, float) else f"{'-':>7}"
        print(
            f"{bench.name:<12} {row['reset_s']:>8.3f} {row['first_turn_s']:>8.3f} "
            f"{row['turn_s']:>8.3f} {shot_s} {ratio_s}",
            flush=True,
        )


if __name__ == "__main__":
    main()
