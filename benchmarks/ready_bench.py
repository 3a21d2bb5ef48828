"""As-ready stepping (``send``/``recv``) against synchronous stepping, with slow harnesses.

16 model-mode envs (``gym_harness/Reference-v0``). Each answer is a tool call to
``wait(ms)``, whose ``ms`` is drawn uniformly from 0-400 (seeded per env and call, the
same draws on every path), so the harness spends that long between two model calls, as
it would in a long tool call or a slow test run. The policy answers any batch in 20 ms
(a sleep). Three paths, alternating in rounds, each answering the same calls:

* ``make_vec(..., vectorization_mode="sync")``: gymnasium's ``SyncVectorEnv``, whose
  ``step`` steps the envs one after another;
* our vector env (``make_vec``'s default mode) with ``step``: all envs at once, each
  step waiting for the slowest;
* our vector env with ``send``/``recv(min_envs=1)``: the policy answers whatever is ready.

Printed: calls/s of each, the ratios (goal: send/recv >= 1.8x the synchronous
``make_vec``), and the mean batch ``recv`` handed the policy.

    python benchmarks/ready_bench.py [--envs 16] [--calls 4] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any

from _common import without_tools

ENV_ID = "gym_harness/Reference-v0"
LONG = 100_000  # max_tool_calls and max_episode_steps: no episode ends by a limit
POLICY_S = 0.020  # the policy's time per batch, whatever its size
MAX_WAIT_MS = 400
GOAL = 1.8


def wait(ms: int) -> str:
    """Sleep ``ms`` milliseconds (the harness's time between two model calls)."""
    time.sleep(ms / 1000)
    return "waited"


def action(ms: int) -> str:
    return json.dumps({"content": "", "tool_calls": [{"name": "wait", "arguments": {"ms": ms}}]})


def draws(n: int, calls: int, seed: int) -> list[list[int]]:
    """The wait of each env's each call (seeded: the same on every path)."""
    rng = random.Random(seed)
    return [[rng.randint(0, MAX_WAIT_MS) for _ in range(calls)] for _ in range(n)]


def reset(envs: Any) -> None:
    """Reset every env until each harness offers ``wait`` (see ``without_tools``)."""
    obs, infos = envs.reset(seed=0)
    without_tools(envs, obs, infos, "wait", seed=1)


def stepped(envs: Any, plan: list[list[int]]) -> float:
    """Answer every planned call with ``step`` (all envs per step); the seconds it took."""
    reset(envs)
    start = time.perf_counter()
    for k in range(len(plan[0])):
        time.sleep(POLICY_S)  # the policy answers the batch
        _, _, terminated, truncated, infos = envs.step([action(p[k]) for p in plan])
        if terminated.any() or truncated.any():
            raise RuntimeError(f"an episode ended: {list(infos['error'])[:3]}")
    return time.perf_counter() - start


def as_ready(envs: Any, plan: list[list[int]], batches: list[int]) -> float:
    """Answer every planned call with ``send``/``recv``; the seconds it took."""
    reset(envs)
    n, calls = len(plan), len(plan[0])
    sent = [0] * n
    start = time.perf_counter()
    ready = list(range(n))
    answered = 0
    while True:
        time.sleep(POLICY_S)  # the policy answers the batch
        envs.send([action(plan[i][sent[i]]) for i in ready], env_ids=ready)
        for i in ready:
            sent[i] += 1
        while True:
            _, _, terminated, _, infos = envs.recv(min_envs=1)
            if terminated.any():
                raise RuntimeError(f"an episode ended: {list(infos['error'])[:3]}")
            got = [int(i) for i in infos["env_id"]]
            answered += len(got)
            ready = [i for i in got if sent[i] < calls]
            batches.append(len(got))
            if ready or answered == n * calls:
                break
        if answered == n * calls:
            return time.perf_counter() - start


def measure(n: int, calls: int, rounds: int) -> dict[str, Any]:
    import gymnasium

    import gym_harness  # noqa: F401  (registers the env ids)

    kwargs: dict[str, Any] = {
        "num_envs": n, "mode": "model", "tools": [wait], "max_tool_calls": LONG,
        "max_episode_steps": LONG,
    }  # fmt: skip
    sync = gymnasium.make_vec(ENV_ID, vectorization_mode="sync", **kwargs)
    ours = gymnasium.make_vec(ENV_ID, **kwargs)
    rates: dict[str, list[float]] = {"sync make_vec step": [], "our step": [], "send/recv": []}
    batches: list[int] = []
    try:
        for r in range(rounds):
            plan = draws(n, calls, seed=r)
            total = n * calls
            rates["sync make_vec step"].append(total / stepped(sync, plan))
            rates["our step"].append(total / stepped(ours, plan))
            rates["send/recv"].append(total / as_ready(ours, plan, batches))
    finally:
        sync.close()
        ours.close()
    return {
        "envs": n,
        "calls_per_env": calls,
        "rounds": rounds,
        "calls_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "mean_recv_batch": statistics.mean(batches),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=16, help="model-mode envs")
    parser.add_argument("--calls", type=int, default=4, help="calls per env per round and path")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args()
    result = measure(args.envs, args.calls, args.rounds)
    if args.json:
        print(json.dumps(result))
        return
    rate = result["calls_per_s"]
    print(f"$ python {' '.join(sys.argv)}")
    print(f"{args.envs} model-mode envs; harness 0-{MAX_WAIT_MS} ms between calls (uniform, "
          f"seeded); policy {POLICY_S * 1e3:.0f} ms per batch; {args.calls} calls per env per "
          f"path, {args.rounds} alternating rounds (medians)")  # fmt: skip
    for name, value in rate.items():
        print(f"  {name:<20} {value:7.1f} calls/s")
    ready = rate["send/recv"]
    goal = ready / rate["sync make_vec step"]
    print(f"  send/recv / sync make_vec step: {goal:.2f}x   "
          f"(goal >= {GOAL}x: {'ok' if goal >= GOAL else 'MISS'})")  # fmt: skip
    print(f"  send/recv / our step (all at once): {ready / rate['our step']:.2f}x")
    print(f"  mean batch recv handed the policy: {result['mean_recv_batch']:.2f} envs")


if __name__ == "__main__":
    main()
