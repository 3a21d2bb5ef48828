"""One recorded model call as chat messages, the form TRL and ``datasets`` read.

:func:`exchange_messages` turns a proxy record (``ModelExchange.to_dict()``, or the
``llm_request`` and ``llm_response`` event data merged) into OpenAI-style chat
messages: the prompt the harness sent, whatever its wire API, then the model's
answer as one assistant message. :func:`exchange_tools` gives the tools the
request offered, as OpenAI function schemas (TRL's ``tools`` column).
:func:`llm_exchanges` does both for every model call of a rollout record's turns
(the ``llm_exchanges`` column ``gym-harness rollout --capture`` writes).
:class:`Conversation` is the conversion itself, resumable: model mode converts only the
items a request added to the conversation of the one before.

Every message has ``role`` and a string ``content``; assistant messages also have
``tool_calls`` (``[{"type": "function", "id", "function": {"name", "arguments"}}]``,
arguments as JSON text, possibly an empty list) and tool messages ``tool_call_id``
and ``name``. Keys and types are the same in every row, so a list of these loads
as one ``datasets`` column. Several text blocks of one message are joined with a
newline. Images, reasoning and other non-text content are left out (the raw
record keeps them). Gemini calls that carry no id get ``call_N`` ids, paired with
their responses by function name in order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "CONVERSATION_KEYS",
    "HEAD_KEYS",
    "Conversation",
    "exchange_messages",
    "exchange_records",
    "exchange_tools",
    "llm_exchanges",
]

Message = dict[str, Any]


def exchange_messages(raw: dict[str, Any]) -> list[Message]:
    """Convert one recorded exchange to chat messages.

    Args:
        raw: A proxy record: at least ``api`` and ``request``; the answer fields
            ``outcome``, ``text`` and ``tool_calls`` when the call was answered.

    Returns:
        The prompt's messages, then the answer as one assistant message when the
        exchange's ``outcome`` is ``"ok"`` (a refused, dropped or stalled call has
        no answer to learn from: ``raw`` says what happened). ``[]`` for requests
        that are not model calls (api ``"other"``) or whose body was not JSON.

    Example:
        >>> exchange_messages({"api": "chat", "outcome": "ok", "text": "hi", "tool_calls": [],
        ...     "request": {"messages": [{"role": "user", "content": "hello"}]}})[0]
        {'role': 'user', 'content': 'hello'}
    """
    request = raw.get("request")
    api = str(raw.get("api", ""))
    if api not in _ITEMS or not isinstance(request, dict):
        return []
    conversation = Conversation.of(api, request)
    messages, ids = conversation.messages, conversation.ids
    if raw.get("outcome", "ok") == "ok":
        calls = [
            (str(c.get("id") or ""), str(c.get("name", "")), str(c.get("arguments", "")))
            for c in raw.get("tool_calls") or []
        ]
        calls = [(id_ or ids.call(name), name, args) for id_, name, args in calls]
        messages.append(_assistant(str(raw.get("text") or ""), calls))
    return messages


def exchange_tools(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The function tools the request offered, as OpenAI ``{"type": "function", ...}`` schemas.

    Args:
        raw: A proxy record (``api`` and ``request``).

    Returns:
        One ``{"type": "function", "function": {"name", "description", "parameters"}}``
        per function tool (built-in tools without a schema are left out).
    """
    request = raw.get("request")
    if not isinstance(request, dict):
        return []
    api = raw.get("api")
    found: list[tuple[Any, Any, Any]] = []
    for tool in request.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        if api == "chat" and isinstance(tool.get("function"), dict):
            fn = tool["function"]
            found.append((fn.get("name"), fn.get("description"), fn.get("parameters")))
        elif api == "responses" and tool.get("type") == "function":
            found.append((tool.get("name"), tool.get("description"), tool.get("parameters")))
        elif api == "anthropic" and "input_schema" in tool:
            found.append((tool.get("name"), tool.get("description"), tool.get("input_schema")))
        elif api == "gemini":
            for fn in tool.get("functionDeclarations") or tool.get("function_declarations") or []:
                schema = fn.get("parameters") or fn.get("parametersJsonSchema")
                found.append((fn.get("name"), fn.get("description"), schema))
    return [
        {
            "type": "function",
            "function": {
                "name": str(name or ""),
                "description": str(description or ""),
                "parameters": parameters if isinstance(parameters, dict) else {},
            },
        }
        for name, description, parameters in found
    ]


# -- shared pieces ---------------------------------------------------------------------------


class _Ids:
    """Synthesised call ids, and the FIFO per function name that pairs results with them."""

    def __init__(self) -> None:
        self.count = 0
        self.open: dict[str, list[str]] = {}

    def call(self, name: str) -> str:
        id_ = f"call_{self.count}"
        self.count += 1
        self.open.setdefault(name, []).append(id_)
        return id_

    def result(self, name: str) -> str:
        queue = self.open.get(name) or []
        return queue.pop(0) if queue else ""


def _message(role: str, content: str) -> Message:
    return {"role": role, "content": content}


def _assistant(content: str, calls: Iterable[tuple[str, str, str]]) -> Message:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"type": "function", "id": id_, "function": {"name": name, "arguments": args}}
            for id_, name, args in calls
        ],
    }


def _tool(call_id: str, name: str, content: str) -> Message:
    return {"role": "tool", "content": content, "tool_call_id": call_id, "name": name}


def _text(content: Any) -> str:
    """A string, or the text of a list of content parts/blocks (non-text parts dropped)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if isinstance(content, list):
        texts = [
            part["text"] if isinstance(part, dict) else part
            for part in content
            if isinstance(part, str)
            or (isinstance(part, dict) and isinstance(part.get("text"), str))
        ]
        return "\n".join(texts)
    return json.dumps(content)


def _role(role: Any) -> str:
    role = str(role or "user")
    return {"developer": "system", "model": "assistant", "function": "tool"}.get(role, role)


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value if value is not None else {})


# -- per wire API ----------------------------------------------------------------------------

#: Where each API carries the conversation: a list of items (messages, contents).
CONVERSATION_KEYS = {"chat": "messages", "responses": "input", "anthropic": "messages",
                     "gemini": "contents"}  # fmt: skip
#: The request fields besides the conversation that its chat messages are made of.
HEAD_KEYS = {"chat": (), "responses": ("instructions",), "anthropic": ("system",),
             "gemini": ("systemInstruction", "system_instruction")}  # fmt: skip


class Conversation:
    """One request's conversation as chat messages, built item by item.

    :meth:`of` converts a whole request. A harness resends its whole conversation with
    every call: :meth:`copy` keeps what the items so far made, and :meth:`extend` on the
    copy converts only the items the next request added, with the same result as
    converting that request whole. A message, once made, is never changed (a later
    item that adds to it replaces it), so copies share their messages.

    Attributes:
        api: The wire API (``"chat"``, ``"responses"``, ``"anthropic"``, ``"gemini"``).
        messages: The chat messages so far.
        ids: Synthesised call ids (Gemini calls that carry none).
    """

    def __init__(self, api: str) -> None:
        self.api = api
        self.messages: list[Message] = []
        self.ids = _Ids()
        self.names: dict[str, str] = {}  # call id -> tool name, to name the results

    @classmethod
    def of(cls, api: str, request: dict[str, Any]) -> Conversation:
        """The whole conversation of ``request`` (an ``api`` request body)."""
        conversation = cls(api)
        conversation.start(request)
        items = request.get(CONVERSATION_KEYS[api])
        if api == "responses" and isinstance(items, str):
            conversation.messages.append(_message("user", items))
        else:
            conversation.extend(items or [])
        return conversation

    def start(self, request: dict[str, Any]) -> None:
        """Add the messages the request's head makes (``HEAD_KEYS``: a system prompt)."""
        _HEAD[self.api](request, self.messages)

    def extend(self, items: Iterable[Any]) -> None:
        """Add the messages of more conversation items (non-objects are skipped)."""
        _ITEMS[self.api](items, self)

    def copy(self) -> Conversation:
        """A conversation to go on from: its own lists and tables, the same messages."""
        other = Conversation(self.api)
        other.messages = list(self.messages)
        other.names = dict(self.names)
        other.ids.count = self.ids.count
        other.ids.open = {name: list(queue) for name, queue in self.ids.open.items()}
        return other


def _no_head(request: dict[str, Any], out: list[Message]) -> None:
    return None


def _responses_head(request: dict[str, Any], out: list[Message]) -> None:
    if request.get("instructions"):
        out.append(_message("system", _text(request["instructions"])))


def _anthropic_head(request: dict[str, Any], out: list[Message]) -> None:
    if request.get("system"):
        out.append(_message("system", _text(request["system"])))


def _gemini_head(request: dict[str, Any], out: list[Message]) -> None:
    system = request.get("systemInstruction") or request.get("system_instruction")
    if system:
        out.append(
            _message("system", _text(system.get("parts") if isinstance(system, dict) else system))
        )


def _chat(items: Iterable[Any], state: Conversation) -> None:
    out, names, ids = state.messages, state.names, state.ids
    for msg in items:
        if not isinstance(msg, dict):
            continue
        role = _role(msg.get("role"))
        if role == "assistant":
            calls = []
            for tc in msg.get("tool_calls") or []:
                fn = tc.get("function") or {}
                name = str(fn.get("name", ""))
                id_ = str(tc.get("id") or "") or ids.call(name)
                names[id_] = name
                calls.append((id_, name, _arguments(fn.get("arguments"))))
            out.append(_assistant(_text(msg.get("content")), calls))
        elif role == "tool":
            id_ = str(msg.get("tool_call_id") or "")
            name = str(msg.get("name") or names.get(id_, ""))
            out.append(_tool(id_ or ids.result(name), name, _text(msg.get("content"))))
        else:
            out.append(_message(role, _text(msg.get("content"))))


def _responses(items: Iterable[Any], state: Conversation) -> None:
    out, names = state.messages, state.names
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = str(item.get("type") or ("message" if "role" in item else ""))
        if kind == "message":
            role = _role(item.get("role"))
            text = _text(item.get("content"))
            out.append(_assistant(text, []) if role == "assistant" else _message(role, text))
        elif kind.endswith("_call_output"):
            id_ = str(item.get("call_id") or "")
            out.append(_tool(id_, names.get(id_, ""), _text(item.get("output"))))
        elif kind.endswith("_call") and "call_id" in item:
            id_, name = str(item["call_id"]), str(item.get("name") or kind)
            names[id_] = name
            args = _arguments(item.get("arguments", item.get("input", item.get("action"))))
            if not out or out[-1]["role"] != "assistant":
                out.append(_assistant("", []))
            last = out[-1]  # replaced, not changed: an earlier request's copy may share it
            added = _assistant("", [(id_, name, args)])["tool_calls"]
            out[-1] = {**last, "tool_calls": [*last["tool_calls"], *added]}


def _anthropic(items: Iterable[Any], state: Conversation) -> None:
    out, names = state.messages, state.names
    for msg in items:
        if not isinstance(msg, dict):
            continue
        role = _role(msg.get("role"))
        blocks = msg.get("content")
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        texts: list[str] = []
        calls: list[tuple[str, str, str]] = []
        for block in blocks or []:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind in ("tool_use", "server_tool_use"):
                id_, name = str(block.get("id", "")), str(block.get("name", ""))
                names[id_] = name
                calls.append((id_, name, _arguments(block.get("input"))))
            elif kind == "tool_result" and role == "user":
                texts = _flush(out, role, texts)
                id_ = str(block.get("tool_use_id", ""))
                out.append(_tool(id_, names.get(id_, ""), _text(block.get("content"))))
        if role == "assistant":
            out.append(_assistant("\n".join(texts), calls))
        else:
            _flush(out, role, texts)


def _flush(out: list[Message], role: str, texts: list[str]) -> list[str]:
    """Append the text gathered so far as one message; return a fresh list."""
    if texts:
        out.append(_message(role, "\n".join(texts)))
    return []


def _gemini(items: Iterable[Any], state: Conversation) -> None:
    out, ids = state.messages, state.ids
    for content in items:
        if not isinstance(content, dict):
            continue
        role = _role(content.get("role"))
        texts: list[str] = []
        calls: list[tuple[str, str, str]] = []
        for part in content.get("parts") or []:
            if not isinstance(part, dict) or part.get("thought"):
                continue
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part.get("functionCall"), dict):
                fc = part["functionCall"]
                name = str(fc.get("name", ""))
                id_ = str(fc.get("id") or "")
                if id_:
                    ids.open.setdefault(name, []).append(id_)
                calls.append((id_ or ids.call(name), name, _arguments(fc.get("args"))))
            elif isinstance(part.get("functionResponse"), dict) and role != "assistant":
                texts = _flush(out, role, texts)
                fr = part["functionResponse"]
                name = str(fr.get("name", ""))
                id_ = str(fr.get("id") or "")
                if id_ and id_ in ids.open.get(name, []):
                    ids.open[name].remove(id_)
                out.append(_tool(id_ or ids.result(name), name, _response_text(fr.get("response"))))
        if role == "assistant":
            out.append(_assistant("\n".join(texts), calls))
        else:
            _flush(out, role, texts)


def _response_text(response: Any) -> str:
    """A Gemini functionResponse's ``response``: its output text, else the whole as JSON."""
    if isinstance(response, dict) and len(response) == 1:
        (value,) = response.values()
        if isinstance(value, str):
            return value
    return response if isinstance(response, str) else json.dumps(response)


_HEAD = {"chat": _no_head, "responses": _responses_head, "anthropic": _anthropic_head,
         "gemini": _gemini_head}  # fmt: skip
_ITEMS = {"chat": _chat, "responses": _responses, "anthropic": _anthropic, "gemini": _gemini}


def exchange_records(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pair ``llm_request`` / ``llm_response`` event dicts back into proxy records.

    Args:
        events: Event dicts in order (``info["events"]`` or a trajectory turn's events).

    Returns:
        One dict per answered call: the response's data over its request's (the
        shape of ``ModelExchange.to_dict()``), in answer order.
    """
    requests: dict[Any, Mapping[str, Any]] = {}
    records = []
    for event in events:
        data = event["data"]
        if event["type"] == "llm_request":
            requests[data["seq"]] = data
        elif event["type"] == "llm_response":
            records.append({**requests.pop(data["seq"], {}), **data})
    return records


def llm_exchanges(turns: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pair each turn's llm_request / llm_response events into exchange records.

    Args:
        turns: A rollout record's ``turns`` (``TurnRecord.to_dict()`` dicts).

    Returns:
        Per model call, in order: ``turn``, ``messages`` (the exchange as chat
        messages: the prompt, then the model's answer with its tool calls), ``tools``
        (the function tools offered, as OpenAI schemas) and ``raw`` (the proxy's whole
        record). Requests that are no model call (probes, model lists, token counts)
        are left out.
    """
    return [
        {
            "turn": turn["turn"],
            "messages": exchange_messages(raw),
            "tools": exchange_tools(raw),
            "raw": raw,
        }
        for turn in turns
        for raw in exchange_records(turn["events"])  # a call's two events share its turn
        if raw.get("api", "other") != "other"
    ]
