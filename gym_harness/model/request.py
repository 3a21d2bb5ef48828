"""The request side of model mode: a harness's raw model call as the policy's observation.

:func:`read_request` takes what the loopback endpoint received (method, path, query,
body bytes) and returns a :class:`ModelRequest`: the wire facts the answer needs
(api, model, stream, tool names as the wire spells them) and the observation the
policy sees (:meth:`ModelRequest.observation`), whose ``messages`` and ``tools`` come
from :func:`gym_harness.capture.chat_format.exchange_messages` and ``exchange_tools``.

Two request shapes are normalised first, so that the policy sees one tool name per
tool whatever the wire API:

* OpenAI Responses ``namespace`` tools (Codex groups MCP tools as ``{"type":
  "namespace", "name": "mcp__env", "tools": [...]}``) become function tools named
  ``NAMESPACE__NAME`` (``mcp__env__add``, the name Codex itself gives MCP tools), and
  earlier ``function_call`` items with a ``namespace`` get the same name.
* Responses ``custom`` (freeform) tools, such as Codex's ``apply_patch``, become function
  tools taking one string argument ``input``; earlier ``custom_tool_call`` items read
  back as calls with arguments ``{"input": ...}``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from gym_harness.capture.chat_format import exchange_messages, exchange_tools
from gym_harness.capture.records import api_of
from gym_harness.utils import bounded_json

__all__ = [
    "MAX_REQUEST_BYTES",
    "MAX_REQUEST_DEPTH",
    "BadRequest",
    "ModelRequest",
    "WireTool",
    "read_request",
]

#: Largest request body read (a long agent conversation is a few MB; this bounds memory).
MAX_REQUEST_BYTES = 64 * 1024 * 1024
#: Deepest nesting of a request body's JSON. Real requests stay far below it (tool schemas,
#: and tool-call arguments, which an action may nest 64 deep: ``ActionLimits.max_depth``).
MAX_REQUEST_DEPTH = 256
#: Where each API carries the conversation: a list of message (item) objects.
_CONVERSATION = {
    "chat": "messages",
    "anthropic": "messages",
    "responses": "input",
    "gemini": "contents",
}


class BadRequest(ValueError):
    """A model call whose body is no request of its API (the endpoint answers 400).

    The message says what is wrong: the body is empty, not UTF-8, not JSON, nested
    deeper than :data:`MAX_REQUEST_DEPTH`, no JSON object, or its conversation
    (``messages``, ``input``, ``contents``) is no list of message objects.
    """


_GEMINI_MODEL = re.compile(r"/models/([^/:]+):")
_CUSTOM_INPUT = "input"


@dataclass(frozen=True)
class WireTool:
    """How a tool offered under one flat name is spelled on the wire.

    Attributes:
        name: The tool's own name in the request (``add`` inside namespace ``mcp__env``).
        namespace: The Responses namespace that held it ("" for none).
        custom: A Responses ``custom`` (freeform) tool: its call carries raw ``input`` text.
    """

    name: str
    namespace: str = ""
    custom: bool = False


@dataclass(frozen=True)
class ModelRequest:
    """One model call of a harness, read for the policy.

    Attributes:
        request_id: The id the env gave this call (echoed in the observation).
        api: ``"anthropic"``, ``"responses"``, ``"chat"`` or ``"gemini"``.
        model: The model the harness asked for (Gemini: from the path).
        stream: The harness asked for a streamed answer.
        sse: The stream is server-sent events (always, except Gemini's
            ``streamGenerateContent`` without ``alt=sse``, which streams a JSON array).
        messages: The prompt as chat messages (``exchange_messages``).
        tools: The offered function tools as OpenAI schemas (``exchange_tools``).
        sampling: What the harness asked of the sampler, under common names.
        wire_tools: Flat tool name (as in ``tools``) -> how the wire spells it.
        body: The request body as parsed (the answer reads a few fields of it).
        size: The body's length in bytes (the answer's estimate of input tokens).
    """

    request_id: str
    api: str
    model: str
    stream: bool
    sse: bool
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    sampling: dict[str, Any]
    wire_tools: dict[str, WireTool] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict, repr=False)
    size: int = 0

    @property
    def tool_names(self) -> frozenset[str]:
        """The names a tool call may use: every function tool the request offered."""
        return frozenset(t["function"]["name"] for t in self.tools)

    def observation(self) -> dict[str, Any]:
        """The observation dict of model mode (``json.dumps`` it for the env's text space)."""
        return {
            "request_id": self.request_id,
            "api": self.api,
            "model": self.model,
            "messages": self.messages,
            "tools": self.tools,
            "sampling": self.sampling,
            "stream": self.stream,
        }


def read_request(
    path: str, body: bytes | dict[str, Any], *, query: str = "", request_id: str = ""
) -> ModelRequest | None:
    """Read one request a harness sent to the model endpoint.

    Args:
        path: The request path (``/v1/messages``, ``/v1beta/models/M:streamGenerateContent``).
        body: The body as received, or already parsed.
        query: The query string without ``?`` (Gemini's ``alt=sse`` lives there).
        request_id: The id to put in the observation.

    Returns:
        The request, or ``None`` when the path is no model call (``/``, a model list,
        token counts): the endpoint answers those itself and they never become a step.

    Raises:
        BadRequest: The path is a model call's but the body is none (see
            :class:`BadRequest`); the endpoint answers 400 with the message.
    """
    api = api_of(path)
    if api == "other":
        return None
    parsed = _parse_body(body)
    _check_conversation(api, parsed)
    stream = parsed.get("stream") is True
    sse = stream
    model = str(parsed.get("model") or "")
    if api == "gemini":
        stream = path.endswith(":streamGenerateContent")
        sse = stream and "alt=sse" in query.split("&")
        found = _GEMINI_MODEL.search(path)
        model = found.group(1) if found else model
    try:
        normal, wire_tools = _normalise(api, parsed)
        raw = {"api": api, "request": normal, "outcome": "pending"}
        messages, tools = exchange_messages(raw), exchange_tools(raw)
        sampling = _SAMPLING[api](parsed)
    except (AttributeError, TypeError, ValueError, KeyError, RecursionError) as exc:
        # A body of the right API with parts of the wrong shape (a string where a tool
        # call object belongs): no model call we can show the policy.
        raise BadRequest(
            f"the {api} request has a part of the wrong shape ({type(exc).__name__}: {exc})"
        ) from exc
    return ModelRequest(
        request_id=request_id,
        api=api,
        model=model,
        stream=stream,
        sse=sse,
        messages=messages,
        tools=tools,
        sampling=sampling,
        wire_tools=wire_tools,
        body=parsed,
        size=len(body) if isinstance(body, bytes) else len(json.dumps(parsed)),
    )


def _parse_body(body: bytes | dict[str, Any]) -> dict[str, Any]:
    """The body as a JSON object, parsed under the bounds; else :class:`BadRequest`."""
    if isinstance(body, dict):
        return body
    if not body.strip():
        raise BadRequest("the request body is empty; a model call is a JSON object")
    if len(body) > MAX_REQUEST_BYTES:
        raise BadRequest(f"the request body is over {MAX_REQUEST_BYTES} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(
            f"the request body is binary, not UTF-8 text (byte {exc.start}); "
            "a model call is a JSON object"
        ) from exc
    try:
        parsed = bounded_json.loads(text, MAX_REQUEST_DEPTH)
    except bounded_json.JSONBoundError as exc:
        raise BadRequest(f"the request body is {exc}") from exc
    except ValueError as exc:
        raise BadRequest(f"the request body is not JSON ({exc})") from exc
    if not isinstance(parsed, dict):
        raise BadRequest(
            f"the request body is a JSON {_json_kind(parsed)}; a model call is a JSON object"
        )
    return parsed


def _check_conversation(api: str, body: dict[str, Any]) -> None:
    """Refuse a conversation that is no list of message objects (it would read as none)."""
    key = _CONVERSATION[api]
    conversation = body.get(key)
    if api == "responses" and isinstance(conversation, str):
        return  # Responses takes a plain string as the one user message
    if not isinstance(conversation, list):
        got = "missing" if key not in body else f"a JSON {_json_kind(conversation)}"
        raise BadRequest(f"{key!r} must be a list of message objects, got {got}")
    for index, message in enumerate(conversation):
        if not isinstance(message, dict):
            raise BadRequest(
                f"{key!r} must be a list of message objects; item {index} is a JSON "
                f"{_json_kind(message)}"
            )


def _json_kind(value: Any) -> str:
    """The JSON name of a parsed value's type ("array", "string", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    kinds = ((dict, "object"), (list, "array"), (str, "string"), (int | float, "number"))
    return next((name for kind, name in kinds if isinstance(value, kind)), type(value).__name__)


# -- normalising Responses tool shapes ---------------------------------------------------------


def _normalise(api: str, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, WireTool]]:
    """A copy of ``body`` with flat tool names, and the flat name -> wire spelling map."""
    if api != "responses":
        return body, {}
    tools: list[Any] = []
    wire: dict[str, WireTool] = {}
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "namespace":
            space = str(tool.get("name") or "")
            for sub in tool.get("tools") or []:
                if isinstance(sub, dict) and sub.get("type") == "function":
                    flat = _flat(space, str(sub.get("name") or ""))
                    wire[flat] = WireTool(str(sub.get("name") or ""), space)
                    tools.append({**sub, "name": flat})
        elif tool.get("type") == "custom":
            name = str(tool.get("name") or "")
            wire[name] = WireTool(name, custom=True)
            tools.append(_custom_as_function(tool))
        else:
            tools.append(tool)
    items = body.get("input")
    if isinstance(items, list):
        items = [_flat_item(item) for item in items]
    return {**body, "tools": tools, "input": items}, wire


def _flat(namespace: str, name: str) -> str:
    return f"{namespace}__{name}" if namespace else name


def _custom_as_function(tool: dict[str, Any]) -> dict[str, Any]:
    grammar = tool.get("format") if isinstance(tool.get("format"), dict) else {}
    hint = "The whole input, as free text"
    if grammar and grammar.get("definition"):
        hint += f" in this {grammar.get('syntax', '')} grammar:\n{grammar['definition']}"
    return {
        "type": "function",
        "name": tool.get("name"),
        "description": tool.get("description") or "",
        "parameters": {
            "type": "object",
            "properties": {_CUSTOM_INPUT: {"type": "string", "description": hint}},
            "required": [_CUSTOM_INPUT],
        },
    }


def _flat_item(item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    if item.get("type") == "function_call" and item.get("namespace"):
        return {**item, "name": _flat(str(item["namespace"]), str(item.get("name") or ""))}
    if item.get("type") == "custom_tool_call":
        arguments = json.dumps({_CUSTOM_INPUT: item.get("input", "")})
        return {**item, "type": "function_call", "arguments": arguments}
    return item


# -- sampling, per wire API --------------------------------------------------------------------

# Common name -> the request's key, per API. Only keys the request carries are reported.
_ANTHROPIC_KEYS = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "stop": "stop_sequences",
    "tool_choice": "tool_choice",
    "thinking": "thinking",
}
_RESPONSES_KEYS = {
    "max_tokens": "max_output_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "tool_choice": "tool_choice",
    "parallel_tool_calls": "parallel_tool_calls",
    "reasoning": "reasoning",
    "top_logprobs": "top_logprobs",
}
_CHAT_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "stop": "stop",
    "seed": "seed",
    "n": "n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "logprobs": "logprobs",
    "top_logprobs": "top_logprobs",
    "tool_choice": "tool_choice",
    "parallel_tool_calls": "parallel_tool_calls",
    "reasoning": "reasoning_effort",
}
_GEMINI_KEYS = {
    "max_tokens": "maxOutputTokens",
    "temperature": "temperature",
    "top_p": "topP",
    "top_k": "topK",
    "stop": "stopSequences",
    "seed": "seed",
    "n": "candidateCount",
    "presence_penalty": "presencePenalty",
    "frequency_penalty": "frequencyPenalty",
    "thinking": "thinkingConfig",
}


def _pick(source: Any, keys: dict[str, str]) -> dict[str, Any]:
    if not isinstance(source, dict):
        return {}
    return {common: source[wire] for common, wire in keys.items() if wire in source}


def _anthropic_sampling(body: dict[str, Any]) -> dict[str, Any]:
    out = _pick(body, _ANTHROPIC_KEYS)
    output_config = body.get("output_config")
    if isinstance(output_config, dict) and "effort" in output_config:
        out["reasoning"] = {"effort": output_config["effort"]}
    return out


def _responses_sampling(body: dict[str, Any]) -> dict[str, Any]:
    return _pick(body, _RESPONSES_KEYS)


def _chat_sampling(body: dict[str, Any]) -> dict[str, Any]:
    out = _pick(body, _CHAT_KEYS)
    # max_completion_tokens replaced max_tokens; either may come.
    for key in ("max_completion_tokens", "max_tokens"):
        if key in body:
            out["max_tokens"] = body[key]
            break
    return out


def _gemini_sampling(body: dict[str, Any]) -> dict[str, Any]:
    config = body.get("generationConfig") or body.get("generation_config")
    out = _pick(config, _GEMINI_KEYS)
    tool_config = body.get("toolConfig")
    calling = tool_config.get("functionCallingConfig") if isinstance(tool_config, dict) else None
    if isinstance(calling, dict) and calling.get("mode"):
        out["tool_choice"] = calling["mode"]
    return out


_SAMPLING = {
    "anthropic": _anthropic_sampling,
    "responses": _responses_sampling,
    "chat": _chat_sampling,
    "gemini": _gemini_sampling,
}
