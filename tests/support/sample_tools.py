"""Tools for the tests, importable by string.

As ``"support.sample_tools:TOOLS"`` and ``"support.sample_tools:server"``.
"""

from __future__ import annotations

from fastmcp import FastMCP

from gym_harness.bridge.tools import INTERNAL_TAG, REWARD_TAG, tool_tags


def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool_tags(INTERNAL_TAG)
def peek_answer() -> str:
    """The env's own view; never served."""
    return "the answer"


@tool_tags(REWARD_TAG)
def score() -> float:
    """Part of the reward; never served."""
    return 1.0


TOOLS = [echo, add, peek_answer, score]

server = FastMCP("sample-tools")
server.tool(echo)
server.tool(add)
server.tool(peek_answer, tags={INTERNAL_TAG})
