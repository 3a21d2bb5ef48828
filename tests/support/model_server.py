"""A scripted model server for tests: real HTTP on 127.0.0.1, four wire APIs.

It answers what the harness CLIs pinned in ``.ci/clis-package.json`` send:
Anthropic Messages (``POST /v1/messages``, SSE or not), OpenAI Responses
(``POST /v1/responses``, Codex), OpenAI Chat Completions (``POST
/v1/chat/completions``, OpenCode, Qwen Code, the reference agent) and Gemini
(``POST /v1beta/models/M:streamGenerateContent?alt=sse`` / ``:generateContent``).

Default behaviour per request: if the request offers a tool whose name ends
with the wanted tool name and the conversation holds no result of that tool
yet, call it; otherwise answer ``"tool said: <last tool result>; you said:
<last user message>"`` (``"you said: ..."`` when no tool ran). Other modes:
``reply(text)`` (fixed text), ``enqueue(...)`` (one-shot replies, FIFO, used
before the default), ``fail(status, body)``, ``stall(after)`` (accept, then
send nothing until ``release()`` or ``stop()``) and ``drop(after)`` (cut the
connection mid-stream). One-shot only: ``Echo`` (an error that echoes the request's
credentials, as a careless API or gateway might) and ``Raw`` (canned bytes).

Threads: ``start()`` runs a ``ThreadingHTTPServer`` in one thread; each
connection gets its own handler thread. The request log and the mode sit
behind one lock; ``stop()`` shuts every open connection, so it is bounded even
with stalled requests, and joins every thread it started.

Example::

    with ScriptedModelServer(tool="add", arguments={"a": 2, "b": 3}) as srv:
        env = {"ANTHROPIC_BASE_URL": srv.base_url, "OPENAI_BASE_URL": srv.openai_base_url}
        ...
        assert srv.requests(api="anthropic")[0].body["model"] == "m"
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import socket
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

__all__ = [
    "Drop",
    "Echo",
    "Fail",
    "LoggedRequest",
    "QuietHandler",
    "Raw",
    "Reply",
    "SRV_OPTIONS",
    "ScriptedModelServer",
    "Stall",
    "pieces",
    "read_body",
    "srv",
    "srv_options",
    "token_id",
]

_GEMINI_PATH = re.compile(r"/models/([^/:]+):(streamGenerateContent|generateContent|countTokens)$")
_TOKEN = re.compile(r"\s*\S+|\s+")


@dataclass(frozen=True)
class Reply:
    """A scripted answer: text, or a call to ``tool`` with ``arguments``."""

    text: str = ""
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Fail:
    """Answer with this HTTP status and body (a dict is sent as JSON)."""

    status: int = 500
    body: Any = field(default_factory=lambda: {"error": {"message": "scripted failure"}})


@dataclass(frozen=True)
class Stall:
    """Accept the request, send ``after`` stream events (None: not even headers), then wait.

    The request resumes with the default scripted reply on ``release()``; on
    ``stop()`` the connection is cut.
    """

    after: int | None = None


@dataclass(frozen=True)
class Drop:
    """Send ``after`` stream events, then close the connection without ending the stream."""

    after: int = 1


@dataclass(frozen=True)
class Echo:
    """Answer ``status`` with the request's headers and query in the body, and its
    credential in an ``X-Echo-Credential`` header."""

    status: int = 401


@dataclass(frozen=True)
class Raw:
    """Answer with exactly these bytes as the body."""

    body: bytes
    content_type: str = "text/event-stream"
    status: int = 200


Action = Reply | Fail | Stall | Drop | Echo | Raw


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the server received it. ``headers`` keys are lower-case."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    raw: bytes
    api: str  # "anthropic", "responses", "chat", "gemini" or "other"
    time: float


class _Abort(Exception):
    """The server is stopping or the client went away: close the connection."""


class ScriptedModelServer:
    """A loopback model server speaking Anthropic, OpenAI (Chat, Responses) and Gemini.

    Args:
        tool: Suffix of the tool name to call while its result is missing (None: never call).
        arguments: Arguments for that tool call.
        model: Model name reported when the request names none.
        every_turn: Call the tool again in each new user turn (only results since the
            last user message count), instead of once per conversation.
        recall: Answer ``"you said: <every user message, in order, joined by " | ">"``:
            what the whole conversation holds (the fork tests tell whose turns it saw).
        token_ids: Answer a Chat Completions ``"return_token_ids": true`` as vLLM does
            (``prompt_token_ids`` at the top, ``token_ids`` per choice); ``False`` ignores
            it, as a hosted API does.
    """

    def __init__(
        self,
        *,
        tool: str | None = None,
        arguments: dict[str, Any] | None = None,
        model: str = "scripted-model",
        every_turn: bool = False,
        recall: bool = False,
        token_ids: bool = True,
    ) -> None:
        self.model = model
        self._recall = recall
        self.token_ids = token_ids
        self._lock = threading.Condition()
        self._log: list[LoggedRequest] = []
        self._queue: deque[Action] = deque()
        self._default: Action | None = None  # None = the tool script
        self._tool = tool
        self._arguments = dict(arguments or {})
        self._every_turn = every_turn
        self._released = 0  # bumped by release(); a stalled request waits for a change
        self._stalled = 0
        self._stopping = False
        self._conns: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> ScriptedModelServer:
        """Bind 127.0.0.1 on an OS-chosen port and serve in a thread."""
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = serve_in_thread(self._httpd)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, cut open connections (stalled ones too), join threads. Idempotent."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
            conns = list(self._conns)
        httpd.shutdown()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        for thread in [self._thread, *self._threads]:
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        httpd.server_close()

    def __enter__(self) -> ScriptedModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (Anthropic and Gemini clients add ``/v1...`` themselves)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1`` (OpenAI clients want the ``/v1`` in the base URL)."""
        return f"{self.base_url}/v1"

    # -- scripting ---------------------------------------------------------------------------

    def script(self, tool: str | None = None, arguments: dict[str, Any] | None = None) -> None:
        """Default mode: call the tool ending in ``tool`` until its result is in, then quote it."""
        with self._lock:
            self._tool, self._arguments, self._default = tool, dict(arguments or {}), None

    def reply(self, text: str) -> None:
        """Default mode: always answer ``text``."""
        self._set_default(Reply(text=text))

    def fail(self, status: int = 500, body: Any = None) -> None:
        """Default mode: answer every request with ``status`` and ``body``."""
        self._set_default(Fail(status) if body is None else Fail(status, body))

    def stall(self, after: int | None = None) -> None:
        """Default mode: stall every request (see :class:`Stall`) until ``release()``."""
        self._set_default(Stall(after))

    def drop(self, after: int = 1) -> None:
        """Default mode: cut every stream after ``after`` events."""
        self._set_default(Drop(after))

    def enqueue(self, *actions: Action) -> None:
        """One-shot actions, used in order before the default mode."""
        with self._lock:
            self._queue.extend(actions)

    def release(self) -> None:
        """Let stalled requests finish with the scripted reply; stop stalling new ones."""
        with self._lock:
            if isinstance(self._default, Stall):
                self._default = None
            self._released += 1
            self._lock.notify_all()

    def _set_default(self, action: Action) -> None:
        with self._lock:
            self._default = action

    # -- inspection --------------------------------------------------------------------------

    def requests(self, api: str | None = None) -> list[LoggedRequest]:
        """A copy of the request log, optionally only one API's requests."""
        with self._lock:
            return [r for r in self._log if api is None or r.api == api]

    def wait_requests(self, count: int, timeout: float = 10.0, api: str | None = None) -> bool:
        """Wait until at least ``count`` requests (of ``api``) were logged."""
        with self._lock:
            return self._lock.wait_for(
                lambda: sum(api is None or r.api == api for r in self._log) >= count, timeout
            )

    def wait_stalled(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Wait until at least ``count`` requests are stalled right now."""
        with self._lock:
            return self._lock.wait_for(lambda: self._stalled >= count, timeout)

    # -- request handling (handler threads) --------------------------------------------------

    def _handle(self, h: _Handler) -> None:
        path, _, query = h.path.partition("?")
        raw = read_body(h)
        body: Any = None
        if raw:
            with contextlib.suppress(ValueError, RecursionError):  # deep JSON: body None
                body = json.loads(raw)
        api, stream, model = _route(h.command, path, body, self.model)
        entry = LoggedRequest(
            method=h.command,
            path=path,
            query=query,
            headers={k.lower(): v for k, v in h.headers.items()},
            body=body,
            raw=raw,
            api=api,
            time=time.time(),
        )
        with self._lock:
            self._log.append(entry)
            self._lock.notify_all()
            action = self._queue.popleft() if api != "other" and self._queue else self._default
        if api == "other":
            _send_json(h, *_other(h.command, path, model, body))
            return
        if isinstance(action, Fail):
            _send_json(h, action.status, action.body)
            return
        if isinstance(action, Echo):
            echoed = {"message": "invalid credentials", "headers": entry.headers, "query": query}
            credential = entry.headers.get("authorization") or entry.headers.get("x-api-key", "")
            _send_json(h, action.status, {"error": echoed}, [("X-Echo-Credential", credential)])
            return
        if isinstance(action, Raw):
            _send_json(h, action.status, action.body, content_type=action.content_type)
            return
        reply = action if isinstance(action, Reply) else self._scripted(api, body)
        if not self.token_ids and isinstance(body, dict):
            body = {k: v for k, v in body.items() if k != "return_token_ids"}
        events = _RENDER[api](reply, body, model, stream)
        if not stream:
            if isinstance(action, Stall):
                self._wait_release()  # raises _Abort on stop
            if isinstance(action, Drop):
                raise _Abort
            _send_json(h, 200, events[0][1])
            return
        _send_stream(h, events, action, self._wait_release)

    def _wait_release(self) -> None:
        with self._lock:
            generation = self._released
            self._stalled += 1
            self._lock.notify_all()
            try:
                self._lock.wait_for(lambda: self._stopping or self._released != generation)
            finally:
                self._stalled -= 1
            if self._stopping:
                raise _Abort

    def _scripted(self, api: str, body: Any) -> Reply:
        with self._lock:
            tool, arguments, every_turn = self._tool, self._arguments, self._every_turn
        convo = _CONVERSATION[api](body if isinstance(body, dict) else {})
        results = convo.results_since_prompt if every_turn else convo.results
        if isinstance(self._default, Reply):
            return self._default
        if tool:
            offered = [n for n in convo.tools if n.endswith(tool)]
            if offered and not any(name.endswith(tool) for name, _ in results):
                return Reply(tool=offered[0], arguments=arguments)
        said = f"you said: {' | '.join(convo.prompts) if self._recall else convo.prompt}"
        if convo.results:
            return Reply(text=f"tool said: {convo.results[-1][1]}; {said}")
        return Reply(text=said)


# -- conversation parsing, per wire format --


@dataclass
class _Conversation:
    tools: list[str] = field(default_factory=list)
    prompt: str = ""  # the last user text
    prompts: list[str] = field(default_factory=list)  # every user text, in order
    results: list[tuple[str, str]] = field(default_factory=list)  # (tool name, result text)
    results_since_prompt: list[tuple[str, str]] = field(default_factory=list)

    def add_result(self, name: str, content: Any) -> None:
        self.results.append((name, _text_of(content)))
        self.results_since_prompt.append((name, _text_of(content)))

    def add_prompt(self, text: str) -> None:
        self.prompt = text
        self.prompts.append(text)
        self.results_since_prompt = []


def serve_in_thread(httpd: ThreadingHTTPServer) -> threading.Thread:
    """Run ``httpd.serve_forever`` in a daemon thread (``shutdown`` answers within 0.05 s)."""
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    return thread


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text_of(v) for v in value)
    if isinstance(value, dict):
        for key in ("text", "output", "content", "result"):
            if key in value:
                return _text_of(value[key])
        return json.dumps(value)
    return "" if value is None else json.dumps(value)


def _tool_names(tools: Any) -> list[str]:
    names: list[str] = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        if isinstance(tool.get("name"), str):
            names.append(tool["name"])
        if isinstance(tool.get("function"), dict):
            names.append(str(tool["function"].get("name", "")))
        for key in ("tools", "functionDeclarations", "function_declarations"):
            names.extend(_tool_names(tool.get(key)))
    return names


def _anthropic_convo(body: dict[str, Any]) -> _Conversation:
    convo, calls = _Conversation(tools=_tool_names(body.get("tools"))), {}
    for msg in body.get("messages") or []:
        content = msg.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
        for b in blocks:
            if b.get("type") == "tool_use":
                calls[b.get("id")] = b.get("name", "")
            elif b.get("type") == "tool_result":
                convo.add_result(calls.get(b.get("tool_use_id"), ""), b.get("content"))
        is_result = any(b.get("type") == "tool_result" for b in blocks)
        if msg.get("role") == "user" and texts and not is_result:
            convo.add_prompt(texts[-1])
    return convo


def _responses_convo(body: dict[str, Any]) -> _Conversation:
    convo, calls = _Conversation(tools=_tool_names(body.get("tools"))), {}
    items = body.get("input") or []
    for item in [{"role": "user", "content": items}] if isinstance(items, str) else items:
        kind = item.get("type", "message")
        if kind.endswith("_call") and "call_id" in item:
            calls[item["call_id"]] = item.get("name", "")
        elif kind.endswith("_call_output"):
            convo.add_result(calls.get(item.get("call_id"), ""), item.get("output"))
        elif kind == "message" and item.get("role") == "user":
            convo.add_prompt(_text_of(item.get("content")))
    return convo


def _chat_convo(body: dict[str, Any]) -> _Conversation:
    convo, calls = _Conversation(tools=_tool_names(body.get("tools"))), {}
    for msg in body.get("messages") or []:
        for call in msg.get("tool_calls") or []:
            calls[call.get("id")] = call.get("function", {}).get("name", "")
        if msg.get("role") == "tool":
            convo.add_result(calls.get(msg.get("tool_call_id"), ""), msg.get("content"))
        elif msg.get("role") == "user":
            convo.add_prompt(_text_of(msg.get("content")))
    return convo


def _gemini_convo(body: dict[str, Any]) -> _Conversation:
    convo = _Conversation(tools=_tool_names(body.get("tools")))
    for content in body.get("contents") or []:
        parts = content.get("parts") or []
        responses = [p["functionResponse"] for p in parts if "functionResponse" in p]
        for resp in responses:
            convo.add_result(resp.get("name", ""), resp.get("response"))
        texts = [p["text"] for p in parts if isinstance(p.get("text"), str)]
        if content.get("role", "user") == "user" and texts and not responses:
            convo.add_prompt(texts[-1])
    return convo


_CONVERSATION = {
    "anthropic": _anthropic_convo,
    "responses": _responses_convo,
    "chat": _chat_convo,
    "gemini": _gemini_convo,
}


# -- rendering, per wire format: a list of (SSE event name or None, data) --

Events = list[tuple[str | None, Any]]


def _pieces(text: str) -> list[str]:
    return _TOKEN.findall(text) or [text]


def _count(body: Any) -> int:
    return max(1, len(json.dumps(body)) // 4)


def _id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def _halves(text: str) -> list[str]:
    mid = len(text) // 2
    return [p for p in (text[:mid], text[mid:]) if p] or [""]


def _anthropic(reply: Reply, body: Any, model: str, stream: bool) -> Events:
    args = json.dumps(reply.arguments)
    if reply.tool:
        block: dict[str, Any] = {
            "type": "tool_use",
            "id": _id("toolu_"),
            "name": reply.tool,
            "input": reply.arguments,
        }
        stop, n_out = "tool_use", max(1, len(args) // 4)
    else:
        block, stop, n_out = (
            {"type": "text", "text": reply.text},
            "end_turn",
            len(_pieces(reply.text)),
        )
    n_in = _count(body)
    message = {
        "id": _id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": n_in, "output_tokens": n_out},
    }
    if not stream:
        return [(None, message)]
    start_usage = {
        "input_tokens": n_in,
        "output_tokens": 1,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    started = {**message, "content": [], "stop_reason": None, "usage": start_usage}
    empty = {**block, "input": {}} if reply.tool else {"type": "text", "text": ""}
    events: Events = [
        ("message_start", {"type": "message_start", "message": started}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": empty},
        ),
        ("ping", {"type": "ping"}),
    ]
    if reply.tool:
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in _halves(args)]
    else:
        deltas = [{"type": "text_delta", "text": p} for p in _pieces(reply.text)]
    for delta in deltas:
        data = {"type": "content_block_delta", "index": 0, "delta": delta}
        events.append(("content_block_delta", data))
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": n_out},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return events


def _tool_namespaces(tools: Any) -> dict[str, str]:
    """Tool name -> its Responses ``namespace`` (Codex groups MCP tools as ``mcp__SERVER``)."""
    found: dict[str, str] = {}
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            for sub in tool.get("tools") or []:
                if isinstance(sub, dict) and isinstance(sub.get("name"), str):
                    found[sub["name"]] = str(tool.get("name", ""))
    return found


def _responses(reply: Reply, body: Any, model: str, stream: bool) -> Events:
    args = json.dumps(reply.arguments)
    item: dict[str, Any]
    if reply.tool:
        item = {
            "type": "function_call",
            "id": _id("fc_"),
            "call_id": _id("call_"),
            "name": reply.tool,
            "arguments": args,
            "status": "completed",
        }
        namespace = _tool_namespaces((body or {}).get("tools")).get(reply.tool)
        if namespace:
            item["namespace"] = namespace
        n_out = max(1, len(args) // 4)
    else:
        part = {"type": "output_text", "text": reply.text, "annotations": []}
        item = {
            "type": "message",
            "id": _id("msg_"),
            "role": "assistant",
            "status": "completed",
            "content": [part],
        }
        n_out = len(_pieces(reply.text))
    n_in = _count(body)
    usage = {
        "input_tokens": n_in,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": n_out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": n_in + n_out,
    }
    rid, created = _id("resp_"), int(time.time())

    def response(status: str, output: list[Any], use: Any) -> dict[str, Any]:
        return {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": status,
            "model": model,
            "output": output,
            "usage": use,
            "error": None,
            "incomplete_details": None,
        }

    if not stream:
        return [(None, response("completed", [item], usage))]
    raw: list[dict[str, Any]] = [
        {"type": "response.created", "response": response("in_progress", [], None)},
        {"type": "response.in_progress", "response": response("in_progress", [], None)},
    ]
    ref = {"item_id": item["id"], "output_index": 0}
    if reply.tool:
        raw.append({**ref, "type": "response.output_item.added", "item": {**item, "arguments": ""}})
        for p in _halves(args):
            raw.append({**ref, "type": "response.function_call_arguments.delta", "delta": p})
        raw.append({**ref, "type": "response.function_call_arguments.done", "arguments": args})
    else:
        added = {**item, "status": "in_progress", "content": []}
        raw.append({"type": "response.output_item.added", "output_index": 0, "item": added})
        empty = {"type": "output_text", "text": "", "annotations": []}
        cref = {**ref, "content_index": 0}
        raw.append({**cref, "type": "response.content_part.added", "part": empty})
        for p in _pieces(reply.text):
            raw.append({**cref, "type": "response.output_text.delta", "delta": p, "logprobs": []})
        raw.append({**cref, "type": "response.output_text.done", "text": reply.text})
        raw.append({**cref, "type": "response.content_part.done", "part": item["content"][0]})
    raw.append({"type": "response.output_item.done", "output_index": 0, "item": item})
    raw.append({"type": "response.completed", "response": response("completed", [item], usage)})
    return [(ev["type"], {**ev, "sequence_number": i}) for i, ev in enumerate(raw)]


def _logprob(piece: str, top: int) -> dict[str, Any]:
    lp = -((zlib.crc32(piece.encode()) % 1000) / 1000)
    entry = {"token": piece, "logprob": lp, "bytes": list(piece.encode())}
    alts = [{"token": f"{piece}~{k}", "logprob": lp - k - 1, "bytes": []} for k in range(top)]
    return {**entry, "top_logprobs": alts}


def pieces(text: str) -> list[str]:
    """The pieces the server splits a text answer into: one token id (and logprob) each."""
    return _pieces(text)


def token_id(piece: str) -> int:
    """The token id the server reports for a text piece (deterministic)."""
    return zlib.crc32(piece.encode()) % 100_000


def _chat(reply: Reply, body: Any, model: str, stream: bool) -> Events:
    body = body if isinstance(body, dict) else {}
    want_lp, want_ids = body.get("logprobs") is True, body.get("return_token_ids") is True
    top = int(body.get("top_logprobs") or 0)
    args = json.dumps(reply.arguments)
    pieces = [] if reply.tool else _pieces(reply.text)
    n_in, n_out = _count(body), max(1, len(args) // 4) if reply.tool else len(pieces)
    usage = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
    finish = "tool_calls" if reply.tool else "stop"
    call = {"id": _id("call_"), "type": "function", "function": {"name": reply.tool}}
    base: dict[str, Any] = {"id": _id("chatcmpl-"), "created": int(time.time()), "model": model}
    prompt_ids = {"prompt_token_ids": list(range(n_in))} if want_ids else {}
    if not stream:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if reply.tool else reply.text,
        }
        if reply.tool:
            message["tool_calls"] = [{**call, "function": {"name": reply.tool, "arguments": args}}]
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
        choice["logprobs"] = {"content": [_logprob(p, top) for p in pieces]} if want_lp else None
        if want_ids:
            choice["token_ids"] = [token_id(p) for p in pieces]
        full = {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
        return [(None, {**full, **prompt_ids})]
    chunk = {**base, "object": "chat.completion.chunk"}

    def one(delta: dict[str, Any], reason: str | None = None, piece: str | None = None) -> Any:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None}
        choice["finish_reason"] = reason
        if piece is not None and want_lp:
            choice["logprobs"] = {"content": [_logprob(piece, top)]}
        if piece is not None and want_ids:
            choice["token_ids"] = [token_id(piece)]
        return (None, {**chunk, "choices": [choice]})

    events: Events = [one({"role": "assistant", "content": ""})]
    if prompt_ids:
        events[0] = (None, {**events[0][1], **prompt_ids})
    if reply.tool:
        first = {**call, "index": 0, "function": {"name": reply.tool, "arguments": ""}}
        events.append(one({"tool_calls": [first]}))
        for p in _halves(args):
            events.append(one({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}))
    events += [one({"content": p}, piece=p) for p in pieces]
    events.append(one({}, finish))
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append((None, {**chunk, "choices": [], "usage": usage}))
    events.append((None, "[DONE]"))
    return events


def _gemini(reply: Reply, body: Any, model: str, stream: bool) -> Events:
    n_in = _count(body)
    if reply.tool:
        parts: list[dict[str, Any]] = [
            {"functionCall": {"name": reply.tool, "args": reply.arguments}}
        ]
    else:
        parts = [{"text": p} for p in _pieces(reply.text)]
    n_out = len(parts)
    usage = {
        "promptTokenCount": n_in,
        "candidatesTokenCount": n_out,
        "totalTokenCount": n_in + n_out,
    }
    rid = _id("")

    def chunk(chunk_parts: list[dict[str, Any]], last: bool) -> Any:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": chunk_parts}, "index": 0}
        data: dict[str, Any] = {"candidates": [candidate], "modelVersion": model, "responseId": rid}
        if last:  # Gemini CLI wants the finish reason next to content, plus usage
            candidate["finishReason"] = "STOP"
            data["usageMetadata"] = usage
        return (None, data)

    if not stream:
        joined = parts if reply.tool else [{"text": reply.text}]
        return [chunk(joined, True)]
    return [chunk([p], i == len(parts) - 1) for i, p in enumerate(parts)]


_RENDER = {"anthropic": _anthropic, "responses": _responses, "chat": _chat, "gemini": _gemini}


# -- HTTP plumbing --


def _route(method: str, path: str, body: Any, default_model: str) -> tuple[str, bool, str]:
    body_d = body if isinstance(body, dict) else {}
    model = str(body_d.get("model") or default_model)
    stream = body_d.get("stream") is True
    if method != "POST":
        return "other", False, model
    if path in ("/v1/messages", "/messages"):
        return "anthropic", stream, model
    # Exact paths: a client that doubles a prefix (``/v1/v1/...``) must see a 404.
    if path in ("/v1/responses", "/responses"):
        return "responses", stream, model
    if path in ("/v1/chat/completions", "/chat/completions"):
        return "chat", stream, model
    match = _GEMINI_PATH.search(path)
    if match and match.group(2) != "countTokens":
        return "gemini", match.group(2) == "streamGenerateContent", match.group(1)
    return "other", False, model


def _other(method: str, path: str, model: str, body: Any) -> tuple[int, Any]:
    if path == "/":
        return 200, {}
    if method == "GET" and path.endswith("/models"):
        listed = {"id": model, "object": "model", "created": 0, "owned_by": "scripted"}
        return 200, {"object": "list", "data": [listed], "models": []}
    if path.endswith("/count_tokens"):
        return 200, {"input_tokens": _count(body)}
    if path.endswith(":countTokens"):
        return 200, {"totalTokens": _count(body)}
    return 404, {"error": {"type": "not_found_error", "message": f"no route for {method} {path}"}}


def read_body(h: BaseHTTPRequestHandler) -> bytes:
    """The request's body: chunked or sized, gzip undone."""
    if h.headers.get("transfer-encoding", "").lower() == "chunked":
        raw = b""
        while size := int(h.rfile.readline().split(b";")[0].strip() or b"0", 16):
            raw += h.rfile.read(size)
            h.rfile.readline()
        while h.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
    else:
        raw = h.rfile.read(int(h.headers.get("content-length") or 0))
    if h.headers.get("content-encoding", "").lower() == "gzip":
        raw = gzip.decompress(raw)
    return raw


def _send_json(
    h: BaseHTTPRequestHandler,
    status: int,
    payload: Any,
    headers: Sequence[tuple[str, str]] = (),
    content_type: str = "text/plain",
) -> None:
    if isinstance(payload, bytes | str):
        data, ctype = (payload.encode() if isinstance(payload, str) else payload), content_type
    else:
        data, ctype = json.dumps(payload).encode(), "application/json"
    h.send_response(status)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(data)))
    for name, value in headers:
        h.send_header(name, value)
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(data)


def _sse(name: str | None, data: Any) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {name}\n" if name else "").encode() + f"data: {text}\n\n".encode()


def _send_stream(h: BaseHTTPRequestHandler, events: Events, action: Any, wait: Any) -> None:
    after = action.after if isinstance(action, Stall | Drop) else None
    if isinstance(action, Stall) and after is None:
        wait()
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Cache-Control", "no-cache")
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    for i, (name, data) in enumerate(events):
        if i == after and isinstance(action, Drop):
            raise _Abort
        if i == after:
            wait()
        payload = _sse(name, data)
        h.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
    h.wfile.write(b"0\r\n\r\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() joins the handler threads itself, with a deadline
    owner: ScriptedModelServer

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._serve_one, args=(request, client_address), daemon=True
        )
        with self.owner._lock:
            self.owner._threads = [t for t in self.owner._threads if t.is_alive()]
            self.owner._threads.append(thread)
            self.owner._conns.add(request)
        thread.start()

    def _serve_one(self, request: Any, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self.owner._lock:
                self.owner._conns.discard(request)


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 on loopback for test servers: no delayed ACKs, no log lines.

    Subclasses implement :meth:`serve`; any exception in :attr:`aborts` (a client that
    hung up, by default) closes the connection quietly.
    """

    protocol_version = "HTTP/1.1"
    aborts: tuple[type[BaseException], ...] = (OSError,)

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def serve(self) -> None:
        """Answer the request that was just read."""
        raise NotImplementedError

    def _dispatch(self) -> None:
        try:
            self.serve()
        except self.aborts:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _dispatch


class _Handler(QuietHandler):
    server: _Server
    aborts = (_Abort, OSError)

    def serve(self) -> None:
        self.server.owner._handle(self)


#: What the ``srv`` fixture's server scripts: a call of the tool ``add`` with a=2, b=3.
SRV_OPTIONS: dict[str, Any] = {"tool": "add", "arguments": {"a": 2, "b": 3}}


@pytest.fixture
def srv_options() -> dict[str, Any]:
    """The ``srv`` fixture's :class:`ScriptedModelServer` options; a test module overrides it."""
    return SRV_OPTIONS


@pytest.fixture
def srv(srv_options: dict[str, Any]) -> Iterator[ScriptedModelServer]:
    """A started :class:`ScriptedModelServer`, released and stopped after the test.

    The one server fixture of the tests (the ``capture`` and ``model`` parts' conftests
    import it); its options come from the ``srv_options`` fixture.
    """
    with ScriptedModelServer(**srv_options) as server:
        yield server
        server.release()  # a stalled request must not outlive the test
