"""The answer side of model mode: a completion in the harness's own wire format.

:class:`AnswerWriter` writes one completion the way the real API would: Anthropic
Messages, OpenAI Responses, OpenAI Chat Completions or Gemini, as one JSON body or,
when the harness asked for a stream, as server-sent events (Gemini's
``streamGenerateContent`` without ``alt=sse``: a JSON array) with usage, stop reasons
and tool-call ids.

A slow policy is normal, so a stream can open before the completion exists:
:meth:`AnswerWriter.head` gives the events that may precede the content (Anthropic's
``message_start``, Responses' ``response.created`` and ``response.in_progress``, the
Chat Completions role chunk), :meth:`AnswerWriter.keepalive` the API's keep-alive
(Anthropic's ``ping`` event, an SSE comment line for the OpenAI APIs, a bare
newline for Gemini, whose SDK rejects comments), and
:meth:`AnswerWriter.body` the rest once the completion is known. ``token_ids``,
``logprobs`` and the policy's ``usage`` never reach the harness: the wire usage is
an estimate (``len // 4``) unless the caller passes one.

The event sequences follow ``tests/support/model_server.py``, which the real CLIs accept.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from gym_harness.model._formats import HEADS, ID_PREFIX, STREAMS, WHOLE, Event, Usage
from gym_harness.model.action import Completion, ToolCall
from gym_harness.model.request import ModelRequest, WireTool

__all__ = ["AnswerWriter", "Usage", "encode_answer", "error_body"]


_SSE_KEEPALIVE = b": keep-alive\n\n"


def encode_answer(
    request: ModelRequest, completion: Completion, usage: Usage | None = None
) -> tuple[str, bytes]:
    """The whole answer to ``request`` at once.

    Args:
        request: The request being answered.
        completion: The checked completion.
        usage: Token counts for the wire (``None``: :meth:`Usage.estimate`).

    Returns:
        ``(content_type, body)``.
    """
    writer = AnswerWriter(request)
    return writer.content_type, writer.head() + writer.body(completion, usage)


class AnswerWriter:
    """Writes one answer to one request, in pieces a server can send as they come.

    Call :meth:`head` (optional), any number of :meth:`keepalive`, then :meth:`body`
    once. The ids (message, response, items) are fixed at construction, so the head
    and the body agree.

    Args:
        request: The request being answered.
    """

    def __init__(self, request: ModelRequest) -> None:
        self.request = request
        self.created = int(time.time())
        self.answer_id = ID_PREFIX[request.api] + uuid.uuid4().hex[:24]
        self._seq = 0  # Responses' sequence_number
        self._head_sent = False

    @property
    def content_type(self) -> str:
        """The answer's ``Content-Type``."""
        return "text/event-stream" if self.request.sse else "application/json"

    def head(self) -> bytes:
        """The stream's opening events, which need no completion ("" unless an SSE stream)."""
        if not self.request.sse or self._head_sent:
            return b""
        self._head_sent = True
        return self._frame(HEADS[self.request.api](self))

    def keepalive(self) -> bytes:
        """Bytes that keep the stream alive without changing the answer ("" when none exist).

        Anthropic: a ``ping`` event (after :meth:`head`, as the real API sends it).
        Responses and Chat Completions: an SSE comment line. Gemini has no keep-alive
        event, and its SDK (``@google/genai``) takes only ``data:`` lines, failing the
        call on anything else left over, comments included; it skips whitespace before
        ``data:``, so a Gemini SSE stream gets a bare newline. Unstreamed answers and
        Gemini's JSON-array stream get nothing.
        """
        if not self.request.sse:
            return b""
        if self.request.api == "anthropic":
            return _sse("ping", {"type": "ping"})
        if self.request.api == "gemini":
            return b"\n"
        return _SSE_KEEPALIVE

    def body(self, completion: Completion, usage: Usage | None = None) -> bytes:
        """Everything after :meth:`head` (the head too, if it was not sent).

        Args:
            completion: The checked completion.
            usage: Token counts for the wire (``None``: :meth:`Usage.estimate`).
        """
        usage = usage or Usage.estimate(self.request, completion)
        api = self.request.api
        if not self.request.stream:
            return json.dumps(WHOLE[api](self, completion, usage)).encode()
        head = self.head()
        return head + self._frame(STREAMS[api](self, completion, usage))

    def fail(self, message: str) -> bytes:
        """End a stream that already started with an error the harness's SDK raises.

        Anthropic: an ``error`` event; Responses: a ``response.failed`` event; Chat
        Completions and Gemini SSE: a data chunk holding an ``error`` object (their SDKs
        raise on it). An answer that is no SSE stream has sent nothing yet: this returns
        :func:`error_body`, to be sent with status 500.

        Args:
            message: What went wrong.
        """
        api = self.request.api
        body = error_body(api, 500, message)
        if not self.request.sse:
            return json.dumps(body).encode()
        if api == "anthropic":
            return _sse("error", body)
        if api == "responses":
            failed = {
                "id": self.answer_id,
                "object": "response",
                "created_at": self.created,
                "status": "failed",
                "model": self.request.model,
                "output": [],
                "usage": None,
                "error": {"code": "server_error", "message": message},
                "incomplete_details": None,
            }
            data = {"type": "response.failed", "response": failed}
            return _sse("response.failed", {**data, "sequence_number": self.next_sequence()})
        return _sse(None, body)

    # -- framing -------------------------------------------------------------------------------

    def _frame(self, events: list[Event]) -> bytes:
        if self.request.sse:
            return b"".join(_sse(name, data) for name, data in events)
        # Gemini's streamGenerateContent without alt=sse: one JSON array of chunks.
        return ("[" + ",\r\n".join(json.dumps(data) for _, data in events) + "]").encode()

    def next_sequence(self) -> int:
        """The next Responses ``sequence_number`` of this stream (0, 1, ...)."""
        self._seq += 1
        return self._seq - 1

    def wire_tool(self, call: ToolCall) -> WireTool:
        """How ``call``'s tool is spelled on the wire (its namespace, whether freeform)."""
        return self.request.wire_tools.get(call.name) or WireTool(call.name)


def _sse(name: str | None, data: Any) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {name}\n" if name else "").encode() + f"data: {text}\n\n".encode()


def error_body(api: str, status: int, message: str) -> dict[str, Any]:
    """An error answer in ``api``'s own shape (what its clients parse and show).

    Args:
        api: The wire API.
        status: The HTTP status it goes with (Gemini repeats it in the body).
        message: What went wrong.
    """
    if api == "anthropic":
        kind = "overloaded_error" if status == 529 else "api_error"
        return {"type": "error", "error": {"type": kind, "message": message}}
    if api == "gemini":
        return {"error": {"code": status, "message": message, "status": "INTERNAL"}}
    return {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
