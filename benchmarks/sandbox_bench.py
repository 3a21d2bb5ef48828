"""What confinement costs: reset (spawn to ready) and one bridge round trip, per tier.

One env per ``sandbox`` tier (``off``, ``auto``, ``strict`` where it can be had) on the
same stdlib-only line-protocol harness (``benchmarks/sandbox_harness.py``), which times
its own HTTP round trips to the bridge from inside its confinement. Rounds are interleaved (each
round resets every env once, then each makes its calls), so machine noise hits every
tier alike; prints the medians and each tier's difference from ``off``.

    python benchmarks/sandbox_bench.py [--rounds 30] [--calls 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from gym_harness import HarnessEnv
from gym_harness.process import sandbox

HARNESS = str(Path(__file__).resolve().with_name("sandbox_harness.py"))


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    tiers = ["off", "auto"] + ([] if sandbox.report("strict")["missing"] else ["strict"])
    envs = {
        tier: HarnessEnv(
            "command", command=[sys.executable, "-S", HARNESS], tools=[add], sandbox=tier
        )
        for tier in tiers
    }
    resets: dict[str, list[float]] = {tier: [] for tier in tiers}
    calls: dict[str, list[float]] = {tier: [] for tier in tiers}
    try:
        for env in envs.values():  # warm: imports, servers, the keeper
            env.reset()
            env.step("20")
        for _ in range(args.rounds):
            for tier, env in envs.items():
                start = time.perf_counter()
                _, info = env.reset()
                resets[tier].append(time.perf_counter() - start)
                assert not info["error_type"], info["error"]
                reply, _, _, _, info = env.step(str(args.calls))
                assert not info["error_type"], info["error"]
                calls[tier].append(float(reply))
    finally:
        for env in envs.values():
            env.close()
    print(
        f"sandbox_bench: {args.rounds} interleaved rounds, {args.calls} bridge round trips a round"
    )
    strongest = sandbox.report(tiers[-1])
    print(f"  in force under {tiers[-1]}: {', '.join(strongest['enforced'])}")
    base_reset = statistics.median(resets["off"]) * 1e3
    base_call = statistics.median(calls["off"])
    for tier in tiers:
        reset_ms = statistics.median(resets[tier]) * 1e3
        call_us = statistics.median(calls[tier])
        print(
            f"  {tier:>6}: reset {reset_ms:7.2f} ms ({reset_ms - base_reset:+.2f} ms vs off)   "
            f"bridge round trip {call_us:6.1f} us ({call_us - base_call:+.1f} us vs off)"
        )


if __name__ == "__main__":
    main()
