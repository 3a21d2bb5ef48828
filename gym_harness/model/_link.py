"""Whether a model call extends the episode's previous main call: ``extends`` and ``new_from``.

A token-level policy builds call k+1's prompt ids as call k's prompt ids, its completion
ids, and the ids of only what is new (``messages[new_from:]``), so that an episode's calls
form one token chain. That holds while the harness keeps its history as the policy left
it; :func:`link` says whether it did. A request *extends* the previous main call when,
in the normalised chat form of the observation:

* it offers the same tools;
* its messages begin with the previous call's messages, each equal (the system prompt,
  which the chat form carries as the first message, included);
* then comes the answer the env delivered for that call, as the harness echoes it;
* then at least one message more (tool results, the next user message): ``new_from`` is
  the index of the first of them.

The echo counts as the answer when it means the same: the run of assistant messages at
that place, taken together, holds the answer's text (whitespace runs count as one space,
and several text blocks join as one) and its tool calls in order, each with the same name
and the same arguments as a JSON value (key order and spacing of the JSON text do not
count; tool-call ids do not count either, as some wire APIs carry none and harnesses may
re-number them). An answer with no text and no tool call may be left out of the history.
Anything else (compaction, a new system prompt, changed tools, an edited earlier message,
an echo that says something else) does not extend: ``extends`` is false and ``new_from``
is 0, and a policy must render the whole conversation anew.

The comparison reads the messages the request reader made: where it read a body on from
the previous one (:mod:`gym_harness.model._reader`), the earlier messages are the very
same objects, and comparing them is one identity check each (a list comparison, which
tries identity before equality); nothing is parsed again.

Threads: pure functions; the endpoint calls them on its server loop.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gym_harness.model.request import ModelRequest
from gym_harness.records.calls import Completion

__all__ = ["link", "linked", "same_answer"]


def linked(request: ModelRequest, previous: tuple[ModelRequest, Completion] | None) -> ModelRequest:
    """``request`` with ``extends`` and ``new_from`` set against ``previous``.

    Args:
        request: The model call as read.
        previous: The episode's previous main call answered, and the answer delivered
            (``None`` on the episode's first call).
    """
    if previous is None:
        return request
    extends, new_from = link(request, *previous)
    return replace(request, extends=extends, new_from=new_from) if extends else request


def link(request: ModelRequest, previous: ModelRequest, answer: Completion) -> tuple[bool, int]:
    """``(extends, new_from)`` of ``request`` after ``previous`` was answered with ``answer``."""
    messages, before = request.messages, previous.messages
    n = len(before)
    if len(messages) <= n or not _same(request.tools, previous.tools):
        return False, 0
    if messages[:n] != before:  # element by element, identity first (in C)
        return False, 0
    end = n
    while end < len(messages) and messages[end].get("role") == "assistant":
        end += 1
    if end == len(messages) or not same_answer(messages[n:end], answer):
        return False, 0
    return True, end


def same_answer(echo: Sequence[dict[str, Any]], answer: Completion) -> bool:
    """The assistant messages ``echo`` (chat form) mean the same as ``answer``."""
    if not echo:
        return not answer.content.strip() and not answer.tool_calls
    text = " ".join(str(m.get("content") or "") for m in echo)
    if text.split() != answer.content.split():
        return False
    calls = [call for m in echo for call in m.get("tool_calls") or ()]
    if len(calls) != len(answer.tool_calls):
        return False
    for got, want in zip(calls, answer.tool_calls, strict=True):
        function = got.get("function") if isinstance(got, dict) else None
        if not isinstance(function, dict) or function.get("name") != want.name:
            return False
        if not _same_arguments(function.get("arguments"), want.arguments, want.arguments_json):
            return False
    return True


def _same(a: Any, b: Any) -> bool:
    return a is b or a == b


def _same_arguments(got: Any, want: dict[str, Any], want_text: str) -> bool:
    if got in (want_text, want):
        return True
    if not isinstance(got, str):
        return False
    try:
        return bool(json.loads(got) == want)
    except (ValueError, RecursionError):
        return False
