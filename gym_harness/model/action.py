"""The action side of model mode: the policy's string as a checked completion.

An action is a ``str``. A string that parses as a JSON object with a ``content`` or
``tool_calls`` key is a message::

    {"content": str, "tool_calls": [{"id"?: str, "name": str, "arguments": object | str}],
     "stop_reason"?: str, "token_ids"?: [int], "logprobs"?: [...], "prompt_token_ids"?: [int],
     "usage"?: {...}}

(a tool call in OpenAI's own shape, ``{"type": "function", "id", "function": {"name",
"arguments"}}``, is accepted too, so an assistant message of the observation can be sent
back as is). Any other string is the assistant's text. :func:`parse_action` returns a
:class:`Completion` or raises :class:`InvalidAction` with the reason; it raises nothing
else, whatever the string holds, and its work is bounded by :class:`ActionLimits`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from gym_harness.records.calls import Completion, ToolCall, assistant_message, chat_tool_calls

__all__ = [
    "STOP_REASONS",
    "ActionLimits",
    "Completion",
    "InvalidAction",
    "ToolCall",
    "assistant_message",
    "chat_tool_calls",
    "new_call_id",
    "parse_action",
]

#: The stop reasons a completion can carry; each wire API spells them its own way.
STOP_REASONS = ("stop", "length", "tool_calls", "content_filter")
_STOP_ALIASES = {
    "stop": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "completed": "stop",
    "length": "length",
    "max_tokens": "length",
    "max_output_tokens": "length",
    "tool_calls": "tool_calls",
    "tool_use": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
    "refusal": "content_filter",
    "safety": "content_filter",
}
_CALL_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_ID_PREFIX = {"anthropic": "toolu_", "responses": "call_", "chat": "call_", "gemini": "call_"}


class InvalidAction(ValueError):
    """The policy's action is no valid completion for the request it answers.

    Args:
        message: What was wrong, and what a valid action looks like.
    """


@dataclass(frozen=True)
class ActionLimits:
    """Bounds on the work of reading one action.

    Attributes:
        max_chars: Longest action string.
        max_depth: Deepest nesting of JSON arrays and objects.
        max_tool_calls: Most tool calls in one completion.
        max_trace: Longest ``token_ids`` or ``logprobs`` list.
    """

    max_chars: int = 8 * 1024 * 1024
    max_depth: int = 64
    max_tool_calls: int = 128
    max_trace: int = 1 << 20


def new_call_id(api: str) -> str:
    """A fresh tool-call id in the style of ``api`` (``toolu_...`` for Anthropic)."""
    return _ID_PREFIX.get(api, "call_") + uuid.uuid4().hex[:24]


def parse_action(
    action: str,
    *,
    api: str = "chat",
    tool_names: Collection[str] = (),
    limits: ActionLimits = ActionLimits(),
) -> Completion:
    """Read a policy's action as a completion of a request.

    Args:
        action: The action string (plain text, or the text of a JSON message).
        api: The request's wire API (for the style of made-up call ids).
        tool_names: The tool names the request offered; a call to any other is invalid.
        limits: Bounds on size and nesting.

    Returns:
        The completion.

    Raises:
        InvalidAction: The action is too large or deep, or a JSON message fails
            validation (a tool the request did not offer, arguments that are not an
            object, a field of the wrong type). Nothing else is raised.

    Example:
        >>> parse_action('{"content": "", "tool_calls": [{"name": "add", "arguments": {"a": 1}}]}',
        ...              tool_names={"add"}).tool_calls[0].arguments
        {'a': 1}
    """
    if not isinstance(action, str):
        raise InvalidAction(f"an action is a str, got {type(action).__name__}")
    if len(action) > limits.max_chars:
        raise InvalidAction(
            f"the action is {len(action)} characters, over the limit of {limits.max_chars}"
        )
    message = _as_message(action)
    if message is None:
        return Completion(content=action)
    _check_depth(message, limits.max_depth)
    return _completion(message, api, tool_names, limits)


# -- reading -----------------------------------------------------------------------------------


class _NonFinite:
    """Stands in for NaN/Infinity, which JSON does not have, until validation rejects it."""

    def __init__(self, text: str) -> None:
        self.text = text


def _as_message(action: str) -> dict[str, Any] | None:
    text = action.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        parsed = json.loads(text, parse_constant=_NonFinite)
    except RecursionError:
        raise InvalidAction("the action's JSON is nested too deeply to read") from None
    except ValueError:
        return None
    if isinstance(parsed, dict) and ("content" in parsed or "tool_calls" in parsed):
        return parsed
    return None


def _check_depth(value: Any, max_depth: int) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, _NonFinite):
            raise InvalidAction(f"the action holds {item.text}, which is not JSON")
        if not isinstance(item, dict | list):
            continue
        if depth > max_depth:
            raise InvalidAction(f"the action's JSON nests deeper than {max_depth} levels")
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children)


def _completion(
    message: dict[str, Any], api: str, tool_names: Collection[str], limits: ActionLimits
) -> Completion:
    content = message.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise InvalidAction(f"content must be a string, got {_kind(content)}")
    raw_calls = message.get("tool_calls")
    if raw_calls is None:
        raw_calls = []
    if not isinstance(raw_calls, list):
        raise InvalidAction(f"tool_calls must be a list, got {_kind(raw_calls)}")
    if len(raw_calls) > limits.max_tool_calls:
        raise InvalidAction(
            f"{len(raw_calls)} tool calls, over the limit of {limits.max_tool_calls}"
        )
    calls = tuple(_tool_call(i, c, api, tool_names, limits) for i, c in enumerate(raw_calls))
    ids = [c.id for c in calls]
    if len(set(ids)) != len(ids):
        raise InvalidAction(f"tool call ids must be unique, got {ids}")
    return Completion(
        content=content,
        tool_calls=calls,
        stop_reason=_stop_reason(message.get("stop_reason"), bool(calls)),
        token_ids=_trace(message, "token_ids", limits, ints=True),
        logprobs=_trace(message, "logprobs", limits, ints=False),
        usage=_usage(message.get("usage")),
        prompt_token_ids=_trace(message, "prompt_token_ids", limits, ints=True),
    )


def _tool_call(
    index: int, raw: Any, api: str, tool_names: Collection[str], limits: ActionLimits
) -> ToolCall:
    where = f"tool call {index}"
    if not isinstance(raw, dict):
        raise InvalidAction(f"{where} must be an object, got {_kind(raw)}")
    function = raw.get("function")
    spec: dict[str, Any] = function if isinstance(function, dict) else raw
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidAction(f"{where} needs a tool name (a non-empty string)")
    if name not in tool_names:
        offered = sorted(tool_names)
        shown = ", ".join(offered[:20]) + (", ..." if len(offered) > 20 else "")
        raise InvalidAction(
            f"{where} names {name!r}, which the request did not offer "
            f"(offered: {shown or 'no tools'})"
        )
    arguments = spec.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments, parse_constant=_NonFinite) if arguments else {}
        except (ValueError, RecursionError):
            raise InvalidAction(f"{where} ({name}): arguments are not valid JSON") from None
        _check_depth(arguments, limits.max_depth)
    if not isinstance(arguments, dict):
        raise InvalidAction(
            f"{where} ({name}): arguments must be an object, got {_kind(arguments)}"
        )
    call_id = raw.get("id")
    if call_id is None or call_id == "":
        call_id = new_call_id(api)
    if not isinstance(call_id, str) or not _CALL_ID.fullmatch(call_id):
        raise InvalidAction(
            f"{where} ({name}): id must be 1-128 letters, digits or _.:- , got {call_id!r}"
        )
    return ToolCall(call_id, name, arguments)


def _stop_reason(raw: Any, has_calls: bool) -> str:
    if raw is None:
        return "tool_calls" if has_calls else "stop"
    if not isinstance(raw, str) or raw.lower() not in _STOP_ALIASES:
        raise InvalidAction(
            f"stop_reason {raw!r} is none of {', '.join(STOP_REASONS)} (or an API's own "
            "spelling of one: end_turn, max_tokens, tool_use, ...)"
        )
    reason = _STOP_ALIASES[raw.lower()]
    # A harness runs tool calls only under its API's tool stop reason, and waits for
    # tool calls under it: the reason follows the calls actually made.
    if reason == "stop" and has_calls:
        return "tool_calls"
    if reason == "tool_calls" and not has_calls:
        return "stop"
    return reason


def _trace(
    message: dict[str, Any], key: str, limits: ActionLimits, *, ints: bool
) -> tuple[Any, ...] | None:
    raw = message.get(key)
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InvalidAction(f"{key} must be a list, got {_kind(raw)}")
    if len(raw) > limits.max_trace:
        raise InvalidAction(f"{key} holds {len(raw)} entries, over the limit of {limits.max_trace}")
    for entry in raw:
        if ints and (not isinstance(entry, int) or isinstance(entry, bool)):
            raise InvalidAction(f"{key} must be integers, got {_kind(entry)}")
        if not ints and (isinstance(entry, bool) or not isinstance(entry, int | float | dict)):
            raise InvalidAction(f"logprobs entries must be numbers or objects, got {_kind(entry)}")
    return tuple(raw)


def _usage(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidAction(f"usage must be an object, got {_kind(raw)}")
    return dict(raw)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else type(value).__name__
    )
