"""Many model-mode envs on one machine: what one more env costs, and that close() frees it all.

``gymnasium.make_vec("gym_harness/Reference-v0", num_envs=N, mode="model")`` (our vector
entry point: a worker process per env, each with its harness under a keeper), driven with
``send``/``recv`` and with ``step``. Printed, for N envs:

* **first reset of all**: ``make_vec`` plus the first ``reset()`` (workers, keepers,
  harnesses and servers start), and a second ``reset()``; how many harnesses found no
  tools (their MCP connect timed out in the start storm: those are reset again);
* **calls/s**: model calls answered per second, each answer a tool call (the harness
  runs it over the bridge and makes its next call), through synchronous ``step`` and
  through ``send``/``recv`` (as ready, ``min_envs=1``), alternating in rounds; the mean
  batch ``recv`` returned;
* **per env**: PSS of the whole process tree (this process included, its own before
  ``make_vec`` taken off) over N, ours (workers, keepers, this process's share) apart from
  the harness's (the reference agent: the workload, not ours); processes, threads and
  open fds of the tree over N, and by kind (worker, keeper, harness);
* **after close()**: processes, threads, fds and listening sockets left beside those
  before ``make_vec``, and workspace directories left (all must be 0).

    python benchmarks/many_envs_bench.py [--envs 64] [--rounds 3] [--steps 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
from _common import tree_pss_mb, without_tools

ENV_ID = "gym_harness/Reference-v0"
LONG = 100_000  # max_tool_calls and max_episode_steps: no episode ends by a limit
TOOL = json.dumps({"content": "", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]})


def ended(terminated: Any, truncated: Any, infos: dict[str, Any]) -> str:
    """What ended the episodes that ended ("" when none did)."""
    ids = [i for i, (a, b) in enumerate(zip(terminated, truncated, strict=True)) if a or b]
    return "; ".join(f"env {i}: {infos['error_type'][i]} {infos['error'][i]}" for i in ids[:3])


def tree() -> list[psutil.Process]:
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def kind(proc: psutil.Process) -> str:
    try:
        line = " ".join(proc.cmdline())
    except psutil.Error:
        return "gone"
    if proc.pid == os.getpid():
        return "parent"
    if "keeper.py" in line:
        return "keeper"
    if "reference" in line:
        return "harness"
    return "worker"


def census() -> dict[str, Any]:
    """Processes, threads and fds of this process tree, by kind; listening sockets."""
    counts: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    fds: Counter[str] = Counter()
    pss: Counter[str] = Counter()
    pids = set()
    for proc in tree():
        try:
            k = kind(proc)
            threads[k] += proc.num_threads()
            fds[k] += proc.num_fds()
            pss[k] += round(proc.memory_full_info().pss / 1e6, 1)
            counts[k] += 1
            pids.add(proc.pid)
        except psutil.Error:
            continue
    listening = sum(
        1
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    )
    return {
        "processes": dict(counts),
        "threads": dict(threads),
        "fds": dict(fds),
        "pss_mb": dict(pss),
        "listening": listening,
    }


def workspace_roots(envs: Any) -> list[Path]:
    """Each env's workspace root (the ``gym_harness-*`` directory of its episode)."""
    return [Path(w).parent.parent for w in envs.get_attr("workspace")]


def measure(n: int, rounds: int, steps: int) -> dict[str, Any]:
    import gymnasium

    import gym_harness  # noqa: F401  (registers the env ids)

    before, before_pss = census(), tree_pss_mb(os.getpid())
    before_threads = threading.active_count()
    start = time.perf_counter()
    envs = gymnasium.make_vec(ENV_ID, num_envs=n, mode="model", max_tool_calls=LONG,
                              max_episode_steps=LONG)  # fmt: skip
    made = time.perf_counter() - start
    try:
        obs, infos = envs.reset(seed=0)
        first_reset = time.perf_counter() - start
        no_tools = [without_tools(envs, obs, infos, "add", seed=1)]
        start = time.perf_counter()
        obs, infos = envs.reset(seed=2)
        second_reset = time.perf_counter() - start
        no_tools.append(without_tools(envs, obs, infos, "add", seed=3))
        actions = [TOOL] * n
        sync_rates, ready_rates, batches = [], [], []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(steps):
                _, _, terminated, truncated, infos = envs.step(actions)
                if why := ended(terminated, truncated, infos):
                    raise RuntimeError(f"an episode ended: {why}")
            sync_rates.append(n * steps / (time.perf_counter() - start))
            start, answered = time.perf_counter(), 0
            left = [steps] * n  # calls still to answer, per env
            envs.send(actions)
            while answered < n * steps:
                _, _, terminated, truncated, infos = envs.recv(min_envs=1)
                if why := ended(terminated, truncated, infos):
                    raise RuntimeError(f"an episode ended: {why}")
                ids = [int(i) for i in infos["env_id"]]
                answered += len(ids)
                batches.append(len(ids))
                for i in ids:
                    left[i] -= 1
                again = [i for i in ids if left[i] > 0]
                if again:
                    envs.send([TOOL] * len(again), env_ids=again)
            ready_rates.append(answered / (time.perf_counter() - start))
        roots = workspace_roots(envs)
        during = census()
        pss = tree_pss_mb(os.getpid()) - before_pss
        harness_pss = during["pss_mb"].get("harness", 0.0)
    finally:
        envs.close()
    deadline = time.monotonic() + 15
    after = census()
    while time.monotonic() < deadline and sum(after["processes"].values()) > 1:
        time.sleep(0.2)
        after = census()
    total = {k: sum(during[k].values()) - sum(before[k].values()) for k in ("threads", "fds")}
    after.pop("pss_mb")
    procs = sum(during["processes"].values()) - sum(before["processes"].values())
    return {
        "envs": n,
        "make_vec_s": made,
        "first_reset_s": first_reset,
        "second_reset_s": second_reset,
        "harnesses_without_tools": no_tools,
        "sync_calls_per_s": statistics.median(sync_rates),
        "ready_calls_per_s": statistics.median(ready_rates),
        "mean_recv_batch": statistics.mean(batches),
        "pss_per_env_mb": pss / n,
        "env_pss_per_env_mb": (pss - harness_pss) / n,
        "harness_pss_per_env_mb": harness_pss / n,
        "processes_per_env": procs / n,
        "threads_per_env": total["threads"] / n,
        "fds_per_env": total["fds"] / n,
        "by_kind": during,
        "left_after_close": {
            "processes": sum(after["processes"].values()) - sum(before["processes"].values()),
            "threads": sum(after["threads"].values()) - sum(before["threads"].values()),
            "parent_threads": threading.active_count() - before_threads,
            "fds": sum(after["fds"].values()) - sum(before["fds"].values()),
            "listening": after["listening"] - before["listening"],
            "workspaces": sum(1 for root in roots if root.exists()),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=64, help="how many model-mode envs")
    parser.add_argument("--rounds", type=int, default=3, help="alternating step/recv rounds")
    parser.add_argument("--steps", type=int, default=10, help="calls per env per round")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args()
    result = measure(args.envs, args.rounds, args.steps)
    if args.json:
        print(json.dumps(result))
        return
    n = result["envs"]
    print(f"$ python {' '.join(sys.argv)}")
    print(f"{n} model-mode envs ({ENV_ID}, make_vec default mode) on {os.cpu_count()} cores, "
          f"{psutil.virtual_memory().total / 2**30:.1f} GiB")  # fmt: skip
    print(f"  make_vec                         {result['make_vec_s']:8.2f} s")
    print(f"  make_vec + first reset of all    {result['first_reset_s']:8.2f} s")
    print(f"  second reset of all              {result['second_reset_s']:8.2f} s")
    print("  harnesses that found no tools at reset (reset again): "
          f"{result['harnesses_without_tools']}  (their MCP connect's 30 s ran out)")  # fmt: skip
    print(f"  calls/s, step (all {n} at once)   {result['sync_calls_per_s']:8.1f}")
    print(f"  calls/s, send/recv (min_envs=1)  {result['ready_calls_per_s']:8.1f}"
          f"   mean recv batch {result['mean_recv_batch']:.1f}")  # fmt: skip
    print(f"  PSS per env, ours (worker, keeper, parent's share)"
          f" {result['env_pss_per_env_mb']:6.1f} MB   (goal <= 30)")  # fmt: skip
    print(f"  PSS per env, the harness (the reference agent)"
          f"     {result['harness_pss_per_env_mb']:6.1f} MB")  # fmt: skip
    print(f"  PSS per env, all                 {result['pss_per_env_mb']:8.1f} MB")
    print(f"  processes per env                {result['processes_per_env']:8.2f}")
    print(f"  threads per env                  {result['threads_per_env']:8.2f}")
    print(f"  fds per env                      {result['fds_per_env']:8.2f}")
    during = result["by_kind"]
    for what in ("processes", "threads", "fds", "pss_mb"):
        parts = ", ".join(f"{k} {v:g}" for k, v in sorted(during[what].items()))
        print(f"    {what} by kind: {parts}")
    left = result["left_after_close"]
    print("  left after close(): " + ", ".join(f"{k} {v}" for k, v in left.items())
          + ("   (none > 0: nothing leaks)" if max(left.values()) <= 0 else "   LEAK"))  # fmt: skip


if __name__ == "__main__":
    main()
