"""The records of model calls: what ModelProxy keeps, and how it reads the wire.

A :class:`ModelExchange` is one model call: the request, the answer assembled from
the bytes the upstream sent (text, tool calls, stop reason, usage, logprobs, token
ids), the stream's events, the timing, and what went wrong if anything did.
:func:`assemble` builds one from raw bytes; it runs in the caller's thread when
records are read, never in the proxy's hot path.

Wire APIs understood: OpenAI Chat Completions, OpenAI Responses, Anthropic
Messages, Gemini (anything else is recorded with api ``"other"``).

Reading never raises, whatever the bytes: JSON nested deeper than :data:`MAX_DEPTH`
is not parsed (the record keeps its text and says ``"unparsed"``), so a record never
holds a structure that breaks ``json``, ``pickle`` or ``dataclasses.asdict`` downstream.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gym_harness.records.events import EventType, HarnessEvent
from gym_harness.utils import bounded_json

__all__ = [
    "MAX_DEPTH",
    "ModelExchange",
    "SSEEvent",
    "TokenLogprob",
    "ToolCallRecord",
    "api_of",
    "assemble",
    "parse_sse",
]


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call the model asked for. ``arguments`` is the JSON text as sent."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token with its log-probability (and id, when the upstream gave one)."""

    token: str
    logprob: float
    token_id: int | None = None
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class SSEEvent:
    """One server-sent event as the upstream sent it (``event`` is "" when unnamed)."""

    event: str
    data: str


@dataclass(frozen=True)
class ModelExchange:
    """One model call through the proxy: what went up, what came back, and how.

    ``outcome`` is one of ``"ok"``, ``"refused"`` (upstream answered >= 400; passed
    through unchanged), ``"dropped"`` (upstream broke the connection before or during
    its answer), ``"stalled"`` (upstream silent past ``timeout_s``, or still owing its
    answer when the env cut it at the end of a turn), ``"unreachable"``,
    ``"unauthorized"`` (wrong proxy token; nothing forwarded), ``"too_large"`` (the
    request body passed the proxy's limit; answered 413, nothing forwarded),
    ``"client_closed"`` (the harness hung up first), ``"cancelled"`` (the proxy stopped
    mid-answer) or ``"unparsed"`` (the exchange completed, but its request or answer
    could not be read, e.g. JSON nested deeper than :data:`MAX_DEPTH`; ``error`` says
    what, and the raw text is kept in ``request_text``, ``body`` or ``events``).

    ``request`` is the JSON body as sent upstream (after any logprobs request was
    added), or ``None`` when it was empty, not JSON, too deep, or cut by the record cap;
    then ``request_text`` holds its text (else ``""``). ``events`` holds a streamed answer
    event by event; ``body`` a non-streamed one. Bodies are kept up to the proxy's
    ``max_record_bytes`` each: ``truncated`` says one was cut (the harness still got it
    whole), ``request_bytes`` and ``answer_bytes`` are the sizes on the wire. The real
    API key and the proxy token never appear in a record (replaced by ``[redacted]``).
    Times are seconds from the moment the whole request had reached the proxy.

    ``token_ids`` and ``prompt_token_ids`` are the engine's own ids of the completion and
    of the prompt, when the upstream returned them (vLLM and SGLang do when asked,
    ``capture_tokens=True``); ``tokens_asked`` says the proxy asked for them, so a record
    that asked and has none comes from an upstream that ignored the request.
    """

    seq: int
    api: str
    method: str
    path: str
    request: Any
    request_text: str
    logprobs_added: bool
    status: int
    outcome: str
    error: str
    truncated: bool
    request_bytes: int
    answer_bytes: int
    streamed: bool
    events: tuple[SSEEvent, ...]
    body: str
    text: str
    tool_calls: tuple[ToolCallRecord, ...]
    stop_reason: str
    usage: dict[str, Any]
    logprobs: tuple[TokenLogprob, ...]
    token_ids: tuple[int, ...]
    started_at: float
    ttfb_s: float | None
    total_s: float
    prompt_token_ids: tuple[int, ...] = ()
    tokens_asked: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists)."""
        return dict(json.loads(json.dumps(asdict(self))))

    def to_events(self) -> tuple[HarnessEvent, HarnessEvent]:
        """The exchange as the ``llm_request`` / ``llm_response`` pair of a turn's events.

        The request event (at ``started_at``) holds ``seq``, ``api``, ``method``, ``path``,
        ``request`` and ``request_text``; the response event (at ``started_at + total_s``)
        holds ``seq`` and every other field. Merged back, they are ``to_dict()``
        (``chat_format.exchange_records`` does that).
        """
        record = self.to_dict()
        request = {key: record.pop(key) for key in _REQUEST_KEYS}
        record["seq"] = self.seq
        return (
            HarnessEvent(EventType.LLM_REQUEST, request, self.started_at),
            HarnessEvent(EventType.LLM_RESPONSE, record, self.started_at + self.total_s),
        )


#: The fields of an exchange that its ``llm_request`` event carries.
_REQUEST_KEYS = ("seq", "api", "method", "path", "request", "request_text")


#: Deepest JSON nesting a record holds parsed (real requests nest about ten deep).
MAX_DEPTH = 100


def _loads(text: str) -> tuple[Any, str]:
    """``(value, "")``, or ``(None, why)`` when ``text`` is not JSON or nests too deep."""
    try:
        return bounded_json.loads(text, MAX_DEPTH), ""
    except bounded_json.JSONBoundError:
        return None, f"JSON nested deeper than {MAX_DEPTH} levels"
    except ValueError as exc:
        return None, f"not JSON: {str(exc)[:200]}"


def api_of(path: str) -> str:
    """The wire API a request path belongs to: chat, responses, anthropic, gemini or other."""
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/responses"):
        return "responses"
    if path.endswith("/messages"):
        return "anthropic"
    if path.endswith((":generateContent", ":streamGenerateContent")):
        return "gemini"
    return "other"


def parse_sse(raw: bytes) -> tuple[SSEEvent, ...]:
    """Split an SSE body into events (comments and ``id``/``retry`` fields dropped)."""
    events = []
    text = raw.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    for block in text.split("\n\n"):
        name, data = "", []
        for line in block.split("\n"):
            field_name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field_name == "event":
                name = value
            elif field_name == "data":
                data.append(value)
        if data:
            events.append(SSEEvent(name, "\n".join(data)))
    return tuple(events)


@dataclass
class _Answer:
    text: list[str] = field(default_factory=list)
    calls: dict[Any, dict[str, str]] = field(default_factory=dict)
    stop: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)

    def say(self, text: Any) -> None:
        if isinstance(text, str):
            self.text.append(text)

    def call(self, key: Any, id_: Any = "", name: Any = "", arguments: Any = "") -> None:
        slot = self.calls.setdefault(key, {"id": "", "name": "", "arguments": ""})
        slot["id"] = slot["id"] or _str(id_)
        slot["name"] = slot["name"] or _str(name)
        slot["arguments"] += _str(arguments)


def _str(value: Any) -> str:
    """A string field as sent; anything else (an upstream's odd shape) as JSON text."""
    if isinstance(value, str):
        return value
    return "" if value is None else json.dumps(value)


def _logprob(entry: dict[str, Any]) -> TokenLogprob:
    top = tuple(
        (str(t.get("token", "")), float(t.get("logprob", 0.0)))
        for t in entry.get("top_logprobs") or []
    )
    return TokenLogprob(str(entry.get("token", "")), float(entry.get("logprob", 0.0)), top=top)


def _feed_chat(ans: _Answer, obj: dict[str, Any]) -> None:
    if obj.get("usage"):
        ans.usage = dict(obj["usage"])
    if obj.get("prompt_token_ids") and not ans.prompt_ids:  # vLLM: a stream's first chunk
        ans.prompt_ids = [int(t) for t in obj["prompt_token_ids"]]
    for choice in obj.get("choices") or []:
        part = choice.get("delta") or choice.get("message") or {}
        ans.say(part.get("content"))
        for i, tc in enumerate(part.get("tool_calls") or []):
            fn = tc.get("function") or {}
            ans.call(
                tc.get("index", i),
                tc.get("id") or "",
                fn.get("name") or "",
                fn.get("arguments") or "",
            )
        if choice.get("finish_reason"):
            ans.stop = str(choice["finish_reason"])
        ans.logprobs += [_logprob(e) for e in (choice.get("logprobs") or {}).get("content") or []]
        ans.token_ids += [int(t) for t in choice.get("token_ids") or []]


def _feed_anthropic(ans: _Answer, obj: dict[str, Any]) -> None:
    kind = obj.get("type")
    if kind == "message":  # a whole, non-streamed message
        for i, block in enumerate(obj.get("content") or []):
            _anthropic_block(ans, i, block)
        ans.stop, ans.usage = str(obj.get("stop_reason") or ""), dict(obj.get("usage") or {})
    elif kind == "message_start":
        ans.usage.update(obj.get("message", {}).get("usage") or {})
    elif kind == "content_block_start":
        _anthropic_block(ans, obj.get("index"), obj.get("content_block") or {}, streamed=True)
    elif kind == "content_block_delta":
        delta = obj.get("delta") or {}
        if delta.get("type") == "text_delta":
            ans.say(delta.get("text"))
        elif delta.get("type") == "input_json_delta":
            ans.call(obj.get("index"), arguments=delta.get("partial_json", ""))
    elif kind == "message_delta":
        ans.stop = str((obj.get("delta") or {}).get("stop_reason") or ans.stop)
        ans.usage.update(obj.get("usage") or {})
    elif kind == "error":
        ans.stop = "error"


def _anthropic_block(ans: _Answer, key: Any, block: dict[str, Any], streamed: bool = False) -> None:
    if block.get("type") == "text":
        ans.say(block.get("text"))
    elif block.get("type") in ("tool_use", "server_tool_use"):
        args = "" if streamed else json.dumps(block.get("input") or {})
        ans.call(key, block.get("id", ""), block.get("name", ""), args)


def _feed_responses(ans: _Answer, obj: dict[str, Any]) -> None:
    kind = obj.get("type", "")
    if obj.get("object") == "response":  # a whole, non-streamed response
        for i, item in enumerate(obj.get("output") or []):
            _responses_item(ans, i, item, with_text=True)
        ans.stop, ans.usage = str(obj.get("status") or ""), dict(obj.get("usage") or {})
    elif kind == "response.output_text.delta":
        ans.say(obj.get("delta"))
        ans.logprobs += [_logprob(e) for e in obj.get("logprobs") or []]
    elif kind == "response.output_item.done":
        _responses_item(ans, obj.get("output_index"), obj.get("item") or {}, with_text=False)
    elif kind in ("response.completed", "response.incomplete", "response.failed"):
        response = obj.get("response") or {}
        ans.stop, ans.usage = str(response.get("status") or ""), dict(response.get("usage") or {})
    elif kind == "error":
        ans.stop = "error"


def _responses_item(ans: _Answer, key: Any, item: dict[str, Any], with_text: bool) -> None:
    if item.get("type") == "function_call":
        ans.call(key, item.get("call_id", ""), item.get("name", ""), item.get("arguments", ""))
    elif item.get("type") == "message" and with_text:
        for part in item.get("content") or []:
            if part.get("type") == "output_text":
                ans.say(part.get("text"))


def _feed_gemini(ans: _Answer, obj: dict[str, Any]) -> None:
    if obj.get("usageMetadata"):
        ans.usage = dict(obj["usageMetadata"])
    for cand in (obj.get("candidates") or [])[:1]:
        for part in (cand.get("content") or {}).get("parts") or []:
            if not part.get("thought"):
                ans.say(part.get("text"))
            if "functionCall" in part:
                fc = part["functionCall"]
                ans.call(
                    len(ans.calls),
                    fc.get("id", ""),
                    fc.get("name", ""),
                    json.dumps(fc.get("args") or {}),
                )
        if cand.get("finishReason"):
            ans.stop = str(cand["finishReason"])
        for chosen in (cand.get("logprobsResult") or {}).get("chosenCandidates") or []:
            tid = chosen.get("tokenId")
            ans.logprobs.append(
                TokenLogprob(
                    str(chosen.get("token", "")), float(chosen.get("logProbability", 0.0)), tid
                )
            )


_FEED = {
    "chat": _feed_chat,
    "anthropic": _feed_anthropic,
    "responses": _feed_responses,
    "gemini": _feed_gemini,
}


def assemble(
    *,
    seq: int,
    method: str,
    path: str,
    request: bytes,
    logprobs_added: bool,
    status: int,
    outcome: str,
    error: str,
    answer: tuple[str, bytes] | None,
    started_at: float,
    ttfb_s: float | None,
    total_s: float,
    truncated: bool = False,
    request_bytes: int | None = None,
    answer_bytes: int | None = None,
    tokens_asked: bool = False,
) -> ModelExchange:
    """Build the record of one exchange from the bytes that went up and came back.

    Never raises: whatever cannot be read is kept as text, and a completed exchange
    whose request or answer could not be read is recorded as ``"unparsed"``.
    """
    ctype, raw = answer or ("", b"")
    sizes = {
        "request_bytes": len(request) if request_bytes is None else request_bytes,
        "answer_bytes": len(raw) if answer_bytes is None else answer_bytes,
    }
    meta = {
        "seq": seq,
        "method": method,
        "path": path,
        "logprobs_added": logprobs_added,
        "status": status,
        "started_at": started_at,
        "ttfb_s": ttfb_s,
        "total_s": total_s,
        "truncated": truncated,
        "tokens_asked": tokens_asked,
        **sizes,
    }
    try:
        return _assemble(meta, request, outcome, error, ctype, raw, truncated)
    except Exception as exc:  # a bug of ours on odd bytes must not lose the exchange
        why = f"could not read the exchange: {exc!r}"
        return _unread(meta, request, raw, outcome, error, why)


def _assemble(
    meta: dict[str, Any],
    request: bytes,
    outcome: str,
    error: str,
    ctype: str,
    raw: bytes,
    truncated: bool,
) -> ModelExchange:
    api = api_of(meta["path"])
    problems: list[str] = []
    parsed: Any = None
    request_text = ""
    if request:
        text = request.decode("utf-8", "replace")
        parsed, why = _loads(text)
        if why:
            request_text = text
            if api != "other" and not (truncated and why.startswith("not JSON")):
                problems.append(f"request: {why}")
    streamed = ctype.startswith("text/event-stream")
    events = parse_sse(raw) if streamed else ()
    body = "" if streamed else raw.decode("utf-8", "replace")
    ans = _Answer()
    feed = _FEED.get(api)
    if feed is not None and meta["status"] < 400:
        payloads = [e.data for e in events] if streamed else [body]
        for n, payload in enumerate(payloads):
            obj, why = _loads(payload)
            if why.startswith("JSON nested"):
                problems.append(f"answer part {n}: {why}")
            # "[DONE]", a broken final chunk, or a shape we do not know: keep the rest
            if isinstance(obj, dict):
                with contextlib.suppress(Exception):
                    feed(ans, obj)
    logprobs = ans.logprobs
    if len(ans.token_ids) == len(logprobs):  # vLLM-style ids, one per logprob entry
        logprobs = [
            replace(lp, token_id=tid) for lp, tid in zip(logprobs, ans.token_ids, strict=True)
        ]
    if problems:
        outcome, error = _unparsed(outcome, error, "; ".join(problems))
    return ModelExchange(
        **meta,
        api=api,
        request=parsed,
        request_text=request_text,
        outcome=outcome,
        error=error,
        streamed=streamed,
        events=events,
        body=body,
        text="".join(ans.text),
        tool_calls=tuple(ToolCallRecord(**c) for _, c in sorted(ans.calls.items(), key=_order)),
        stop_reason=ans.stop,
        usage=ans.usage,
        logprobs=tuple(logprobs),
        token_ids=tuple(ans.token_ids),
        prompt_token_ids=tuple(ans.prompt_ids),
    )


def _unparsed(outcome: str, error: str, why: str) -> tuple[str, str]:
    """A completed exchange becomes ``"unparsed"``; a failed one keeps its outcome."""
    if outcome == "ok":
        return "unparsed", why
    return outcome, f"{error}; {why}" if error else why


def _unread(
    meta: dict[str, Any], request: bytes, raw: bytes, outcome: str, error: str, why: str
) -> ModelExchange:
    """The record of an exchange nothing could be read from: raw text and facts only."""
    outcome, error = _unparsed(outcome, error, why)
    return ModelExchange(
        **meta,
        api=api_of(meta["path"]),
        request=None,
        request_text=request.decode("utf-8", "replace"),
        outcome=outcome,
        error=error,
        streamed=False,
        events=(),
        body=raw.decode("utf-8", "replace"),
        text="",
        tool_calls=(),
        stop_reason="",
        usage={},
        logprobs=(),
        token_ids=(),
    )


def _order(item: tuple[Any, Any]) -> tuple[int, str]:
    key = item[0]
    return (key, "") if isinstance(key, int) else (1 << 30, str(key))
