"""Time until a forked child's first observation, beside a reset and a policy's replay.

Run: ``python benchmarks/fork_bench.py [--harness reference|claude_code] [--rounds 5]``

Model mode. For each K in 1, 5, 20 a parent episode answers K-1 model calls (each an
env tool call) and holds call K; then it prints the median over ``--rounds`` of:

* ``reset``: a plain ``reset()`` to the first observation;
* ``fork@K``: ``fork()`` to the child's first observation (replay of K-1 answers);
* ``policy@K``: a fresh episode driven to call K by a policy that takes 50 ms a call;
* ``own/call``: the harness's own time per call (the parent's way to call K with an
  instant policy, less its reset, over K-1);
* ``fork/bound``: the median over the rounds of each round's ``fork@K / (reset + (K-1) x
  own/call)``, the bound being that round's parent's own time to call K (a round's figures
  share the machine's state at the time, so the ratio is steadier than a ratio of medians);
* the goal: ``fork/bound <= 1.1``.

Claude Code runs in a loopback-only network namespace made here (root or user
namespaces), with a dummy key: the env is its model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness_bench import isolate_network

from gym_harness import HarnessEnv

CALLS = (1, 5, 20)
POLICY_S = 0.05
#: The goal: a fork within 10% of its round's reset plus K-1 of the harness's own calls.
GOAL = 1.1
ROOT = Path(__file__).resolve().parent.parent


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def make(harness: str) -> HarnessEnv:
    task = [{"id": "t", "prompt": "add numbers, many times"}]
    if harness == "reference":
        return HarnessEnv("reference", mode="model", tools=[add], tasks=task, max_tool_calls=64)
    os.environ["ANTHROPIC_API_KEY"] = "bench-key"  # a dummy: the env gives the CLI its own
    claude = str(ROOT / ".clis" / "node_modules" / ".bin" / "claude")
    return HarnessEnv("claude_code", mode="model", model="m1", executable=claude, tools=[add],
                      tasks=task, turn_timeout_s=300, idle_timeout_s=200)  # fmt: skip


def tool_call(obs: str, n: int) -> str:
    names = [t["function"]["name"] for t in json.loads(obs)["tools"]]
    name = next(x for x in names if x.endswith("add"))
    call = {"id": f"call_bench{n:04d}", "name": name, "arguments": {"a": n, "b": 1}}
    return json.dumps({"content": "", "tool_calls": [call]})


def to_call(env: HarnessEnv, k: int, pause_s: float = 0.0) -> tuple[float, float, str]:
    """Reset, then answer calls 1..k-1: (reset seconds, total seconds, observation)."""
    start = time.perf_counter()
    obs, info = env.reset(seed=0)
    reset_s = time.perf_counter() - start
    assert info["error_type"] == "", info["error"]
    for n in range(1, k):
        time.sleep(pause_s)
        obs, _, terminated, _, info = env.step(tool_call(obs, n))
        assert not terminated, info
    return reset_s, time.perf_counter() - start, obs


def measure(harness: str, k: int) -> dict[str, float]:
    parent = make(harness)
    try:
        reset_s, reach_s, _ = to_call(parent, k)
        start = time.perf_counter()
        child, _, info = parent.fork()
        fork_s = time.perf_counter() - start
        child.close()
        assert info["fork"]["replayed"] == k and info["fork"]["diverged_at"] is None, info
        _, policy_s, _ = to_call(parent, k, POLICY_S)
    finally:
        parent.close()
    own = (reach_s - reset_s) / (k - 1) if k > 1 else 0.0
    # reset + (K-1) x own is the time the parent took to reach call K.
    return {"reset": reset_s, "fork": fork_s, "policy": policy_s, "own": own,
            "ratio": fork_s / reach_s}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harness", choices=("reference", "claude_code"), default="reference")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.harness != "reference":
        isolate_network()
    print(f"{args.harness}: medians of {args.rounds} rounds, seconds")
    header = f"{'K':>3} {'reset':>7} {'fork@K':>7} {'policy@K':>9} {'own/call':>9}"
    print(f"{header} {'fork/bound':>10}  met")
    for k in CALLS:
        rows = [measure(args.harness, k) for _ in range(args.rounds)]
        med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        met = "yes" if med["ratio"] <= GOAL else "no"
        print(
            f"{k:>3} {med['reset']:7.3f} {med['fork']:7.3f} {med['policy']:9.3f} "
            f"{med['own']:9.4f} {med['ratio']:10.3f}  {met}"
        )


if __name__ == "__main__":
    main()
