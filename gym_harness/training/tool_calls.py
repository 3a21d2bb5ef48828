"""A sampled completion's text as a model-mode action (tool calls in the Hermes format).

Qwen2/Qwen2.5/Qwen3, Hermes and many open models write a tool call as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in their text. A block whose
JSON reads as a call of a tool the request offered becomes a tool call of the action;
anything else stays text, so a malformed call reaches the harness as the model wrote it
(never an exception: the text is the policy's, and a raise would end the whole batch).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["completion_action", "offered_tools"]

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def offered_tools(observation: Mapping[str, Any]) -> set[str]:
    """The tool names a model-mode observation offers."""
    names: set[str] = set()
    for tool in observation.get("tools") or []:
        if isinstance(tool, Mapping):
            function = tool.get("function", tool)
            if isinstance(function, Mapping) and isinstance(function.get("name"), str):
                names.add(function["name"])
    return names


def completion_action(text: str, observation: Mapping[str, Any]) -> dict[str, Any]:
    """The action for ``text``: ``{"content": ..., "tool_calls": [...]}``.

    Args:
        text: The completion decoded without its special tokens.
        observation: The request it answers (which tools it offers).

    Returns:
        The text outside well-formed ``<tool_call>`` blocks as ``content`` and one
        ``{"name", "arguments"}`` per such block, in order.

    Example:
        >>> completion_action('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
        ...                   {"tools": [{"type": "function", "function": {"name": "add"}}]})
        {'content': '', 'tool_calls': [{'name': 'add', 'arguments': {'a': 1}}]}
    """
    names = offered_tools(observation)
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for match in _BLOCK.finditer(text):
        call = _call(match.group(1), names)
        if call is None:
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        calls.append(call)
    kept.append(text[position:])
    content = "".join(kept).strip()
    return {"content": content, "tool_calls": calls} if calls else {"content": content}


def _call(body: str, names: set[str]) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested past the decoder's depth
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return {"name": value["name"], "arguments": arguments}
