"""The demo tools, tasks and reward that ``gym_harness/Reference-v0`` ships.

Three small tools (plain, type-annotated functions; FastMCP builds their
schemas), a reward that checks the reply for the task's expected text, and a
JSONL file of tasks whose prompts drive the reference agent's ``scripted``
policy through a real tool call on the bridge::

    >>> add(2, 3)
    5
    >>> demo_tasks()[0]["meta"]["expect"]
    '5555'

The tools are importable as ``"gym_harness.agents.demo:DEMO_TOOLS"`` so an env rebuilt
in a vector worker finds them again. A task is ``{"id", "prompt", "meta":
{"expect": ...}}``; the prompt's ``/call`` and ``/done`` lines are read by the
scripted policy, and its first line is a plain instruction an LLM can follow.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "DEMO_FACTS",
    "DEMO_TOOLS",
    "add",
    "demo_reward",
    "demo_tasks",
    "demo_tasks_path",
    "lookup",
    "word_count",
]

#: The fact table behind ``lookup``; keys are lower case.
DEMO_FACTS: dict[str, str] = {
    "capital of france": "Paris",
    "capital of japan": "Tokyo",
    "boiling point of water": "100 degrees Celsius at sea level",
    "speed of light": "299792458 metres per second",
    "largest planet": "Jupiter",
}


def add(a: int | float, b: int | float) -> int | float:
    """Add two numbers.

    Args:
        a: The first addend.
        b: The second addend.

    Returns:
        The sum ``a + b``.
    """
    return a + b


def word_count(text: str) -> int:
    """Count the words in a text (runs of non-whitespace characters).

    Args:
        text: The text to count.

    Returns:
        The number of words.
    """
    return len(text.split())


def lookup(key: str) -> str:
    """Look up a fact in a small table, e.g. "capital of france".

    Args:
        key: The fact's name; case and surrounding spaces are ignored.

    Returns:
        The fact.

    Raises:
        ValueError: No fact has that name (the message lists the known names).
    """
    fact = DEMO_FACTS.get(key.strip().lower())
    if fact is None:
        known = ", ".join(sorted(DEMO_FACTS))
        raise ValueError(f"no fact named {key!r}; known facts: {known}")
    return fact


#: The demo tool set, in the order a client lists it.
DEMO_TOOLS: list[Callable[..., Any]] = [add, word_count, lookup]


class _RewardContext(Protocol):
    """The attributes ``demo_reward`` reads (``gym_harness.env.RewardContext`` has them)."""

    @property
    def response(self) -> str: ...

    @property
    def error_type(self) -> str: ...

    @property
    def task(self) -> Mapping[str, Any] | None: ...


def demo_reward(ctx: _RewardContext) -> float:
    """Return 1.0 when the reply contains the task's expected text, else 0.0.

    A turn that ended in an error (``ctx.error_type`` not empty) or an episode
    without a task (or without ``meta.expect``) earns 0.0.

    Args:
        ctx: The reward context of the turn (``RewardContext``): reads
            ``response``, ``error_type`` and ``task``.

    Returns:
        1.0 or 0.0.
    """
    if ctx.error_type or not ctx.task:
        return 0.0
    meta = ctx.task.get("meta") or {}
    expect = meta.get("expect") if isinstance(meta, Mapping) else None
    if not isinstance(expect, str) or not expect:
        return 0.0
    return 1.0 if expect in ctx.response else 0.0


def demo_tasks_path() -> Path:
    """Return the path of the packaged demo tasks file (``data/demo_tasks.jsonl``).

    Returns:
        The file's path inside the installed package.
    """
    return Path(str(resources.files("gym_harness").joinpath("data", "demo_tasks.jsonl")))


def demo_tasks() -> list[dict[str, Any]]:
    """Return the demo tasks, one dict per line of :func:`demo_tasks_path`.

    Returns:
        The tasks, in file order.
    """
    with demo_tasks_path().open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
