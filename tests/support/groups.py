"""The scripted group of the training tests and ``benchmarks/group_bench.py``.

A ``GroupRollout`` on the Reference harness in model mode whose policy is a fixed
completion (the tokenizer's ids for "ok"); the action calls the ``add`` tool first, then
answers "5", so every episode makes two model calls and earns reward 1.0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gym_harness import RewardContext
from gym_harness.training import GroupRollout

#: The task every scripted episode runs.
TASK = {"id": "add", "prompt": "What is 2 + 3? Use the add tool."}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def reward(ctx: RewardContext) -> float:
    """1.0 when the reply gives the sum, else 0.0."""
    return float("5" in ctx.response)


def tool_first(text: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """The action: call ``add(2, 3)`` until a tool result is in, then answer "5"."""
    if not any(m.get("role") == "tool" for m in request["messages"]):
        return {"content": "", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}
    return {"content": "5"}


def scripted_group(tokenizer: Any, concurrency: int, *, keep_envs: bool) -> GroupRollout:
    """A ``GroupRollout`` of up to ``concurrency`` episodes under the fixed policy."""
    ids = [*tokenizer.encode("ok"), tokenizer.eos_token_id]
    return GroupRollout(
        {"harness": "reference", "tools": [add], "reward_fn": reward},
        tokenizer=tokenizer,
        sampler=lambda prompts: [(ids, [-0.5] * len(ids)) for _ in prompts],
        action=tool_first,
        concurrency=concurrency,
        keep_envs=keep_envs,
    )
