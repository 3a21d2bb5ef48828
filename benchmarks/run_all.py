"""Every benchmark of the project in one run, one table, one JSON file.

Each figure is a ratio of our median to its baseline's median measured in the same
run; ratios are the figures of record, absolute values stand beside them.

* env.step / env.reset vs a bare pipe / bare spawn, and env.close():
  ``env_bench.py --json``, three runs (the step goal must hold in each)
* HarnessProcess spawn and line round trip vs bare Popen: ``process_bench.py`` (parsed)
* one bridge tool call vs a bare fastmcp HTTP server: ``bridge_bench.py`` (parsed)
* a streamed completion through the model proxy vs direct: ``capture_bench.py`` (parsed)
* vector scaling: ``make_vector_env`` with 1, 2, 4, 8 envs on a harness whose turn
  waits 200 ms; turns/s against N x the single env (goal >= 0.9x)
* memory per env (PSS of the env's process tree) vs a bare Popen of the harness
* vector start: ``make_vector_env(8)`` to the end of its first reset vs one
  ``HarnessEnv`` to the end of its first reset, and PSS per env at N=8
* ``import gym_harness`` vs ``import gymnasium`` (fresh interpreters), with and
  without cached bytecode
* gym_harness beside OpenEnv: ``vs_openenv.py --json``
* model mode: ``model_mode_bench.py --json``, a step against the same
  exchange in capture mode and a bare loopback round trip; calls/s of 1, 4, 8 envs

The benchmark scripts run as child processes, so each starts clean. After the
table, the performance goals are listed, each with its figure and PASS or MISS.

    python benchmarks/run_all.py [--quick] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from _common import (
    Row,
    _num,
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


ENV_RUNS = 3


def env_rows(quick: bool) -> list[Row]:
    """env_bench three times (fresh processes): every step row; reset and close of run 1."""
    steps = "500" if quick else "2000"
    rows: list[Row] = []
    for run in range(1, ENV_RUNS + 1):
        counts = ["--steps", steps]
        counts += ["--resets", "5" if quick else "15", "--closes", "5" if quick else "15"]
        if run > 1:
            counts += ["--resets", "2", "--closes", "0"]  # argparse keeps the last value
        out = run_script(["benchmarks/env_bench.py", "--json", *counts], SCRIPT_TIMEOUT_S)
        for r in json.loads(out)["rows"]:
            row = Row.from_dict(r)
            if row.name.startswith("env.step"):
                rows.append(dataclasses.replace(row, name=f"{row.name}, run {run}"))
            elif run == 1:
                rows.append(row)
    return rows


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
            float(p50["bare fastmcp HTTP"]), "ms", "bare fastmcp HTTP server", "<= 0.6x",
            ratio=r, met=r <= 0.6, note="ratio: median of per-round ratios")
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


IMPORT_GOAL = 1.3


def import_rows(quick: bool) -> list[Row]:
    """Fresh interpreters, interleaved; bytecode cached (written first), then not at all.

    "Not cached" points ``PYTHONPYCACHEPREFIX`` at an empty folder with writing off, so
    every module of both sides, the standard library's too, is compiled from source.
    """
    cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as empty:
        uncached = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": empty}

        def cold(module: str, env: dict[str, str]) -> Callable[[], float]:
            def run() -> float:
                start = time.perf_counter()
                argv = [sys.executable, "-c", f"import {module}"]
                subprocess.run(argv, check=True, timeout=120, env=env)
                return time.perf_counter() - start

            return run

        rows = []
        for label, env, runs in (("cached", cached, 15), ("not cached", uncached, 5)):
            cold("gym_harness", env)()  # warm the page cache (and write .pyc when cached)
            cold("gymnasium", env)()
            samples = interleaved(
                3 if quick else runs, bare=cold("gymnasium", env), ours=cold("gym_harness", env)
            )
            ours, bare = median(samples["ours"]) * 1e3, median(samples["bare"]) * 1e3
            rows.append(
                Row(f"`import gym_harness`, bytecode {label}", ours, bare, "ms",
                    "`import gymnasium`", f"<= {IMPORT_GOAL}x", met=ours / bare <= IMPORT_GOAL,
                    note=f"n={len(samples['ours'])}; fresh interpreter, its start included")
            )  # fmt: skip
    return rows


START_N = 8
START_GOAL, PSS_GOAL_MB = 2.0, 50.0
START_PROBE = """
import json, sys, time
sys.path.insert(0, "benchmarks")
from _common import line_agent, tree_pss_mb
import gym_harness

def main():
    n = int(sys.argv[1])
    start = time.perf_counter()
    if n:
        envs = gym_harness.make_vector_env(n, command=line_agent("echo"))
        envs.reset(seed=0)
        elapsed = time.perf_counter() - start
        envs.step(["ping"] * n)
        pss = sum(tree_pss_mb(p.pid) for p in envs.processes) / n
    else:
        envs = gym_harness.HarnessEnv("command", command=line_agent("echo"))
        envs.reset()
        elapsed = time.perf_counter() - start
        pss = 0.0
    print(json.dumps({"s": elapsed, "pss_mb": pss}), flush=True)
    envs.close()

if __name__ == "__main__":
    main()
"""


def start_rows(quick: bool) -> list[Row]:
    """First reset of make_vector_env(8) vs one env's, each in a fresh interpreter.

    Both figures run from construction to the end of the first reset, with
    ``gym_harness`` already imported: the vector side includes importing the server
    stack in the parent and forking the workers, the single side its own import of it.
    """
    pss: list[float] = []

    def probe(n: int) -> Callable[[], float]:
        def run() -> float:
            out = run_script(["-c", START_PROBE, str(n)], SCRIPT_TIMEOUT_S)
            data = json.loads(out.strip().splitlines()[-1])
            if n:
                pss.append(data["pss_mb"])
            return float(data["s"])

        return run

    samples = interleaved(2 if quick else 3, single=probe(0), vector=probe(START_N))
    ratio = median(samples["vector"]) / median(samples["single"])
    return [
        Row(f"make_vector_env({START_N}) to its first reset", median(samples["vector"]) * 1e3,
            median(samples["single"]) * 1e3, "ms", "one HarnessEnv to its first reset",
            f"<= {START_GOAL:g}x", ratio=ratio, met=ratio <= START_GOAL,
            note=f"n={len(samples['vector'])}; fresh interpreters, fork start method"),
        Row(f"PSS per env at N={START_N} (worker trees)", median(pss), 0.0, "MB", "",
            f"<= {PSS_GOAL_MB:g} MB", met=median(pss) <= PSS_GOAL_MB,
            note="worker + harness + keeper, after 1 step; shared pages split with the parent"),
    ]  # fmt: skip


TOOL_VS_OPENENV_GOAL = 0.8


def openenv_rows(quick: bool) -> list[Row]:
    counts = ["--rounds", "2", "--steps", "60", "--resets", "5", "--calls", "100"] if quick else []
    out = run_script(["benchmarks/vs_openenv.py", "--json", *counts], SCRIPT_TIMEOUT_S)
    rows = []
    for r in json.loads(out)["rows"]:
        tool = r["figure"].startswith("one tool call alone")
        rows.append(
            Row(f"vs OpenEnv: {r['figure']}", r["gym_harness"], r["openenv"], r["unit"],
                "OpenEnv 0.10.0 (async path)", f"< {TOOL_VS_OPENENV_GOAL}x" if tool else "",
                ratio=r["ratio"], met=r["ratio"] < TOOL_VS_OPENENV_GOAL if tool else None,
                note=f"n={r['n']}")
        )  # fmt: skip
    return rows


def model_rows(quick: bool) -> list[Row]:
    counts = (
        ["--rounds", "3", "--calls", "20", "--vec-rounds", "3", "--vec-steps", "10"]
        if quick
        else []
    )
    out = run_script(["benchmarks/model_mode_bench.py", "--json", *counts], SCRIPT_TIMEOUT_S)
    return [Row.from_dict(r) for r in json.loads(out)["rows"]]


SECTIONS: dict[str, Callable[[bool], list[Row]]] = {
    "env": env_rows,
    "process": process_rows,
    "bridge": bridge_rows,
    "capture": capture_rows,
    "vector": vector_rows,
    "memory": memory_rows,
    "import": import_rows,
    "start": start_rows,
    "openenv": openenv_rows,
    "model": model_rows,
}


def _row(rows: list[Row], prefix: str) -> list[Row]:
    return [r for r in rows if r.name.startswith(prefix)]


# Issue #15's goals: number, what, the rows that decide it (all must be met).
GOALS = (
    ("1", "tool call <= 0.6x bare fastmcp HTTP", "bridge tool call"),
    ("1", "tool call < 0.8x OpenEnv's bridge, same client", "vs OpenEnv: one tool call alone"),
    (
        "2",
        f"make_vector_env({START_N}) first reset <= {START_GOAL:g}x one env's",
        "make_vector_env",
    ),
    ("2", f"import gym_harness <= {IMPORT_GOAL}x import gymnasium", "`import gym_harness`"),
    ("3", f"PSS per env <= {PSS_GOAL_MB:g} MB at N={START_N}", "PSS per env"),
    ("4", "env.close() median <= 20 ms", "env.close()"),
    ("5", "env.step <= 1.5x bare pipe, in each of 3 runs", "env.step"),
)


def goal_lines(rows: list[Row], ran: set[str]) -> list[str]:
    """One line per goal: the deciding figures and PASS, MISS or NOT RUN."""
    lines = ["goals (PASS only when every figure of the goal meets it)"]
    for number, what, prefix in GOALS:
        found = _row(rows, prefix)
        figures = ", ".join(_figure(r) for r in found) or "-"
        verdict = "NOT RUN" if not found else "PASS" if all(r.met for r in found) else "MISS"
        lines.append(f"  {number}  {what:<52} {verdict:<7} {figures}")
    fair = "openenv" in ran and bool(_row(rows, "vs OpenEnv"))
    lines.append(
        f"  6  {'vs_openenv.py fair (async path, interleaved, gradio +/-)':<52} "
        f"{'PASS' if fair else 'NOT RUN':<7} rows 'vs OpenEnv: ...' above"
    )
    return lines


def _figure(row: Row) -> str:
    if row.ratio is not None:
        return f"{row.ratio:.2f}x"
    return f"{_num(row.ours)} {row.unit}"


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
    print()
    print("\n".join(goal_lines(rows, set(args.only or SECTIONS) - set(failures))))
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
