"""The reference harness's first tool-call turn of an episode against its later ones.

Each episode of ``gym_harness/Reference-v0`` resets, then runs four tool-call turns
(``/call add {...}``); the first is timed apart from the three after it. The goal: the
first tool-call turn takes at most 50 ms, or at most 2x the later ones (the median over
episodes of each episode's first / median of its later turns). CPU time per turn of the
harness's tree is reported beside the wall times.

Run: ``python benchmarks/first_call_bench.py [--episodes 10]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium
import psutil

import gym_harness  # noqa: F401  (registers the env ids)
from gym_harness import HarnessEnv


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its children so far."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            times = proc.cpu_times()
            total += times.user + times.system
    except psutil.Error:
        pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10)
    args = parser.parse_args()
    env = gymnasium.make("gym_harness/Reference-v0")
    firsts, laters, ratios, cpu_first, cpu_later = [], [], [], [], []
    try:
        for episode in range(args.episodes):
            env.reset(seed=episode)
            proc = HarnessEnv.of(env).process
            assert proc is not None and proc.pid is not None
            walls, cpus = [], []
            for i in range(4):
                cpu = tree_cpu_s(proc.pid)
                start = time.perf_counter()
                obs, *_ = env.step(f'/call add {{"a": {i}, "b": {episode}}}')
                walls.append(time.perf_counter() - start)
                cpus.append(tree_cpu_s(proc.pid) - cpu)
                assert "tool" in obs or str(i + episode) in obs, obs
            firsts.append(walls[0])
            laters.extend(walls[1:])
            ratios.append(walls[0] / statistics.median(walls[1:]))
            cpu_first.append(cpus[0])
            cpu_later.extend(cpus[1:])
    finally:
        env.close()
    ms = 1000.0
    first, later = statistics.median(firsts) * ms, statistics.median(laters) * ms
    ratio = statistics.median(ratios)
    print(f"episodes: {args.episodes}")
    print(f"first tool-call turn: median {first:.1f} ms, max {max(firsts) * ms:.1f} ms")
    print(f"later tool-call turns: median {later:.1f} ms")
    print(f"first / later (median of per-episode ratios): {ratio:.2f}x")
    print(
        f"harness CPU per turn: first {statistics.median(cpu_first) * ms:.1f} ms, "
        f"later {statistics.median(cpu_later) * ms:.1f} ms"
    )
    held = first <= 50.0 or ratio <= 2.0
    print(f"goal (first <= 50 ms or <= 2x the later turns): {'met' if held else 'missed'}")


if __name__ == "__main__":
    main()
