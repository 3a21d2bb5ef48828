"""What kernel confinement costs a spawn: prepare, apply, and fork-to-exit with and without.

``gym_harness/process/confine.py`` is loaded by file path, as the keeper loads it. The
policy is a keeper's: the system read-only, a workspace, a home and a TMPDIR writable,
the devices by name, three TCP ports, scope, seccomp, (as root) dropped capabilities, and
the mount namespace that shows the harness only those paths, where the kernel offers it.

* prepare: one call in this process (open the paths, build the ruleset; the seccomp
  program is built once per process and reused), then ``close``.
* apply: timed inside a forked child around the one call, which then exits.
* spawn: fork, (apply,) exec ``/usr/bin/true``, reap; bare and confined alternate, so
  machine noise hits both alike.

Every figure is the median of ``--runs`` (default 200).

    python benchmarks/confine_bench.py [--runs 200]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
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


def time_prepare(confine: ModuleType, policy: dict[str, object]) -> float:
    start = time.perf_counter()
    prepared = confine.prepare(policy)
    elapsed = time.perf_counter() - start
    prepared.close()
    return elapsed


def time_apply(confine: ModuleType, prepared: object) -> float:
    """Seconds one apply() takes, timed in a forked child and sent back through a pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        start = time.perf_counter_ns()
        confine.apply(prepared)
        os.write(write, str(time.perf_counter_ns() - start).encode())
        os._exit(0)
    os.close(write)
    elapsed = int(os.read(read, 64)) / 1e9
    os.close(read)
    os.waitpid(pid, 0)
    return elapsed


def time_spawn(confine: ModuleType, prepared: object | None) -> float:
    """Seconds from fork to the reaped exit of ``/usr/bin/true``, confined or bare."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            if prepared is not None:
                confine.apply(prepared)
            os.execv(TRUE, [TRUE])
        finally:
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    elapsed = time.perf_counter() - start
    assert os.waitstatus_to_exitcode(status) == 0, status
    return elapsed


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
        prepare_first = time_prepare(confine, policy)  # ctypes, struct, the BPF program
        prepares = [time_prepare(confine, policy) for _ in range(args.runs)]
        prepared = confine.prepare(policy)
        plain = confine.prepare({k: v for k, v in policy.items() if k not in ("view", "shm_mb")})
        try:
            pairs = interleaved(
                args.runs,
                view=lambda: time_apply(confine, prepared),
                plain=lambda: time_apply(confine, plain),
            )
            spawns = interleaved(
                args.runs,
                bare=lambda: time_spawn(confine, None),
                confined=lambda: time_spawn(confine, prepared),
            )
        finally:
            prepared.close()
            plain.close()
            os.chdir(ROOT)
    us, n = 1e6, f"n={args.runs}"
    rows = [
        Row("probe(), first call (forks once)", probe_first * us, 0, "us"),
        Row("probe(), cached", probe_cached * us, 0, "us", note=n),
        Row("prepare(), first call", prepare_first * us, 0, "us"),
        Row("prepare()", median(prepares) * us, 0, "us", note=n),
        Row(
            "apply() in the child",
            median(pairs["view"]) * us,
            median(pairs["plain"]) * us,
            "us",
            baseline_name="apply() without the view",
            note=n,
        ),
        Row(
            "fork, apply, exec true, reap",
            median(spawns["confined"]) * us,
            median(spawns["bare"]) * us,
            "us",
            baseline_name="the same without apply",
            note=n,
        ),
    ]
    print(f"$ python {' '.join(sys.argv)}")
    print(f"kernel {os.uname().release}, {os.uname().machine}; probe: {offered}")
    print(f"policy: {policy}")
    print(format_table(rows))


if __name__ == "__main__":
    main()
