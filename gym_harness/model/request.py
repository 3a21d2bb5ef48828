"""The request side of model mode: a harness's raw model call as the policy's observation.

:func:`read_request` takes what the loopback endpoint received (path, query, body
bytes) and returns a :class:`ModelRequest`: the wire facts the answer needs (api,
model, stream, tool names as the wire spells them) and the observation the policy sees
(:meth:`ModelRequest.observation`, and its JSON text :meth:`ModelRequest.observation_text`),
whose ``messages`` and ``tools`` are those of
:func:`gym_harness.records.chat_format.exchange_messages` and ``exchange_tools``.
Responses tool names are made flat first (see :mod:`gym_harness.model._shapes`).

:class:`RequestReader` reads an episode's calls one after another: each from what the
call before it left (:mod:`gym_harness.model._reader`), so a long conversation costs
about what its new messages cost. The result is the same as :func:`read_request`'s.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from gym_harness.model._reader import (
    MAX_REQUEST_BYTES,
    MAX_REQUEST_DEPTH,
    BadRequest,
    BodyReader,
    Reading,
    read_parsed,
)
from gym_harness.model._shapes import SAMPLING, WireTool
from gym_harness.records.exchanges import api_of

__all__ = [
    "MAX_REQUEST_BYTES",
    "MAX_REQUEST_DEPTH",
    "BadRequest",
    "ModelRequest",
    "RequestReader",
    "WireTool",
    "read_request",
]

_GEMINI_MODEL = re.compile(r"/models/([^/:]+):")


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
    #: The JSON text of each message and of the tools, when the reader kept them.
    pieces: tuple[list[str], str] | None = field(default=None, repr=False, compare=False)

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

    def observation_text(self) -> str:
        """``json.dumps(self.observation(), ensure_ascii=False)``, joined from kept pieces."""
        if self.pieces is None or len(self.pieces[0]) != len(self.messages):
            return json.dumps(self.observation(), ensure_ascii=False)
        texts, tools_text = self.pieces
        dumps = _dumps
        return (
            f'{{"request_id": {dumps(self.request_id)}, "api": {dumps(self.api)}, '
            f'"model": {dumps(self.model)}, "messages": [{", ".join(texts)}], '
            f'"tools": {tools_text}, "sampling": {dumps(self.sampling)}, '
            f'"stream": {dumps(self.stream)}}}'
        )


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
    return RequestReader().read(path, body, query=query, request_id=request_id)


class RequestReader:
    """Reads one endpoint's model calls, each from what the call before it left.

    Threads: the endpoint's server loop only.
    """

    def __init__(self) -> None:
        self._bodies = BodyReader()

    def kept(self) -> tuple[int, int]:
        """How many earlier bodies are kept to read on from, and their characters."""
        return self._bodies.kept()

    def read(
        self,
        path: str,
        body: bytes | dict[str, Any],
        *,
        query: str = "",
        request_id: str = "",
        episode: int = 0,
    ) -> ModelRequest | None:
        """:func:`read_request`, from the bases of the same ``episode`` (a new number
        forgets those of the one before)."""
        api = api_of(path)
        if api == "other":
            return None
        if isinstance(body, dict):
            reading: Reading = read_parsed(api, body)
            size = len(json.dumps(body))
        else:
            reading, size = self._bodies.read(api, body, episode), len(body)
        parsed = reading.body
        stream = parsed.get("stream") is True
        sse = stream
        model = str(parsed.get("model") or "")
        if api == "gemini":
            stream = path.endswith(":streamGenerateContent")
            sse = stream and "alt=sse" in query.split("&")
            found = _GEMINI_MODEL.search(path)
            model = found.group(1) if found else model
        try:
            sampling = SAMPLING[api](parsed)
        except (AttributeError, TypeError, ValueError, KeyError) as exc:
            raise BadRequest(
                f"the {api} request has a part of the wrong shape ({type(exc).__name__}: {exc})"
            ) from exc
        return ModelRequest(
            request_id=request_id,
            api=api,
            model=model,
            stream=stream,
            sse=sse,
            messages=reading.messages,
            tools=reading.tools,
            sampling=sampling,
            wire_tools=reading.wire_tools,
            body=parsed,
            size=size,
            pieces=(reading.texts, reading.tools_text),
        )


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
