"""A group of G generations against one episode: the rollout of a GRPO group, concurrent.

TRL repeats each prompt ``num_generations`` times; ``gym_harness.training`` runs those
episodes concurrently (one harness each, stepped as ready through the vector env's
``send``/``recv``). This measures ``GroupRollout.run`` on the Reference harness in model
mode for one episode (concurrency 1) and for a group of ``--group`` episodes (concurrency
``--group``), each episode two model calls (the ``add`` tool, then an answer), the two
alternating in rounds. The policy is a fixed completion, so the figure is the rollout's
own cost (harness start, tool calls, token chains, traces), not a model's. The goal: the
group's wall time at most 1.5x one episode's.

Two ways, interleaved in each round:

* ``cold``: a new ``GroupRollout`` per run: the run makes its vector env (one worker,
  keeper, MCP bridge and model endpoint per sub-env) and closes it.
* ``kept``: one ``GroupRollout(keep_envs=True)`` per size, run again and again (what
  ``rollout_func`` does for a trainer between its steps): a run starts only the
  episodes' harnesses and workspaces.

CPU time per episode is beside the wall medians: user + sys of this process, of every
process it started and reaped, and of the live processes below it (kept workers,
keepers and what they reaped), read before and after each run.

    python benchmarks/group_bench.py [--rounds 3] [--group 8] [--json]

Needs the ``train`` extra's tokenizers and transformers (the tiny tokenizer).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import psutil
from _common import Row, format_table, median, write_json
from support.groups import TASK, scripted_group

from gym_harness.training import GroupRollout
from gym_harness.training.tiny import tiny_tokenizer


def _cpu() -> float:
    """CPU seconds of this process and of every process below it, live or reaped."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):  # ended meanwhile: its parent reaps it
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def group_of(tokenizer: Any, episodes: int, *, keep_envs: bool = False) -> GroupRollout:
    """A ``GroupRollout`` of ``episodes`` concurrent episodes under the fixed policy."""
    return scripted_group(tokenizer, episodes, keep_envs=keep_envs)


def measure(group: GroupRollout, off: list[str]) -> tuple[float, float]:
    """Wall seconds of one ``run`` of ``group.concurrency`` concurrent episodes, and CPU s
    per episode; the outcomes of episodes that did not run as scripted go to ``off``."""
    episodes = group.concurrency
    cpu, start = _cpu(), time.perf_counter()
    rows = group.run([TASK] * episodes)
    wall = time.perf_counter() - start
    off += [row.outcome or row.error for row in rows if row.trained_calls != 2 or row.reward != 1.0]
    return wall, (_cpu() - cpu) / episodes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="also write results/group_bench.json")
    args = parser.parse_args(argv)
    tokenizer = tiny_tokenizer()
    off: list[str] = []
    measure(group_of(tokenizer, 1), [])  # warm: imports, the first harness start
    samples: dict[str, list[tuple[float, float]]] = {
        "cold one": [],
        "cold group": [],
        "kept one": [],
        "kept group": [],
    }
    with (
        group_of(tokenizer, 1, keep_envs=True) as kept_one,
        group_of(tokenizer, args.group, keep_envs=True) as kept_group,
    ):
        measure(kept_one, [])  # their vector envs start here, outside the rounds
        measure(kept_group, [])
        for _ in range(args.rounds):
            samples["cold one"].append(measure(group_of(tokenizer, 1), off))
            samples["cold group"].append(measure(group_of(tokenizer, args.group), off))
            samples["kept one"].append(measure(kept_one, off))
            samples["kept group"].append(measure(kept_group, off))
    rows: list[Row] = []
    note = f"rounds={args.rounds}, episodes off script: {len(off)} {sorted(set(off))}"
    for way in ("cold", "kept"):
        one = median(w for w, _ in samples[f"{way} one"])
        group = median(w for w, _ in samples[f"{way} group"])
        ratio = group / one
        rows += [
            Row(f"{way}: group of {args.group}, wall", group, one, "s", "one episode",
                "<= 1.5x", ratio, ratio <= 1.5, note),
            Row(f"{way}: one episode, CPU", median(c for _, c in samples[f"{way} one"]),
                0.0, "s/episode"),
            Row(f"{way}: group of {args.group}, CPU",
                median(c for _, c in samples[f"{way} group"]), 0.0, "s/episode"),
        ]  # fmt: skip
    print(format_table(rows, "GroupRollout on Reference-v0, model mode, 2 calls per episode"))
    for way in ("cold", "kept"):
        pairs = zip(samples[f"{way} one"], samples[f"{way} group"], strict=True)
        print(f"{way} per-round ratios:", " ".join(f"{g / o:.2f}x" for (o, _), (g, _) in pairs))
    if args.json:
        payload = {"rows": [r.to_dict() for r in rows], "samples": samples}
        print("wrote", write_json("group_bench.json", json.loads(json.dumps(payload))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
