"""Every benchmark of the project in one run, one table, one JSON file (issue #6).

Each figure is a ratio of our median to its baseline's median measured in the same
run; ratios are the figures of record, absolute values stand beside them.

* env.step / env.reset vs a bare pipe / bare spawn: ``env_bench.py --json``
* HarnessProcess spawn and line round trip vs bare Popen: ``process_bench.py`` (parsed)
* one bridge tool call vs a bare fastmcp HTTP server: ``bridge_bench.py`` (parsed)
* a streamed completion through the model proxy vs direct: ``capture_bench.py`` (parsed)
* vector scaling: ``make_vector_env`` with 1, 2, 4, 8 envs on a harness whose turn
  waits 200 ms; turns/s against N x the single env (goal >= 0.9x)
* memory per env (PSS of the env's process tree) vs a bare Popen of the harness
* ``import gym_harness`` vs ``import gymnasium`` (fresh interpreters)

The benchmark scripts run as child processes, so each starts clean.

    python benchmarks/run_all.py [--quick] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable

from _common import (
    Row,
    format_table,
    interleaved,
    line_agent,
    median,
    run_script,
    tree_pss_mb,
    write_json,
)

SCRIPT_TIMEOUT_S = 900.0
VECTOR_SIZES = (1, 2, 4, 8)
VECTOR_DELAY_S = 0.2
VECTOR_GOAL = 0.9


def env_rows(quick: bool) -> list[Row]:
    counts = ["--steps", "500", "--resets", "10"] if quick else []
    out = run_script(["benchmarks/env_bench.py", "--json", *counts], SCRIPT_TIMEOUT_S)
    data = json.loads(out)
    return [Row.from_dict(r) for r in data["rows"]]


def process_rows(quick: bool) -> list[Row]:
    counts = ["--spawns", "10", "--round-trips", "500"] if quick else []
    out = run_script(["benchmarks/process_bench.py", *counts], SCRIPT_TIMEOUT_S)
    rows = []
    pattern = r"^(spawn to ready|line round trip), (ms|us) \(n=(\d+)\)\s+([\d.]+)\s+([\d.]+)"
    for m in re.finditer(pattern, out, re.M):
        what, unit, n, bare, ours = m.groups()
        rows.append(
            Row(f"HarnessProcess {what}", float(ours), float(bare), unit, "bare Popen",
                note=f"n={n}")
        )  # fmt: skip
    return _expect(rows, 2, "process_bench.py", out)


def bridge_rows(quick: bool) -> list[Row]:
    counts = ["--calls", "300", "--cycles", "5"] if quick else []
    out = run_script(["benchmarks/bridge_bench.py", *counts], SCRIPT_TIMEOUT_S)
    p50 = dict(re.findall(r"^\s+(bridge \(HTTP, auth\)|bare fastmcp HTTP)\s+p50\s+([\d.]+) ms",
                          out, re.M))  # fmt: skip
    ratio = re.search(r"bare fastmcp HTTP \(p50\): pooled [\d.]+x, median of per-round ratios "
                      r"([\d.]+)x", out)  # fmt: skip
    if len(p50) != 2 or ratio is None:
        return _expect([], 1, "bridge_bench.py", out)
    r = float(ratio.group(1))
    return [
        Row("bridge tool call (p50)", float(p50["bridge (HTTP, auth)"]),
            float(p50["bare fastmcp HTTP"]), "ms", "bare fastmcp HTTP server", "< 1.2x",
            ratio=r, met=r < 1.2, note="ratio: median of per-round ratios")
    ]  # fmt: skip


def capture_rows(quick: bool) -> list[Row]:
    counts = ["--n", "100"] if quick else []
    out = run_script(["benchmarks/capture_bench.py", *counts], SCRIPT_TIMEOUT_S)
    found = {m[0]: float(m[3]) for m in re.findall(
        r"^(direct|proxy)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", out, re.M)}  # fmt: skip
    if len(found) != 2:
        return _expect([], 1, "capture_bench.py", out)
    return [Row("model proxy, streamed completion (p50)", found["proxy"], found["direct"],
                "ms", "direct to the model server")]  # fmt: skip


def _expect(rows: list[Row], n: int, script: str, out: str) -> list[Row]:
    if len(rows) < n:
        raise RuntimeError(f"could not read the figures of {script}; its output:\n{out}")
    return rows


def vector_rows(quick: bool) -> list[Row]:
    """Turns per second of make_vector_env(N) against N x the single env."""
    from gym_harness import make_vector_env

    steps = 5 if quick else 15
    rate: dict[int, float] = {}
    memory: dict[int, float] = {}
    for n in VECTOR_SIZES:
        envs = make_vector_env(n, command=line_agent("echo", "--delay", str(VECTOR_DELAY_S)))
        try:
            envs.reset(seed=0)
            actions = ["ping"] * n
            envs.step(actions)  # warm: workers' first turn
            start = time.perf_counter()
            for _ in range(steps):
                envs.step(actions)
            rate[n] = n * steps / (time.perf_counter() - start)
            workers = [p.pid for p in envs.processes]
            memory[n] = sum(tree_pss_mb(pid) for pid in workers) / n
        finally:
            envs.close()
    rows = []
    for n in VECTOR_SIZES:
        ratio = rate[n] / (n * rate[1])
        rows.append(
            Row(f"vector N={n}, turns/s (200 ms turns)", rate[n], n * rate[1], "turns/s",
                "N x single env", f">= {VECTOR_GOAL}x", ratio=ratio,
                met=ratio >= VECTOR_GOAL if n > 1 else None,
                note=f"{steps} steps; PSS/env {memory[n]:.0f} MB")
        )  # fmt: skip
    return rows


PROBES = {
    "bare": "import subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)\n"
    'p.stdout.readline(); p.stdin.write(\'{"type":"message","content":"hi"}\\n\')\n'
    "p.stdin.flush()\nwhile 'turn_complete' not in p.stdout.readline(): pass\n"
    "print('ready', flush=True); input(); p.communicate(timeout=10)\n",
    "ours": "import sys\nfrom gym_harness import HarnessEnv\n"
    "env = HarnessEnv('command', command=sys.argv[1:]); env.reset(); env.step('hi')\n"
    "print('ready', flush=True); input(); env.close()\n",
}


def memory_rows(quick: bool) -> list[Row]:
    """PSS of one env's process tree (env process, harness, keeper) vs a bare Popen."""

    def probe(kind: str) -> Callable[[], float]:
        def run() -> float:
            child = subprocess.Popen(
                [sys.executable, "-c", PROBES[kind], *line_agent("echo")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                assert child.stdin is not None and child.stdout is not None
                assert child.stdout.readline().strip() == "ready"
                mb = tree_pss_mb(child.pid)
                child.stdin.write("\n")
                child.stdin.flush()
                child.wait(30)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait(10)
            return mb

        return run

    samples = interleaved(2 if quick else 3, bare=probe("bare"), ours=probe("ours"))
    return [
        Row("memory per env (PSS of its process tree)", median(samples["ours"]),
            median(samples["bare"]), "MB", "python + bare Popen of the harness",
            note="HarnessEnv after reset + 1 step; bridge up")
    ]  # fmt: skip


def import_rows(quick: bool) -> list[Row]:
    def cold(module: str) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", f"import {module}"], check=True, timeout=60)
            return time.perf_counter() - start

        return run

    cold("gym_harness")()  # warm the page cache and .pyc files
    samples = interleaved(5 if quick else 15, bare=cold("gymnasium"), ours=cold("gym_harness"))
    return [
        Row("`import gym_harness` (fresh interpreter)", median(samples["ours"]) * 1e3,
            median(samples["bare"]) * 1e3, "ms", "`import gymnasium`",
            note=f"n={len(samples['ours'])}; interpreter start included in both")
    ]  # fmt: skip


SECTIONS: dict[str, Callable[[bool], list[Row]]] = {
    "env": env_rows,
    "process": process_rows,
    "bridge": bridge_rows,
    "capture": capture_rows,
    "vector": vector_rows,
    "memory": memory_rows,
    "import": import_rows,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument("--only", nargs="+", choices=sorted(SECTIONS), help="these sections")
    args = parser.parse_args()
    rows: list[Row] = []
    failures: dict[str, str] = {}
    started = time.time()
    for name in args.only or SECTIONS:
        t0 = time.perf_counter()
        try:
            rows += SECTIONS[name](args.quick)
        except (RuntimeError, AssertionError, subprocess.SubprocessError, OSError) as exc:
            failures[name] = str(exc)
        print(f"[{name}] {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    print(f"$ python {' '.join(sys.argv)}")
    print(format_table(rows, "ratios are the figures of record (ours / baseline, same run)"))
    for name, why in failures.items():
        print(f"FAILED {name}: {why}")
    payload = {
        "started": started,
        "argv": sys.argv,
        "python": sys.version,
        "rows": [r.to_dict() for r in rows],
        "failures": failures,
    }
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    write_json(f"run_all-{stamp}.json", payload)
    path = write_json("run_all-latest.json", payload)
    print(f"written: {path}")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
