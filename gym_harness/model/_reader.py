"""Reading model-call bodies, each from what the episode's call before it left.

A harness resends its whole conversation with every model call, so by the hundredth
message most of a body is what the env already parsed and converted. :class:`BodyReader`
keeps the last few bodies it read (their *bases*) and reads the next one from the
longest base whose text it starts with:

* **Parse.** The body's text up to the end of the base's last conversation item must be
  the base's, character for character (one ``str.startswith``); only the rest is parsed,
  item by item with the standard library's own scanner. A member after the conversation
  (``tools``, ``model``) whose text equals the base's takes the base's value, unparsed.
  A body that shares no base's prefix (the first call, compaction, a rewritten system
  prompt) is parsed whole: the result is ``json.loads``'s either way.
* **Convert.** The chat messages (:class:`~gym_harness.records.chat_format.Conversation`)
  go on from the base's when the request's head (its system prompt) is the base's;
  the tools are the base's when the request offers the same tools.
* **Serialise.** Each message's JSON text is kept beside it, so the observation's text
  is joined from pieces, not re-serialised.

Bodies of one conversation then share their parsed prefix objects, which makes
comparing a retry with its call (:mod:`gym_harness.model.calls`) mostly identity checks.
Bounds: at most :data:`MAX_BASES` bases and :data:`MAX_BASE_CHARS` characters of kept
text; depth and size as :func:`decode_body` says.

Threads: one reader belongs to one endpoint's server loop.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gym_harness.model._shapes import WireTool, flat_item, flat_tools
from gym_harness.records.chat_format import (
    CONVERSATION_KEYS,
    HEAD_KEYS,
    Conversation,
    exchange_tools,
)
from gym_harness.utils import bounded_json

__all__ = [
    "MAX_BASES",
    "MAX_BASE_CHARS",
    "MAX_REQUEST_BYTES",
    "MAX_REQUEST_DEPTH",
    "BadRequest",
    "BodyReader",
    "Reading",
    "decode_body",
    "read_parsed",
]

#: Largest request body read (a long agent conversation is a few MB; this bounds memory).
MAX_REQUEST_BYTES = 64 * 1024 * 1024
#: Deepest nesting of a request body's JSON. Real requests stay far below it (tool schemas,
#: and tool-call arguments, which an action may nest 64 deep: ``ActionLimits.max_depth``).
MAX_REQUEST_DEPTH = 256
#: Most bodies a reader keeps to read the next one from (main calls and side calls
#: interleave: each conversation keeps its own).
MAX_BASES = 4
#: Most characters of body text the kept bases hold together.
MAX_BASE_CHARS = 32 * 1024 * 1024

_WS = re.compile(r"[ \t\n\r]*")
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


class BadRequest(ValueError):
    """A model call whose body is no request of its API (the endpoint answers 400).

    The message says what is wrong: the body is empty, not UTF-8, not JSON, nested
    deeper than :data:`MAX_REQUEST_DEPTH`, no JSON object, or its conversation
    (``messages``, ``input``, ``contents``) is no list of message objects.
    """


class _Irregular(Exception):
    """The scanner met what it does not follow; ``json.loads`` gives the verdict."""


@dataclass
class Reading:
    """One body, read: the parsed object and what the observation is made of.

    Attributes:
        body: The body as ``json.loads`` would give it.
        messages: The conversation as chat messages.
        texts: The JSON text of each message (``json.dumps(m, ensure_ascii=False)``).
        tools: The offered function tools as OpenAI schemas.
        tools_text: Their JSON text.
        wire_tools: Flat tool name -> how the wire spells it (Responses).
        reused: How many conversation items came from a base unparsed.
    """

    body: dict[str, Any]
    messages: list[dict[str, Any]]
    texts: list[str]
    tools: list[dict[str, Any]]
    tools_text: str
    wire_tools: dict[str, WireTool]
    reused: int = 0


@dataclass
class _Layout:
    """Where a body's parts lie in its text (made while scanning it)."""

    prefix_end: int = -1  # after the conversation's last item (or its '['); -1: no array
    head: list[tuple[str, Any]] = field(default_factory=list)  # members before it
    after: dict[str, tuple[str, Any]] = field(default_factory=dict)  # key -> (text, value)
    items: list[Any] = field(default_factory=list)
    reused: int = 0
    twice: bool = False  # the conversation's key came twice: no base from this body


@dataclass
class _Base:
    """What one read body leaves for the next."""

    api: str
    prefix: str
    layout: _Layout
    heads: tuple[Any, ...]
    conversation: Conversation
    texts: list[str]
    tools_raw: Any
    tools: list[dict[str, Any]]
    tools_text: str
    wire_tools: dict[str, WireTool]

    @property
    def chars(self) -> int:
        return len(self.prefix) + sum(len(text) for text, _ in self.layout.after.values())


def decode_body(body: bytes) -> str:
    """The body's text; :class:`BadRequest` for an empty, oversized or non-UTF-8 body."""
    if not body.strip():
        raise BadRequest("the request body is empty; a model call is a JSON object")
    if len(body) > MAX_REQUEST_BYTES:
        raise BadRequest(f"the request body is over {MAX_REQUEST_BYTES} bytes")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(
            f"the request body is binary, not UTF-8 text (byte {exc.start}); "
            "a model call is a JSON object"
        ) from exc


def parse_whole(text: str) -> dict[str, Any]:
    """The body as a JSON object, parsed under the bounds; else :class:`BadRequest`."""
    try:
        parsed = bounded_json.loads(text, MAX_REQUEST_DEPTH)
    except bounded_json.JSONBoundError as exc:
        raise BadRequest(f"the request body is {exc}") from exc
    except ValueError as exc:
        raise BadRequest(f"the request body is not JSON ({exc})") from exc
    if not isinstance(parsed, dict):
        raise BadRequest(
            f"the request body is a JSON {json_kind(parsed)}; a model call is a JSON object"
        )
    return parsed


def json_kind(value: Any) -> str:
    """The JSON name of a parsed value's type ("array", "string", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    kinds = ((dict, "object"), (list, "array"), (str, "string"), (int | float, "number"))
    return next((name for kind, name in kinds if isinstance(value, kind)), type(value).__name__)


def check_conversation(api: str, body: dict[str, Any], start: int = 0) -> None:
    """Refuse a conversation that is no list of message objects (it would read as none).

    Items before ``start`` were checked before (they are a base's).
    """
    key = CONVERSATION_KEYS[api]
    conversation = body.get(key)
    if api == "responses" and isinstance(conversation, str):
        return  # Responses takes a plain string as the one user message
    if not isinstance(conversation, list):
        got = "missing" if key not in body else f"a JSON {json_kind(conversation)}"
        raise BadRequest(f"{key!r} must be a list of message objects, got {got}")
    for index in range(start, len(conversation)):
        message = conversation[index]
        if not isinstance(message, dict):
            raise BadRequest(
                f"{key!r} must be a list of message objects; item {index} is a JSON "
                f"{json_kind(message)}"
            )


class BodyReader:
    """Reads the bodies of one episode's model calls, each from the bases before it.

    Threads: the endpoint's server loop only.
    """

    def __init__(self) -> None:
        self._bases: list[_Base] = []  # most recent last
        self._episode = 0

    def read(self, api: str, body: bytes, episode: int) -> Reading:
        """Read one body of ``api`` (``"chat"``, ...), sent in ``episode``.

        A new ``episode`` number forgets the bases of the one before.

        Raises:
            BadRequest: The body is no request of its API (see :class:`BadRequest`).
        """
        if episode != self._episode:
            self._bases, self._episode = [], episode
        text = decode_body(body)
        key = CONVERSATION_KEYS[api]
        base = self._base_for(api, text)
        try:
            parsed, layout = _scan(text, key, base)
        except (_Irregular, StopIteration, ValueError, IndexError):
            parsed, layout, base = parse_whole(text), None, None
        if layout is not None and layout.twice:  # the conversation is the key's last value
            layout.reused, base = 0, None
        check_conversation(api, parsed, layout.reused if layout else 0)
        reading, kept = _guarded(api, parsed, layout, base)
        if layout is not None and layout.prefix_end >= 0 and kept is not None:
            self._keep(_Base(prefix=text[: layout.prefix_end], layout=layout, **kept))
        return reading

    def kept(self) -> tuple[int, int]:
        """How many bases are kept, and how many characters of text they hold."""
        return len(self._bases), sum(b.chars for b in self._bases)

    def _base_for(self, api: str, text: str) -> _Base | None:
        """The base with the longest prefix that ``text`` starts with."""
        best: _Base | None = None
        for base in self._bases:
            longer = best is None or len(base.prefix) > len(best.prefix)
            if longer and base.api == api and text.startswith(base.prefix):
                best = base
        return best

    def _keep(self, new: _Base) -> None:
        if new.chars > MAX_BASE_CHARS:
            return  # too large to keep: the next call is read whole
        # A base the new one starts with is one it extends: it is of no more use.
        self._bases = [b for b in self._bases if not new.prefix.startswith(b.prefix)]
        self._bases.append(new)
        while len(self._bases) > MAX_BASES or sum(b.chars for b in self._bases) > MAX_BASE_CHARS:
            self._bases.pop(0)


def read_parsed(api: str, body: dict[str, Any]) -> Reading:
    """Read a body already parsed (whole: there is no text to go on from)."""
    check_conversation(api, body)
    return _guarded(api, body, None, None)[0]


def _guarded(
    api: str, body: dict[str, Any], layout: _Layout | None, base: _Base | None
) -> tuple[Reading, dict[str, Any] | None]:
    try:
        return _convert(api, body, layout, base)
    except (AttributeError, TypeError, ValueError, KeyError, RecursionError) as exc:
        # A body of the right API with parts of the wrong shape (a string where a tool
        # call object belongs): no model call we can show the policy.
        raise BadRequest(
            f"the {api} request has a part of the wrong shape ({type(exc).__name__}: {exc})"
        ) from exc


def _convert(
    api: str, body: dict[str, Any], layout: _Layout | None, base: _Base | None
) -> tuple[Reading, dict[str, Any] | None]:
    """The reading of a parsed body, and what its base keeps (``None``: keep none)."""
    items = body.get(CONVERSATION_KEYS[api])
    heads = tuple(body.get(k) for k in HEAD_KEYS[api])
    resumed = (
        base is not None
        and layout is not None
        and layout.reused > 0
        and isinstance(items, list)
        and all(map(operator.is_, heads, base.heads))  # the base's values, unparsed
    )
    if resumed:
        assert base is not None and layout is not None and isinstance(items, list)
        conversation = base.conversation.copy()
        new = items[layout.reused :]
        conversation.extend([flat_item(i) for i in new] if api == "responses" else new)
        texts = _texts(conversation.messages, base.conversation.messages, base.texts)
    else:
        request = body
        if api == "responses" and isinstance(items, list):
            request = {**body, "input": [flat_item(i) for i in items]}
        conversation = Conversation.of(api, request)
        texts = [_dumps(m) for m in conversation.messages]
    raw_tools = body.get("tools")
    if base is not None and raw_tools is base.tools_raw:
        tools, tools_text, wire = base.tools, base.tools_text, base.wire_tools
    else:
        wire = {}
        normal = body
        if api == "responses":
            flat, wire = flat_tools(raw_tools)
            normal = {**body, "tools": flat}
        tools = exchange_tools({"api": api, "request": normal})
        tools_text = _dumps(tools)
    reading = Reading(
        body, conversation.messages, texts, tools, tools_text, wire,
        layout.reused if resumed and layout else 0,
    )  # fmt: skip
    kept = {
        "api": api, "heads": heads, "conversation": conversation.copy(), "texts": texts,
        "tools_raw": raw_tools, "tools": tools, "tools_text": tools_text, "wire_tools": wire,
    }  # fmt: skip
    return reading, kept if isinstance(items, list) else None


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _texts(messages: list[Any], before: list[Any], texts: list[str]) -> list[str]:
    """Each message's text: the base's where the message is the base's own."""
    n = len(before)
    if all(map(operator.is_, messages[:n], before)):
        return [*texts, *map(_dumps, messages[n:])]
    return [texts[i] if i < n and m is before[i] else _dumps(m) for i, m in enumerate(messages)]


# -- the scanner -------------------------------------------------------------------------------


def _ws(text: str, i: int) -> int:
    return _WS.match(text, i).end()  # type: ignore[union-attr]  # matches the empty string


def _scan(text: str, key: str, base: _Base | None) -> tuple[dict[str, Any], _Layout]:
    """Parse a body whose top level is one object, from ``base`` where it starts with it.

    Raises:
        _Irregular, StopIteration, ValueError, IndexError: Not a JSON object this follows
            (the caller then lets ``json.loads`` give its verdict).
    """
    if base is None:
        if bounded_json.nesting(text, MAX_REQUEST_DEPTH) > MAX_REQUEST_DEPTH:
            raise _Irregular("too deep")
        return _scan_from(text, key, _ws(text, 0), None)
    # The base's items nest at depth 2 (the body, the conversation); only what is new is checked.
    start = len(base.prefix)
    if bounded_json.nesting(text[start:], MAX_REQUEST_DEPTH) + 2 > MAX_REQUEST_DEPTH:
        raise _Irregular("too deep")
    return _scan_from(text, key, start, base)


def _scan_from(text: str, key: str, i: int, base: _Base | None) -> tuple[dict[str, Any], _Layout]:
    layout = _Layout()
    parsed: dict[str, Any] = {}
    if base is None:
        if text[i] != "{":
            raise _Irregular("not an object")
        i = _ws(text, i + 1)
        if text[i] == "}":
            return _end(text, i + 1, parsed, layout)
    else:  # inside the conversation, right after the base's last item
        layout.head = base.layout.head
        parsed.update(base.layout.head)
        layout.items = list(base.layout.items)
        layout.reused = len(layout.items)
        i = _array(text, i, layout, first=not layout.items)
        parsed[key] = layout.items
        i = _ws(text, i)
        if text[i] == "}":
            return _end(text, i + 1, parsed, layout)
        if text[i] != ",":
            raise _Irregular("expected , or }")
        i = _ws(text, i + 1)
    after = base.layout.after if base is not None else {}
    while True:
        if text[i] != '"':
            raise _Irregular("expected a key")
        name, i = _SCAN(text, i)
        i = _ws(text, i)
        if text[i] != ":":
            raise _Irregular("expected :")
        i = _ws(text, i + 1)
        if name == key and text[i] == "[" and layout.prefix_end == -1 and not layout.twice:
            i = _array(text, i + 1, layout, first=True)
            value: Any = layout.items
        else:
            start, seen = i, after.get(name)
            if seen is not None and text.startswith(seen[0], i) and _ends(text, i + len(seen[0])):
                value, i = seen[1], i + len(seen[0])
            else:
                value, i = _SCAN(text, i)
            layout.twice = layout.twice or name == key
            if layout.prefix_end >= 0:
                layout.after[name] = (text[start:i], value)
            else:
                layout.head.append((name, value))
        parsed[name] = value
        i = _ws(text, i)
        if text[i] == "}":
            return _end(text, i + 1, parsed, layout)
        if text[i] != ",":
            raise _Irregular("expected , or }")
        i = _ws(text, i + 1)


def _ends(text: str, i: int) -> bool:
    """A member's value ends at ``i`` (what follows is whitespace, then ``,`` or ``}``)."""
    i = _ws(text, i)
    return i < len(text) and text[i] in ",}"


def _array(text: str, i: int, layout: _Layout, *, first: bool) -> int:
    """Parse conversation items from ``i`` to the array's ``]``; return the index after it."""
    layout.prefix_end = i
    while True:
        i = _ws(text, i)
        if text[i] == "]":
            return i + 1
        if not first:
            if text[i] != ",":
                raise _Irregular("expected , or ]")
            i = _ws(text, i + 1)
        item, i = _SCAN(text, i)
        layout.items.append(item)
        layout.prefix_end, first = i, False


def _end(
    text: str, i: int, parsed: dict[str, Any], layout: _Layout
) -> tuple[dict[str, Any], _Layout]:
    if _ws(text, i) != len(text):
        raise _Irregular("extra data")
    if layout.twice:
        layout.prefix_end = -1
    return parsed, layout
