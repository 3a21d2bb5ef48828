"""Spawn-to-ready time and line round-trip time: HarnessProcess beside a bare Popen.

Both drive the same echo script (tests/support/scripts/harness.py echo: prints
{"type":"ready"}, then echoes each line). Bare and HarnessProcess runs alternate
within each round, so machine noise hits both alike; prints medians and their ratios.

A HarnessProcess is forked by a keeper process (``gym_harness.process.keeper``). Two
spawn figures: with the keeper held between harnesses (``keeper_client.hold``, what an
env does across resets: the figure of record), and cold (no hold: each harness
starts its own keeper first, ~one bare Python start-up more).

    python benchmarks/process_bench.py [--spawns 30] [--round-trips 2000]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gym_harness.config import ProcessSpec
from gym_harness.process.harness_process import HarnessProcess
from gym_harness.process.keeper_client import hold, unhold
from gym_harness.readiness import start_ready

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "support" / "scripts" / "harness.py"
ECHO = (sys.executable, str(SCRIPT), "echo")
READY = '{"type":"ready"}'
LINE = '{"type":"message","content":"ping"}'


class BareEcho:
    """The echo script under a plain Popen: write, flush, readline."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            ECHO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().rstrip("\n") == READY

    def round_trip(self) -> float:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        start = time.perf_counter()
        stdin.write(LINE + "\n")
        stdin.flush()
        line = stdout.readline()
        elapsed = time.perf_counter() - start
        assert line.rstrip("\n") == LINE
        return elapsed

    def close(self) -> None:
        self.proc.communicate(timeout=10)


class OurEcho:
    """The echo script under HarnessProcess: write_line, read_line."""

    def __init__(self) -> None:
        self.proc = HarnessProcess(ProcessSpec(command=ECHO))
        start_ready(self.proc, lambda line: line == READY)

    def round_trip(self) -> float:
        start = time.perf_counter()
        self.proc.write_line(LINE, timeout_s=10)
        line = self.proc.read_line(timeout_s=10)
        elapsed = time.perf_counter() - start
        assert line == LINE
        return elapsed

    def close(self) -> None:
        self.proc.stop()


def spawn_bare() -> float:
    start = time.perf_counter()
    echo = BareEcho()
    elapsed = time.perf_counter() - start
    echo.close()
    return elapsed


def spawn_ours() -> float:
    start = time.perf_counter()
    echo = OurEcho()
    elapsed = time.perf_counter() - start
    echo.close()
    return elapsed


def spawn_rounds(runs: int) -> tuple[float, float, float]:
    """Medians of bare, held-keeper and cold-keeper spawns, interleaved per round."""
    bare, held, cold = [], [], []
    for _ in range(runs):
        bare.append(spawn_bare())
        cold.append(spawn_ours())  # no hold: the keeper starts with this harness
        hold()
        try:
            OurEcho().close()  # untimed: leaves an idle keeper
            held.append(spawn_ours())
        finally:
            unhold()
    return statistics.median(bare), statistics.median(held), statistics.median(cold)


def interleaved(
    bare: Callable[[], float], ours: Callable[[], float], runs: int
) -> tuple[float, float]:
    """Medians of ``runs`` alternating calls of each."""
    bare_times, our_times = [], []
    for _ in range(runs):
        bare_times.append(bare())
        our_times.append(ours())
    return statistics.median(bare_times), statistics.median(our_times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=30)
    parser.add_argument("--round-trips", type=int, default=2000)
    args = parser.parse_args()
    spawn_rounds(2)  # warm up: watcher thread, imports, page cache
    bare_ms, held_ms, cold_ms = (t * 1e3 for t in spawn_rounds(args.spawns))
    bare, ours = BareEcho(), OurEcho()
    try:
        trip = [t * 1e6 for t in interleaved(bare.round_trip, ours.round_trip, args.round_trips)]
    finally:
        bare.close()
        ours.close()
    print(f"$ python {' '.join(sys.argv)}")
    print(f"echo harness: python {SCRIPT} echo")
    print(f"{'median':<34}{'bare Popen':>12}{'HarnessProcess':>16}{'ratio':>8}")
    for name, (b, o) in (
        (f"spawn to ready, ms (n={args.spawns})", (bare_ms, held_ms)),
        ("  cold: keeper started too, ms", (bare_ms, cold_ms)),
        (f"line round trip, us (n={args.round_trips})", trip),
    ):
        print(f"{name:<34}{b:>12.2f}{o:>16.2f}{o / b:>8.2f}")


if __name__ == "__main__":
    main()
