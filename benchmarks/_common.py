"""Shared helpers for the benchmark scripts: timing, medians, ratio rows, tables, JSON.

Every figure of record is a ratio of our median to a baseline's median measured in the
same run (bare pipe, bare spawn, bare fastmcp server ...). Baseline and ours are
measured alternately (:func:`interleaved`), so machine noise hits both alike; the
absolute medians are kept beside the ratio.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
LINE_AGENT = ROOT / "tests" / "support" / "line_agent.py"
RESULTS = ROOT / "benchmarks" / "results"


def line_agent(*args: str) -> list[str]:
    """The argv of the test line-protocol harness (``tests/support/line_agent.py``)."""
    return [sys.executable, str(LINE_AGENT), *args]


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes (``perf_counter``)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(
    runs: int, batch: int = 1, **measures: Callable[[], float]
) -> dict[str, list[float]]:
    """Call each measure ``batch`` times per round, ``runs`` rounds; every sample by name.

    Each measure returns the seconds it timed itself, so setup and teardown stay
    outside the figure. For microsecond round trips to two processes, use batches:
    alternating single samples wakes a process that has just slept through the other
    side's sample, which slows the bare baseline more than ours (measured: a 30 us bare
    pipe reads 40-90 us when alternated sample by sample).
    """
    samples: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(runs):
        for name, measure in measures.items():
            samples[name].extend(measure() for _ in range(batch))
    return samples


def median(samples: Iterable[float]) -> float:
    """The median of ``samples`` (raises on an empty sequence)."""
    return statistics.median(list(samples))


def p95(samples: Sequence[float]) -> float:
    """The 95th percentile (nearest rank) of ``samples``."""
    ordered = sorted(samples)
    return ordered[int(0.95 * (len(ordered) - 1))]


@dataclass(frozen=True)
class Row:
    """One figure: our median beside its baseline's, and their ratio.

    Attributes:
        name: What was measured.
        ours: Our median (in ``unit``).
        baseline: The baseline's median (in ``unit``); 0 when there is none.
        unit: ``"ms"``, ``"us"``, ``"MB"``, ``"turns/s"`` ...
        baseline_name: What the baseline is ("bare pipe", "bare spawn" ...).
        goal: The goal as text (``"< 1.5x"``), or "".
        ratio: ``ours / baseline`` unless given (throughput rows give their own).
        met: Whether the goal is met (``None``: no goal).
        note: Sample counts or anything a reader needs.
    """

    name: str
    ours: float
    baseline: float
    unit: str
    baseline_name: str = ""
    goal: str = ""
    ratio: float | None = None
    met: bool | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if self.ratio is None and self.baseline:
            object.__setattr__(self, "ratio", self.ours / self.baseline)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Row:
        """Inverse of :meth:`to_dict`."""
        return cls(**dict(data))


def ratio_row(
    name: str,
    ours: Sequence[float],
    baseline: Sequence[float],
    *,
    unit: str,
    scale: float,
    baseline_name: str,
    limit: float | None = None,
) -> Row:
    """A :class:`Row` of medians of two sample lists (seconds), scaled to ``unit``.

    Args:
        limit: The goal ``ratio < limit``, if any.
    """
    ours_m, base_m = median(ours) * scale, median(baseline) * scale
    ratio = ours_m / base_m
    return Row(
        name=name,
        ours=ours_m,
        baseline=base_m,
        unit=unit,
        baseline_name=baseline_name,
        goal="" if limit is None else f"< {limit:g}x",
        ratio=ratio,
        met=None if limit is None else ratio < limit,
        note=f"n={len(ours)}",
    )


def format_table(rows: Sequence[Row], title: str = "") -> str:
    """The rows as a fixed-width text table."""
    header = ("figure", "ours", "baseline", "unit", "ratio", "goal", "", "baseline is", "note")
    body = []
    for r in rows:
        body.append(
            (
                r.name,
                _num(r.ours),
                _num(r.baseline) if r.baseline else "-",
                r.unit,
                "-" if r.ratio is None else f"{r.ratio:.2f}x",
                r.goal,
                {True: "ok", False: "MISS", None: ""}[r.met],
                r.baseline_name,
                r.note,
            )
        )
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=True)]
    lines = [title] if title else []
    for i, cells in enumerate((header, *body)):
        lines.append(
            "  ".join(
                str(c).ljust(w) if j in (0, 3, 5, 6, 7, 8) else str(c).rjust(w)
                for j, (c, w) in enumerate(zip(cells, widths, strict=True))
            ).rstrip()
        )
        if i == 0:
            lines.append("-" * len(lines[-1]))
    return "\n".join(lines)


def _num(x: float) -> str:
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}" if abs(x) < 1 else f"{x:.2f}"


def write_json(name: str, payload: Mapping[str, Any]) -> Path:
    """Write ``payload`` to ``benchmarks/results/<name>`` (git-ignored); return the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return path


def tree_pss_mb(pid: int) -> float:
    """Proportional set size of a process and its descendants, in MB.

    PSS splits shared pages among the processes that map them, so the sum over a
    tree does not count the shared interpreter and libraries twice.
    """
    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except psutil.Error:
            continue
    return total / 1e6


def run_script(argv: Sequence[str], timeout_s: float) -> str:
    """Run a benchmark script with this interpreter; return its stdout.

    Raises:
        RuntimeError: The script failed or ran past ``timeout_s``.
    """
    try:
        done = subprocess.run(
            [sys.executable, *argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=ROOT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{' '.join(argv)} ran past {timeout_s}s") from exc
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} exited {done.returncode}; stderr tail:\n{done.stderr[-2000:]}"
        )
    return done.stdout


def without_tools(envs: Any, obs: Any, infos: dict[str, Any], tool: str, seed: int) -> int:
    """How many model-mode envs' first call offered no ``tool``; those are reset until theirs does.

    The reference agent lists the bridge's tools at a turn's start and gives up after its
    connect timeout (30 s): when N harnesses start at once on two cores, a few may.
    """
    import numpy as np

    bad = [e for e in infos["error_type"] if e]
    if bad:
        raise RuntimeError(f"resets failed: {bad[:3]}")
    first = None
    for attempt in range(5):
        names = [[t["function"]["name"] for t in json.loads(o)["tools"]] for o in obs]
        missing = np.array([tool not in n for n in names])
        first = int(missing.sum()) if first is None else first
        if not missing.any():
            return first
        obs, infos = envs.reset(seed=seed + attempt, options={"reset_mask": missing})
    raise RuntimeError(f"{int(missing.sum())} envs found no tools after 5 resets")
