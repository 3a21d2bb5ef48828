"""Reset and per-turn time of the real-CLI harnesses, beside each CLI's own one-shot mode.

Per CLI, against the instant scripted model server (tests/support/model_server.py) and
the env's MCP bridge, all on 127.0.0.1:

* long-lived: ``HarnessEnv`` reset time (spawn + handshake + tool check) and
  per-turn time (one ``step``) on one long-lived process;
* one-shot: the same turn as a fresh process per turn that resumes the
  conversation in the CLI's own non-interactive mode (stdin closed), with the
  config files and environment the harness itself writes and the same MCP
  server (see ``ONE_SHOT_MODES``, printed under the table); a first one-shot
  turn makes the session and is not timed. The bench checks the one-shot runs
  listed the env tools on the bridge and that the last turn carried the first;
* the ratio one-shot / long-lived per turn.

Runs itself inside a fresh loopback-only network namespace (like the tests).

Usage::

    python benchmarks/harness_bench.py [--turns 10] [--resets 3] [--only claude_code,codex]

Adding a harness: append a ``Bench`` to ``benches()``; ``one_shot`` may be
``None`` where the CLI has no one-shot mode (the column then shows ``-``).
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
CLI_BIN = ROOT / ".clis" / "node_modules" / ".bin"

from support.model_server import ScriptedModelServer  # noqa: E402

from gym_harness import HarnessEnv  # noqa: E402
from gym_harness.bridge.server import MCPBridge  # noqa: E402
from gym_harness.bridge.tools import load_tools  # noqa: E402
from gym_harness.config import HarnessConfig  # noqa: E402
from gym_harness.harnesses._common import write_private  # noqa: E402
from gym_harness.harnesses.acp_presets import (  # noqa: E402
    GeminiCLIHarness,
    OpenCodeHarness,
    QwenCodeHarness,
)
from gym_harness.harnesses.base import EpisodeContext, Harness  # noqa: E402
from gym_harness.harnesses.claude_code import ClaudeCodeHarness  # noqa: E402
from gym_harness.harnesses.codex import CodexHarness  # noqa: E402

ONE_SHOT_TIMEOUT_S = 60.0
#: The one-shot turn that makes the session; later turns must still carry it.
FIRST = "hello from the first turn"
#: What each one-shot column runs, printed as the table's footnote.
ONE_SHOT_MODES = {
    "claude_code": "claude -p MSG --output-format json --resume SESSION",
    "codex": "codex exec resume --json THREAD MSG (MCP server via -c)",
    "opencode": "opencode run --pure --format json --session ID MSG"
    " (MCP server added to the preset's opencode.json)",
    "qwen_code": "qwen --auth-type openai -o json --resume ID --mcp-config FILE MSG",
    "gemini_cli": "gemini -o json --resume ID -p MSG (MCP server in the preset's settings.json)",
}


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


def resumed(
    env: dict[str, str],
    cwd: Path,
    turns: int,
    first: list[str],
    session_of: Callable[[str], str],
    then: Callable[[str, str], list[str]],
) -> list[float]:
    """Run ``first`` (untimed), read its session id, then time ``then(session, msg)`` per turn."""
    _, out = run(first, env, cwd)
    session = session_of(out)
    return [run(then(session, f"turn {n}"), env, cwd)[0] for n in range(turns)]


def without(command: Sequence[str], *flags: str) -> list[str]:
    """The preset's argv minus its ACP switch: the rest (model, auth) holds for one-shot too."""
    return [arg for arg in command if arg not in flags]


def claude_one_shot(config: HarnessConfig, cwd: Path, turns: int) -> list[float]:
    """``claude -p MSG --resume SESSION`` per turn, after a first turn that makes the session."""
    base = list(config.command)
    for flag in ("--input-format", "--output-format"):
        i = base.index(flag)
        del base[i : i + 2]

    def cmd(message: str, *resume: str) -> list[str]:
        return [base[0], "-p", message, *base[2:], "--output-format", "json", *resume]

    def session_of(out: str) -> str:
        parsed = json.loads(out)  # with --verbose: the list of every message
        return str(next(m for m in parsed if m.get("type") == "result")["session_id"])

    return resumed(
        spawn_env(config), cwd, turns, cmd(FIRST), session_of, lambda s, m: cmd(m, "--resume", s)
    )


def codex_one_shot(
    config: HarnessConfig, cwd: Path, turns: int, ctx: EpisodeContext
) -> list[float]:
    """``codex exec resume --json THREAD MSG`` per turn (MCP server given with ``-c``)."""
    exe = config.command[0]
    entry = CodexHarness().mcp_server_entry(ctx)
    overrides: list[str] = []
    for key, value in entry.items():
        overrides += ["-c", f"mcp_servers.{ctx.server_name}.{key}={json.dumps(value)}"]
    common = ["--json", "--skip-git-repo-check", *overrides]

    def thread_of(out: str) -> str:
        events = (json.loads(line) for line in out.splitlines() if line.startswith("{"))
        return str(next(e["thread_id"] for e in events if e.get("type") == "thread.started"))

    return resumed(
        spawn_env(config),
        cwd,
        turns,
        [exe, "exec", *common, FIRST],
        thread_of,
        lambda thread, msg: [exe, "exec", "resume", *common, thread, msg],
    )


def opencode_one_shot(
    config: HarnessConfig, cwd: Path, turns: int, ctx: EpisodeContext
) -> list[float]:
    """``opencode run --session ID MSG`` per turn.

    ``opencode run`` has no ``session/new`` to carry the MCP server, so it joins
    the preset's ``opencode.json``; the token stays in the environment.
    """
    path = ctx.home / ".config" / "opencode" / "opencode.json"
    settings = json.loads(path.read_text())
    auth = {"Authorization": "Bearer {env:BENCH_BRIDGE_TOKEN}"}
    settings["mcp"] = {ctx.server_name: {"type": "remote", "url": ctx.bridge_url, "headers": auth}}
    write_private(path, json.dumps(settings))
    env = {**spawn_env(config), "BENCH_BRIDGE_TOKEN": ctx.bridge_token}
    exe, *rest = without(config.command, "acp")
    common = [exe, "run", *rest, "--format", "json"]
    return resumed(
        env,
        cwd,
        turns,
        [*common, FIRST],
        lambda out: str(json.loads(out.splitlines()[0])["sessionID"]),
        lambda session, msg: [*common, "--session", session, msg],
    )


def qwen_one_shot(config: HarnessConfig, cwd: Path, turns: int, ctx: EpisodeContext) -> list[float]:
    """``qwen -o json --resume ID MSG`` per turn, the MCP server in a private ``--mcp-config``."""
    server = {"httpUrl": ctx.bridge_url, "headers": {"Authorization": f"Bearer {ctx.bridge_token}"}}
    mcp_file = ctx.home / "bench-mcp.json"
    write_private(mcp_file, json.dumps({"mcpServers": {ctx.server_name: server}}))
    common = [*without(config.command, "--acp"), "-o", "json", "--mcp-config", str(mcp_file)]
    return resumed(
        spawn_env(config),
        cwd,
        turns,
        [*common, FIRST],
        lambda out: str(json.loads(out)[0]["session_id"]),
        lambda session, msg: [*common, "--resume", session, msg],
    )


def gemini_one_shot(
    config: HarnessConfig, cwd: Path, turns: int, ctx: EpisodeContext
) -> list[float]:
    """``gemini -o json --resume ID -p MSG`` per turn (MCP server: preset's settings)."""
    common = [*without(config.command, "--experimental-acp", "--acp"), "-o", "json"]
    return resumed(
        spawn_env(config),
        cwd,
        turns,
        [*common, "-p", FIRST],
        lambda out: str(json.loads(out)["session_id"]),
        lambda session, msg: [*common, "--resume", session, "-p", msg],
    )


# ---------------------------------------------------------------- benches


@dataclass(frozen=True)
class Bench:
    """One harness to measure: how to build it, and its one-shot mode if it has one."""

    name: str
    cli: str
    make: Callable[[ScriptedModelServer], Harness]
    one_shot: Callable[[HarnessConfig, Path, int, EpisodeContext], list[float]] | None = None


def benches() -> list[Bench]:
    """Every harness the benchmark knows."""

    def preset(
        cls: Callable[..., Harness], cli: str, openai: bool
    ) -> Callable[[ScriptedModelServer], Harness]:
        return lambda srv: cls(
            executable=str(CLI_BIN / cli),
            model="scripted-model",
            base_url=srv.openai_base_url if openai else srv.base_url,
        )

    return [
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
        Bench("opencode", "opencode", preset(OpenCodeHarness, "opencode", True), opencode_one_shot),
        Bench("qwen_code", "qwen", preset(QwenCodeHarness, "qwen", True), qwen_one_shot),
        Bench("gemini_cli", "gemini", preset(GeminiCLIHarness, "gemini", False), gemini_one_shot),
    ]


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
            try:
                row["one_shot_turn_s"] = statistics.median(one_shot(bench, srv, harness, turns))
            except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as exc:
                # One CLI's one-shot failing must not hide the others' figures.
                row["one_shot_error"] = f"{type(exc).__name__}: {exc}"[:400]
                return row
            row["ratio"] = float(row["one_shot_turn_s"]) / float(row["turn_s"])
        return row


def one_shot(bench: Bench, srv: ScriptedModelServer, harness: Harness, turns: int) -> list[float]:
    """Time ``bench``'s one-shot turns in a fresh private home, then check they were real."""
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
            config = harness.launch(ctx, HarnessConfig()).config
            times = bench.one_shot(config, workspace, turns, ctx)
        if not bridge.tools_listed:
            raise RuntimeError("the one-shot runs never listed the env tools on the bridge")
        # A resumed turn sends the whole conversation: the last one must carry the first turn.
        last = f"turn {turns - 1}".encode()
        if not any(last in r.raw and FIRST.encode() in r.raw for r in srv.requests()):
            raise RuntimeError(f"no model request with {last!r} carried the first turn")
        return times
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
    os.environ.setdefault("GEMINI_API_KEY", "bench-key")
    wanted = {n for n in args.only.split(",") if n}
    head = ("harness", "reset_s", "turn1_s", "turn_s", "oneshot_s", "ratio")
    print("{:<12} {:>8} {:>8} {:>8} {:>10} {:>7}".format(*head))
    shown = [bench for bench in benches() if not wanted or bench.name in wanted]
    for bench in shown:
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
        if "one_shot_error" in row:
            print(f"{'':<12} one-shot failed: {row['one_shot_error']}", flush=True)
    print(f"\nmedians; {args.resets} resets, {args.turns} turns; oneshot_s: one fresh process")
    print("per turn resuming the session its untimed first turn made:")
    for bench in shown:
        if bench.one_shot is not None:
            print(f"  {bench.name:<12} {ONE_SHOT_MODES[bench.name]}")


if __name__ == "__main__":
    main()
