"""The four wire formats of an answer: Anthropic, OpenAI Responses, Chat Completions, Gemini.

Per API three builders, used by :class:`gym_harness.model.answer.AnswerWriter`: the
stream's head (events that need no completion), the rest of the stream, and the whole
unstreamed body. Each returns plain dicts; the writer frames them. The event sequences
follow ``tests/support/model_server.py``, which the real CLIs accept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from gym_harness.model.action import Completion, ToolCall, chat_tool_calls
from gym_harness.model.request import ModelRequest, WireTool

__all__ = ["HEADS", "ID_PREFIX", "STREAMS", "WHOLE", "Event", "Usage"]

Event = tuple[str | None, Any]  # (SSE event name or None, data: a dict or raw text)

_ANTHROPIC_STOP = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}
_GEMINI_STOP = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP"}
_GEMINI_STOP["content_filter"] = "SAFETY"


class Writer(Protocol):
    """What the builders read of the answer being written (``AnswerWriter``)."""

    request: ModelRequest
    created: int
    answer_id: str

    def next_sequence(self) -> int: ...

    def wire_tool(self, call: ToolCall) -> WireTool: ...


@dataclass(frozen=True)
class Usage:
    """Token counts written into the answer's usage fields."""

    input_tokens: int
    output_tokens: int

    @classmethod
    def estimate(cls, request: ModelRequest, completion: Completion) -> Usage:
        """About four bytes a token, at least one token each way."""
        out = len(completion.content.encode())
        out += sum(len(c.name) + len(c.arguments_json) for c in completion.tool_calls)
        return cls(max(1, request.size // 4), max(1, out // 4))


# -- Anthropic Messages ------------------------------------------------------------------------


def _anthropic_message(w: Writer, content: list[Any], stop: str | None, usage: Any) -> Any:
    return {
        "id": w.answer_id,
        "type": "message",
        "role": "assistant",
        "model": w.request.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }


def _anthropic_blocks(c: Completion) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": c.content}] if c.content else []
    blocks += [
        {"type": "tool_use", "id": t.id, "name": t.name, "input": t.arguments} for t in c.tool_calls
    ]
    return blocks


def _anthropic_usage(usage: Usage, output: int) -> dict[str, int]:
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _anthropic_whole(w: Writer, c: Completion, usage: Usage) -> Any:
    wire_usage = _anthropic_usage(usage, usage.output_tokens)
    return _anthropic_message(w, _anthropic_blocks(c), _ANTHROPIC_STOP[c.stop_reason], wire_usage)


def _anthropic_head(w: Writer) -> list[Event]:
    # The input count is only known from the request here: estimate it the same way.
    usage = _anthropic_usage(Usage(max(1, w.request.size // 4), 1), 1)
    return [
        (
            "message_start",
            {"type": "message_start", "message": _anthropic_message(w, [], None, usage)},
        )
    ]


def _anthropic_stream(w: Writer, c: Completion, usage: Usage) -> list[Event]:
    events: list[Event] = []
    for index, block in enumerate(_anthropic_blocks(c)):
        start: dict[str, Any]
        delta: dict[str, Any]
        if block["type"] == "text":
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": c.content}
        else:
            start = {**block, "input": {}}
            partial = json.dumps(block["input"], ensure_ascii=False)
            delta = {"type": "input_json_delta", "partial_json": partial}
        ref = {"index": index}
        events += [
            ("content_block_start", {"type": "content_block_start", **ref, "content_block": start}),
            ("content_block_delta", {"type": "content_block_delta", **ref, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", **ref}),
        ]
    stop = {"stop_reason": _ANTHROPIC_STOP[c.stop_reason], "stop_sequence": None}
    events += [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": stop,
                "usage": {"output_tokens": usage.output_tokens},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return events


# -- OpenAI Responses --------------------------------------------------------------------------


def _responses_usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def _response(
    w: Writer, status: str, output: list[Any], usage: Any, reason: str | None = None
) -> dict[str, Any]:
    return {
        "id": w.answer_id,
        "object": "response",
        "created_at": w.created,
        "status": status,
        "model": w.request.model,
        "output": output,
        "usage": usage,
        "error": None,
        "incomplete_details": {"reason": reason} if reason else None,
    }


def _responses_status(c: Completion) -> tuple[str, str | None]:
    if c.stop_reason == "length":
        return "incomplete", "max_output_tokens"
    if c.stop_reason == "content_filter":
        return "incomplete", "content_filter"
    return "completed", None


def _responses_items(w: Writer, c: Completion) -> list[dict[str, Any]]:
    # Item ids derive from the answer id, so the head, the stream and a retry agree.
    items: list[dict[str, Any]] = []
    if c.content:
        part = {"type": "output_text", "text": c.content, "annotations": [], "logprobs": []}
        items.append(
            {
                "type": "message",
                "id": f"msg_{w.answer_id[5:]}",
                "role": "assistant",
                "status": "completed",
                "content": [part],
            }
        )
    for i, call in enumerate(c.tool_calls):
        wire = w.wire_tool(call)
        if wire.custom:
            text = call.arguments.get("input", "")
            items.append(
                {
                    "type": "custom_tool_call",
                    "id": f"ctc_{w.answer_id[5:]}_{i}",
                    "call_id": call.id,
                    "name": wire.name,
                    "input": text if isinstance(text, str) else json.dumps(text),
                    "status": "completed",
                }
            )
            continue
        item = {
            "type": "function_call",
            "id": f"fc_{w.answer_id[5:]}_{i}",
            "call_id": call.id,
            "name": wire.name,
            "arguments": call.arguments_json,
            "status": "completed",
        }
        if wire.namespace:
            item["namespace"] = wire.namespace
        items.append(item)
    return items


def _responses_whole(w: Writer, c: Completion, usage: Usage) -> Any:
    status, reason = _responses_status(c)
    return _response(w, status, _responses_items(w, c), _responses_usage(usage), reason)


def _responses_head(w: Writer) -> list[Event]:
    return [
        _responses_event(w, {"type": kind, "response": _response(w, "in_progress", [], None)})
        for kind in ("response.created", "response.in_progress")
    ]


def _responses_event(w: Writer, data: dict[str, Any]) -> Event:
    return data["type"], {**data, "sequence_number": w.next_sequence()}


def _responses_stream(w: Writer, c: Completion, usage: Usage) -> list[Event]:
    raw: list[dict[str, Any]] = []
    items = _responses_items(w, c)
    for index, item in enumerate(items):
        ref = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            added = {**item, "status": "in_progress", "content": []}
            raw.append({"type": "response.output_item.added", "output_index": index, "item": added})
            empty = {**item["content"][0], "text": ""}
            cref = {**ref, "content_index": 0}
            raw += [
                {**cref, "type": "response.content_part.added", "part": empty},
                {**cref, "type": "response.output_text.delta", "delta": text, "logprobs": []},
                {**cref, "type": "response.output_text.done", "text": text, "logprobs": []},
                {**cref, "type": "response.content_part.done", "part": item["content"][0]},
            ]
        elif item["type"] == "custom_tool_call":
            added = {**item, "status": "in_progress", "input": ""}
            raw += [
                {"type": "response.output_item.added", "output_index": index, "item": added},
                {**ref, "type": "response.custom_tool_call_input.delta", "delta": item["input"]},
                {**ref, "type": "response.custom_tool_call_input.done", "input": item["input"]},
            ]
        else:
            added = {**item, "status": "in_progress", "arguments": ""}
            args = item["arguments"]
            raw += [
                {"type": "response.output_item.added", "output_index": index, "item": added},
                {**ref, "type": "response.function_call_arguments.delta", "delta": args},
                {**ref, "type": "response.function_call_arguments.done", "arguments": args},
            ]
        raw.append({"type": "response.output_item.done", "output_index": index, "item": item})
    status, reason = _responses_status(c)
    final = _response(w, status, items, _responses_usage(usage), reason)
    kind = "response.completed" if status == "completed" else "response.incomplete"
    raw.append({"type": kind, "response": final})
    return [_responses_event(w, data) for data in raw]


# -- OpenAI Chat Completions -------------------------------------------------------------------


def _chat_usage(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def _chat_base(w: Writer, kind: str) -> dict[str, Any]:
    return {"id": w.answer_id, "object": kind, "created": w.created, "model": w.request.model}


def _chat_whole(w: Writer, c: Completion, usage: Usage) -> Any:
    message: dict[str, Any] = {"role": "assistant", "content": c.content or None}
    if c.tool_calls:
        message["tool_calls"] = chat_tool_calls(c.tool_calls)
    choice = {"index": 0, "message": message, "finish_reason": c.stop_reason, "logprobs": None}
    return {**_chat_base(w, "chat.completion"), "choices": [choice], "usage": _chat_usage(usage)}


def _chat_chunk(w: Writer, delta: dict[str, Any], reason: str | None = None) -> Event:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    return None, {**_chat_base(w, "chat.completion.chunk"), "choices": [choice]}


def _chat_head(w: Writer) -> list[Event]:
    return [_chat_chunk(w, {"role": "assistant", "content": ""})]


def _chat_stream(w: Writer, c: Completion, usage: Usage) -> list[Event]:
    events: list[Event] = []
    if c.content:
        events.append(_chat_chunk(w, {"content": c.content}))
    for i, t in enumerate(c.tool_calls):
        first = {
            "index": i,
            "id": t.id,
            "type": "function",
            "function": {"name": t.name, "arguments": ""},
        }
        args = {"index": i, "function": {"arguments": t.arguments_json}}
        events += [_chat_chunk(w, {"tool_calls": [first]}), _chat_chunk(w, {"tool_calls": [args]})]
    events.append(_chat_chunk(w, {}, c.stop_reason))
    options = w.request.body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        base = _chat_base(w, "chat.completion.chunk")
        events.append((None, {**base, "choices": [], "usage": _chat_usage(usage)}))
    events.append((None, "[DONE]"))
    return events


# -- Gemini ------------------------------------------------------------------------------------


def _gemini_chunk(w: Writer, c: Completion, usage: Usage) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"text": c.content}] if c.content else []
    parts += [
        {"functionCall": {"id": t.id, "name": t.name, "args": t.arguments}} for t in c.tool_calls
    ]
    candidate = {
        "content": {"role": "model", "parts": parts},
        "finishReason": _GEMINI_STOP[c.stop_reason],
        "index": 0,
    }
    return {
        "candidates": [candidate],
        "usageMetadata": {
            "promptTokenCount": usage.input_tokens,
            "candidatesTokenCount": usage.output_tokens,
            "totalTokenCount": usage.input_tokens + usage.output_tokens,
        },
        "modelVersion": w.request.model,
        "responseId": w.answer_id,
    }


def _gemini_head(w: Writer) -> list[Event]:
    return []  # Gemini streams carry nothing before the content


def _gemini_stream(w: Writer, c: Completion, usage: Usage) -> list[Event]:
    return [(None, _gemini_chunk(w, c, usage))]


ID_PREFIX = {"anthropic": "msg_", "responses": "resp_", "chat": "chatcmpl-", "gemini": "gem_"}
HEADS = {
    "anthropic": _anthropic_head,
    "responses": _responses_head,
    "chat": _chat_head,
    "gemini": _gemini_head,
}
STREAMS = {
    "anthropic": _anthropic_stream,
    "responses": _responses_stream,
    "chat": _chat_stream,
    "gemini": _gemini_stream,
}
WHOLE = {
    "anthropic": _anthropic_whole,
    "responses": _responses_whole,
    "chat": _chat_whole,
    "gemini": _gemini_chunk,
}
