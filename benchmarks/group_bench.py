"""A group of G generations against one episode: the rollout of a GRPO group, concurrent.

TRL repeats each prompt ``num_generations`` times; ``gym_harness.training`` runs those
episodes concurrently (one harness each, stepped as ready through the vector env's
``send``/``recv``). This measures ``GroupRollout.run`` on the Reference harness in model
mode for one episode (concurrency 1) and for a group of ``--group`` episodes (concurrency
``--group``), each episode two model calls (the ``add`` tool, then an answer), the two
alternating in rounds. The policy is a fixed completion, so the figure is the rollout's
own cost (harness start, tool calls, token chains, traces), not a model's. The goal: the
group's wall time at most 1.5x one episode's. CPU time per episode (user + sys of this
process and every process it started and reaped: workers, keepers, harnesses) is beside
the wall medians.

    python benchmarks/group_bench.py [--rounds 3] [--group 8] [--json]

Needs the ``train`` extra's tokenizers and transformers (the tiny tokenizer).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Row, format_table, median, write_json

from gym_harness import RewardContext
from gym_harness.training import GroupRollout
from gym_harness.training.tiny import tiny_tokenizer

TASK = {"id": "add", "prompt": "What is 2 + 3? Use the add tool."}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def reward(ctx: RewardContext) -> float:
    return float("5" in ctx.response)


def tool_first(text: str, request: Mapping[str, Any]) -> dict[str, Any]:
    if not any(m.get("role") == "tool" for m in request["messages"]):
        return {"content": "", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}
    return {"content": "5"}


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measure(tokenizer: Any, episodes: int, off: list[str]) -> tuple[float, float]:
    """Wall seconds of one ``run`` of ``episodes`` concurrent episodes, and CPU s per episode;
    the outcomes of episodes that did not run as scripted go to ``off``."""
    ids = [*tokenizer.encode("ok"), tokenizer.eos_token_id]
    group = GroupRollout(
        {"harness": "reference", "tools": [add], "reward_fn": reward},
        tokenizer=tokenizer,
        sampler=lambda prompts: [(ids, [-0.5] * len(ids)) for _ in prompts],
        action=tool_first,
        concurrency=episodes,
    )
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
    measure(tokenizer, 1, [])  # warm: imports, the first harness start
    samples: dict[str, list[tuple[float, float]]] = {"one": [], "group": []}
    for _ in range(args.rounds):
        samples["one"].append(measure(tokenizer, 1, off))
        samples["group"].append(measure(tokenizer, args.group, off))
    one = median(w for w, _ in samples["one"])
    group = median(w for w, _ in samples["group"])
    ratio = group / one
    rows = [
        Row(
            f"group of {args.group}, wall",
            group,
            one,
            "s",
            "one episode",
            "<= 1.5x",
            ratio,
            ratio <= 1.5,
            f"rounds={args.rounds}, episodes off script: {len(off)} {sorted(set(off))}",
        ),
        Row("one episode, CPU", median(c for _, c in samples["one"]), 0.0, "s/episode"),
        Row(
            f"group of {args.group}, CPU",
            median(c for _, c in samples["group"]),
            0.0,
            "s/episode",
        ),
    ]
    print(format_table(rows, "GroupRollout on Reference-v0, model mode, 2 calls per episode"))
    per_round = [g / o for (o, _), (g, _) in zip(samples["one"], samples["group"], strict=True)]
    print("per-round ratios:", " ".join(f"{r:.2f}x" for r in per_round))
    if args.json:
        payload = {"rows": [r.to_dict() for r in rows], "samples": samples}
        print("wrote", write_json("group_bench.json", json.loads(json.dumps(payload))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
