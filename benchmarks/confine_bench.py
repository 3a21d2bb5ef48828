"""What kernel confinement costs a spawn: prepare, apply, and fork-to-exit with and without.

``gym_harness/process/confine.py`` is loaded by file path, as the keeper loads it. The
policy is a keeper's: the system read-only, a workspace, a home and a TMPDIR writable,
the devices by name, three TCP ports, scope, seccomp, (as root) dropped capabilities, and
the mount namespace that shows the harness only those paths, where the kernel offers it.

* prepare: one call in this process (open the paths, build the ruleset; the seccomp
  program is built once per process and reused), then ``close``.
* apply: timed inside a forked child around the one call, which then exits.
* per-spawn cost: what confinement adds to one spawn, ``prepare`` in the keeper plus
  ``apply`` in the child (goal: at most 2 ms).
* spawn: fork, (apply,) exec ``/usr/bin/true``, reap; bare and confined alternate, so
  machine noise hits both alike. Its CPU time is the child's (``wait4``'s usage).

Each figure is given twice: wall time, and the CPU time of the process that did the work
(``thread_time``: the calls' own cost, which a loaded machine stretches far less than
wall time). Every figure is the median of ``--runs`` (default 200).

    python benchmarks/confine_bench.py [--runs 200]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from _common import ROOT, Row, format_table, interleaved, median, timed

MODULE = ROOT / "gym_harness" / "process" / "confine.py"
TRUE = "/usr/bin/true"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("confine_bench_module", MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def keeper_policy(confine: ModuleType, scratch: Path) -> dict[str, object]:
    offered = confine.probe()
    writable = [scratch / name for name in ("workspace", "home", "tmp")]
    for folder in writable:
        folder.mkdir()
    read = ["/usr", "/lib", "/lib64", "/bin", "/etc", "/proc", sys.prefix, sys.base_prefix]
    policy: dict[str, object] = {
        "read": read,
        "write": [str(folder) for folder in writable],
        "devices": list(confine.VIEW_DEVICES),
        "seccomp": bool(offered["seccomp"]),
        "drop_caps": os.geteuid() == 0,
    }
    if offered["net_tcp"]:
        policy["connect"] = [40001, 40002, 40003]
    if offered["scope"]:
        policy["scope"] = True
    if not offered["view"]:  # "" when a mount namespace can be made here
        policy.update(view=True, shm_mb=512)
    return policy


def time_prepare(confine: ModuleType, policy: dict[str, object]) -> tuple[float, float]:
    """Seconds one prepare() takes: wall, and CPU of this thread."""
    start, cpu = time.perf_counter(), time.thread_time()
    prepared = confine.prepare(policy)
    elapsed, used = time.perf_counter() - start, time.thread_time() - cpu
    prepared.close()
    return elapsed, used


def time_apply(confine: ModuleType, prepared: object) -> tuple[float, float]:
    """Seconds one apply() takes, wall and CPU, timed in a forked child and sent back
    through a pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        start, cpu = time.perf_counter_ns(), time.thread_time_ns()
        confine.apply(prepared)
        elapsed, used = time.perf_counter_ns() - start, time.thread_time_ns() - cpu
        os.write(write, f"{elapsed} {used}".encode())
        os._exit(0)
    os.close(write)
    elapsed, used = (int(n) / 1e9 for n in os.read(read, 64).split())
    os.close(read)
    os.waitpid(pid, 0)
    return elapsed, used


def time_spawn(confine: ModuleType, prepared: object | None) -> tuple[float, float]:
    """Seconds from fork to the reaped exit of ``/usr/bin/true``, confined or bare: wall,
    and the CPU time the child used."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            if prepared is not None:
                confine.apply(prepared)
            os.execv(TRUE, [TRUE])
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    elapsed = time.perf_counter() - start
    assert os.waitstatus_to_exitcode(status) == 0, status
    return elapsed, usage.ru_utime + usage.ru_stime


def split(
    runs: int, **measures: Callable[[], tuple[float, float]]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """:func:`interleaved` for measures that time wall and CPU: the two, by name."""
    cpu: dict[str, list[float]] = {name: [] for name in measures}

    def wall_of(name: str, measure: Callable[[], tuple[float, float]]) -> Callable[[], float]:
        def run() -> float:
            wall, used = measure()
            cpu[name].append(used)
            return wall

        return run

    walls = interleaved(runs, **{name: wall_of(name, m) for name, m in measures.items()})
    return walls, cpu


def beside(
    what: str,
    kinds: dict[str, dict[str, list[float]]],
    names: tuple[str, str],
    baseline_name: str,
    note: str,
) -> list[Row]:
    """A row per kind of figure (wall, CPU) of ``what``: the median of the measure named
    first in ``names`` beside that of the second (its baseline), in microseconds."""
    measured, baseline = names
    return [
        Row(
            f"{what}, {kind}",
            median(samples[measured]) * 1e6,
            median(samples[baseline]) * 1e6,
            "us",
            baseline_name=baseline_name,
            note=note,
        )
        for kind, samples in kinds.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    confine = load()
    start = time.perf_counter()
    offered = confine.probe()
    probe_first = time.perf_counter() - start
    probe_cached = median(timed(confine.probe) for _ in range(args.runs))
    with tempfile.TemporaryDirectory(prefix="confine-bench-") as scratch:
        policy = keeper_policy(confine, Path(scratch))
        os.chdir(Path(scratch) / "workspace")  # as the keeper does: the view must hold it
        prepare_first = time_prepare(confine, policy)[0]  # ctypes, struct, the BPF program
        prepares = [time_prepare(confine, policy) for _ in range(args.runs)]
        prepared = confine.prepare(policy)
        plain = confine.prepare({k: v for k, v in policy.items() if k not in ("view", "shm_mb")})
        try:
            applies, applies_cpu = split(
                args.runs,
                view=lambda: time_apply(confine, prepared),
                plain=lambda: time_apply(confine, plain),
            )
            spawns, spawns_cpu = split(
                args.runs,
                bare=lambda: time_spawn(confine, None),
                confined=lambda: time_spawn(confine, prepared),
            )
        finally:
            prepared.close()
            plain.close()
            os.chdir(ROOT)
    us, n = 1e6, f"n={args.runs}"
    prepare_wall, prepare_cpu = (median(p[i] for p in prepares) for i in (0, 1))
    rows = [
        Row("probe(), first call (forks once)", probe_first * us, 0, "us"),
        Row("probe(), cached", probe_cached * us, 0, "us", note=n),
        Row("prepare(), first call", prepare_first * us, 0, "us"),
        Row("prepare(), wall", prepare_wall * us, 0, "us", note=n),
        Row("prepare(), CPU", prepare_cpu * us, 0, "us", note=n),
    ]
    rows += beside(
        "apply() in the child",
        {"wall": applies, "CPU": applies_cpu},
        ("view", "plain"),
        baseline_name="apply() without the view",
        note=n,
    )
    costs = (("wall", prepare_wall, applies), ("CPU", prepare_cpu, applies_cpu))
    for kind, prepare, samples in costs:
        cost = (prepare + median(samples["view"])) * us
        rows.append(
            Row(
                f"per-spawn cost (prepare + apply), {kind}",
                cost,
                0,
                "us",
                goal="<= 2000",
                met=cost <= 2000,
                note=n,
            )
        )
    rows += beside(
        "fork, apply, exec true, reap",
        {"wall": spawns, "child CPU": spawns_cpu},
        ("confined", "bare"),
        baseline_name="the same without apply",
        note=n,
    )
    print(f"$ python {' '.join(sys.argv)}")
    print(f"kernel {os.uname().release}, {os.uname().machine}; probe: {offered}")
    print(f"policy: {policy}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(format_table(rows))


if __name__ == "__main__":
    main()
