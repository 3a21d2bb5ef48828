"""HarnessEnv.step and reset beside a bare pipe on the same line-protocol harness.

The harness is ``tests/support/line_agent.py echo``: it prints ``{"type":"ready"}``, then
answers each message at once with four lines (text, tool_call, an unknown type,
turn_complete). Baselines, measured in the same run and interleaved with ours:

* step: a bare ``subprocess.Popen`` round trip: write one message line, read lines
  until ``turn_complete`` (goal: ``env.step`` under 1.5x); the two sides alternate in
  batches of ``STEP_BATCH`` steps;
* reset: a bare spawn-to-ready of the same script: ``Popen`` and read until the
  ready line (goal: ``env.reset`` under 1.3x). The bridge stays up across episodes,
  so the first reset (bridge start, fastmcp import) is reported apart;
* close: ``env.close()`` after a reset and one step (harness, keeper and bridge
  stopped), against an absolute goal of 20 ms (no baseline).

    python benchmarks/env_bench.py [--steps 2000] [--resets 30] [--closes 15] [--json] [--profile]

``--profile`` runs cProfile over steps and resets and prints where the caller's
thread spends its time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import subprocess
import sys
import time
from collections.abc import Callable

from _common import Row, format_table, interleaved, line_agent, median, ratio_row, timed

from gym_harness import HarnessEnv

MESSAGE = '{"type": "message", "content": "ping"}\n'
STEP_GOAL, RESET_GOAL, CLOSE_GOAL_MS = 1.5, 1.3, 20.0
#: Steps per side per round: the two sides alternate in batches, not sample by sample.
STEP_BATCH = 100


class BarePipe:
    """The echo harness under a plain Popen: the least any env could do."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            line_agent("echo"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        assert '"ready"' in ready, ready

    def round_trip(self) -> float:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        start = time.perf_counter()
        stdin.write(MESSAGE)
        stdin.flush()
        while '"turn_complete"' not in (line := stdout.readline()):
            assert line, "the harness closed its output"
        return time.perf_counter() - start

    def close(self) -> None:
        self.proc.communicate(timeout=10)  # closes stdin: the script ends on its own


def bare_spawn() -> float:
    """Seconds from Popen to the ready line (the process is ended outside the timing)."""
    pipe = BarePipe.__new__(BarePipe)
    elapsed = timed(pipe.__init__)  # type: ignore[misc]
    pipe.close()
    return elapsed


def make_env() -> HarnessEnv:
    return HarnessEnv("command", command=line_agent("echo"))


def measure(steps: int, resets: int) -> tuple[list[Row], dict[str, float]]:
    """Return the table rows and the first-reset times (seconds)."""
    env = make_env()
    try:
        first_reset = timed(env.reset)
        second_reset = timed(env.reset)
        bare_spawn()  # warm the page cache for both
        samples = interleaved(resets, bare=bare_spawn, ours=lambda: timed(env.reset))
        reset_row = ratio_row(
            "env.reset (2nd+)",
            samples["ours"],
            samples["bare"],
            unit="ms",
            scale=1e3,
            baseline_name="bare spawn-to-ready",
            limit=RESET_GOAL,
        )
        pipe = BarePipe()
        try:
            for _ in range(50):  # warm both paths
                pipe.round_trip()
                env.step("ping")
            trips = interleaved(
                max(1, steps // STEP_BATCH),
                STEP_BATCH,
                bare=pipe.round_trip,
                ours=lambda: timed(_step(env)),
            )
        finally:
            pipe.close()
        step_row = ratio_row(
            "env.step (instant echo)",
            trips["ours"],
            trips["bare"],
            unit="us",
            scale=1e6,
            baseline_name="bare pipe round trip",
            limit=STEP_GOAL,
        )
    finally:
        env.close()
    firsts = {"first_reset_s": first_reset, "second_reset_s": second_reset}
    return [step_row, reset_row], firsts


def measure_close(closes: int) -> Row:
    """Median ``env.close()`` of fresh envs, each after a reset and one step."""
    times = []
    for _ in range(closes):
        env = make_env()
        try:
            env.reset()
            env.step("ping")
        finally:
            times.append(timed(env.close))
    ms = median(times) * 1e3
    return Row(
        "env.close() (after reset + step)", ms, 0.0, "ms", "", f"<= {CLOSE_GOAL_MS:g} ms",
        met=ms <= CLOSE_GOAL_MS, note=f"n={closes}; max {max(times) * 1e3:.0f} ms",
    )  # fmt: skip


def _step(env: HarnessEnv) -> Callable[[], None]:
    def run() -> None:
        _, _, terminated, truncated, info = env.step("ping")
        assert not (terminated or truncated), info

    return run


def profile(steps: int, resets: int) -> str:
    """cProfile of ``steps`` steps and ``resets`` resets (caller's thread), as text."""
    env = make_env()
    out = io.StringIO()
    try:
        env.reset()
        for _ in range(50):
            env.step("ping")
        for what, count, fn in (
            ("env.step", steps, lambda: env.step("ping")),
            ("env.reset", resets, env.reset),
        ):
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(count):
                fn()
            prof.disable()
            out.write(f"\n=== {what} x{count}: top functions by own time (tottime)\n")
            stats = pstats.Stats(prof, stream=out).sort_stats("tottime")
            stats.print_stats(14)
            out.write(f"=== {what} x{count}: by cumulative time\n")
            stats.sort_stats("cumulative").print_stats(22)
    finally:
        env.close()
    return out.getvalue()


PHASES = {
    "step": (
        ("HarnessEnv.step", "gym_harness.env:HarnessEnv.step"),
        ("  TurnRunner.run", "gym_harness.turn:TurnRunner.run"),
        (
            "    HarnessProcess.write_line",
            "gym_harness.process.harness_process:HarnessProcess.write_line",
        ),
        (
            "    HarnessProcess.read_line (4 lines)",
            "gym_harness.process.harness_process:HarnessProcess.read_line",
        ),
        ("    CommandSession.feed (4 lines)", "gym_harness.harnesses.line:CommandSession.feed"),
        ("  HarnessEnv._record", "gym_harness.env:HarnessEnv._record"),
        ("  HarnessEnv._info", "gym_harness.env:HarnessEnv._info"),
    ),
    "reset": (
        ("HarnessEnv.reset", "gym_harness.env:HarnessEnv.reset"),
        ("  HarnessEnv._end_episode", "gym_harness.env:HarnessEnv._end_episode"),
        ("    HarnessProcess.stop", "gym_harness.process.harness_process:HarnessProcess.stop"),
        ("      _tree.end", "gym_harness.process.tree:end"),
        ("        KeeperClient.end", "gym_harness.process.keeper_client:KeeperClient.end"),
        ("      keeper release", "gym_harness.process.keeper_client:release"),
        ("    shutil.rmtree (workspace)", "shutil:rmtree"),
        ("  HarnessEnv._prepare_episode", "gym_harness.env:HarnessEnv._prepare_episode"),
        ("  HarnessEnv._start_harness", "gym_harness.env:HarnessEnv._start_harness"),
        ("    HarnessProcess._spawn", "gym_harness.process.harness_process:HarnessProcess._spawn"),
        ("      keeper acquire", "gym_harness.process.keeper_client:acquire"),
        ("      KeeperClient.spawn", "gym_harness.process.keeper_client:KeeperClient.spawn"),
        ("    TurnRunner.startup (wait ready)", "gym_harness.turn:TurnRunner.startup"),
    ),
}


def breakdown(steps: int, resets: int) -> str:
    """Median time per operation spent in each phase (wrapped at run time, env untouched)."""
    import importlib

    totals: dict[str, float] = {}
    patched: list[tuple[object, str, object]] = []

    def wrap(label: str, target: str) -> None:
        module_name, _, path = target.partition(":")
        owner: object = importlib.import_module(module_name)
        *parents, attr = path.split(".")
        for name in parents:
            owner = getattr(owner, name)
        original = getattr(owner, attr)

        def timed_call(*args: object, **kwargs: object) -> object:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                totals[label] = totals.get(label, 0.0) + time.perf_counter() - start

        patched.append((owner, attr, original))
        setattr(owner, attr, timed_call)

    lines = []
    env = make_env()
    try:
        env.reset()
        for _ in range(50):
            env.step("ping")
        for op, count, fn in (
            ("step", steps, lambda: env.step("ping")),
            ("reset", resets, lambda: env.reset()),
        ):
            for label, target in PHASES[op]:
                wrap(label, target)
            per_op: dict[str, list[float]] = {label: [] for label, _ in PHASES[op]}
            for _ in range(count):
                totals.clear()
                fn()
                for label in per_op:
                    per_op[label].append(totals.get(label, 0.0))
            while patched:
                owner, attr, original = patched.pop()
                setattr(owner, attr, original)
            unit, scale = ("us", 1e6) if op == "step" else ("ms", 1e3)
            lines.append(f"{op}: median {unit} per {op} spent in each phase (n={count})")
            for label, values in per_op.items():
                lines.append(f"  {label:<44}{median(values) * scale:>9.1f}")
    finally:
        env.close()
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per path")
    parser.add_argument("--resets", type=int, default=30, help="timed resets per path")
    parser.add_argument("--closes", type=int, default=15, help="timed closes (0: none)")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--profile", action="store_true", help="also cProfile steps and resets")
    args = parser.parse_args()
    rows, firsts = measure(args.steps, args.resets)
    if args.closes:
        rows.append(measure_close(args.closes))
    if args.json:
        print(json.dumps({"rows": [r.to_dict() for r in rows], **firsts}))
        return
    print(f"$ python {' '.join(sys.argv)}")
    print(f"harness: {' '.join(line_agent('echo'))}")
    print(format_table(rows, "medians, interleaved with the baseline in one run"))
    print(
        f"first reset (bridge start, fastmcp import): {firsts['first_reset_s'] * 1e3:.0f} ms; "
        f"second: {firsts['second_reset_s'] * 1e3:.0f} ms (excluded above)"
    )
    if args.profile:
        print(breakdown(min(args.steps, 2000), min(args.resets, 30)))
        print(profile(min(args.steps, 2000), min(args.resets, 30)))


if __name__ == "__main__":
    main()
