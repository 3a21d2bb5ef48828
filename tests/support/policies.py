"""Policies for model-mode rollouts (``--policy support.policies:add_then_answer``)."""

from __future__ import annotations

from typing import Any


def add_then_answer(request: dict[str, Any]) -> str | dict[str, Any]:
    """Call ``add(2, 3)`` with made-up token ids and logprobs, then answer with its result."""
    last = request["messages"][-1]
    if last["role"] == "tool":
        return f"The sum is {last['content']}."
    call = {"name": "add", "arguments": {"a": 2, "b": 3}}
    return {"content": "", "tool_calls": [call], "token_ids": [11, 12], "logprobs": [-0.1, -0.2]}


def not_an_action(request: dict[str, Any]) -> Any:
    """Returns neither a str nor a dict."""
    return 42


def add_twice_then_answer(request: dict[str, Any]) -> str | dict[str, Any]:
    """Call ``add(2, 3)`` until two results are in, then answer (three calls an episode)."""
    results = [m for m in request["messages"] if m["role"] == "tool"]
    if len(results) >= 2:
        return f"The sum is {results[-1]['content']}, twice."
    return {"content": "", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}
