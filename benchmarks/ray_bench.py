"""Turns per second: RayVectorEnv on a local Ray instance beside AsyncVectorEnv.

Both step N sub-envs of gym_harness/Command-v0 over tests/support/line_agent.py, whose
turn waits --delay seconds (200 ms: a stand-in for a model call), for 1, 2, 4
and 8 envs in one run. Ray runs locally on 127.0.0.1 (logical CPUs = the largest
N, one per sub-env), so the figures show the overhead of each path, not a
cluster's extra machines. The ideal is N / delay turns per second.

    python benchmarks/ray_bench.py [--envs 1 2 4 8] [--steps 15] [--delay 0.2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from gym_harness.vector.factory import make_vector_env

AGENT = Path(__file__).resolve().parent.parent / "tests" / "support" / "line_agent.py"


def turns_per_second(envs: Any, n: int, steps: int) -> float:
    """Reset, one warm-up step, then ``steps`` timed steps of all ``n`` envs."""
    envs.reset(seed=0)
    actions = np.array([f"m{i}" for i in range(n)], dtype=object)
    envs.step(actions)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, info = envs.step(actions)
        assert not (terminated | truncated).any(), info["error"]
    return n * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--delay", type=float, default=0.2)
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from gym_harness.vector.ray import RayVectorEnv

    command = [sys.executable, str(AGENT), "echo", "--delay", str(args.delay)]
    ray.init(
        num_cpus=max(args.envs),
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    print(f"turn delay {args.delay * 1000:.0f} ms, {args.steps} timed steps per run")
    print(f"{'envs':>4} {'ideal':>8} {'async':>8} {'ray':>8}  (turns/s)")
    try:
        for n in args.envs:
            local = make_vector_env(n, harness="command", command=command)
            try:
                async_rate = turns_per_second(local, n, args.steps)
            finally:
                local.close()
            remote = RayVectorEnv(
                "gym_harness/Command-v0",
                n,
                env_kwargs={"command": command},
                resources_per_env={"num_cpus": 1},
            )
            try:
                ray_rate = turns_per_second(remote, n, args.steps)
            finally:
                remote.close()
            ideal = n / args.delay
            print(f"{n:>4} {ideal:>8.2f} {async_rate:>8.2f} {ray_rate:>8.2f}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
