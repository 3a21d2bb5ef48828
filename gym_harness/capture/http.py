"""The model proxy's side facing the harness: one call's state and raw record, request
bodies read under a bound, error answers.

Threads: everything runs on the proxy's event loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from gym_harness.capture.secrets import Redactor
from gym_harness.utils import bounded_json

__all__ = [
    "KEPT_PREFIX",
    "Call",
    "StreamBroken",
    "add_logprobs",
    "error_payload",
    "read_body",
    "send_json",
]

#: How much of a body over the limit :func:`read_body` returns (for the refusal's record).
KEPT_PREFIX = 64 * 1024


class StreamBroken(Exception):
    """Raised inside an ASGI app to cut the harness's connection like the upstream cut ours."""


@dataclass(slots=True)
class Call:
    """One harness call in flight through the proxy (the proxy thread's own state)."""

    method: str
    path: str
    content: bytes  # the body as sent upstream
    added: bool  # the proxy added a logprobs request to it
    send: Any  # the ASGI send of the harness's connection
    started_at: float  # wall clock when the whole request had arrived
    t0: float  # perf_counter at the same moment
    redact: Redactor  # the real key and the proxy token this call was let in with
    relay: Redactor  # what to take out of the answer: the key, and the token if it went up
    cap: int  # each recorded body is kept up to this many bytes
    disconnect: asyncio.Future[Any] | None = None  # resolves when the harness hangs up
    tokens: tuple[str, ...] = ()  # the token fields the proxy added (capture_tokens)

    def record(
        self,
        status: int,
        outcome: str,
        error: str,
        answer: tuple[str, bytes] | None,
        ttfb: float | None = None,
        *,
        request_bytes: int | None = None,
        answer_bytes: int | None = None,
        cut: bool = False,
    ) -> dict[str, Any]:
        """The raw facts of the finished exchange, capped and redacted, for ``assemble``.

        Parsing waits for ``records()``/``drain()`` in the caller's thread, so it costs
        the harness's call nothing.
        """
        total = time.perf_counter() - self.t0
        cap, content = self.cap, self.content
        request = self.redact.scrub(content[:cap] if len(content) > cap else content)
        answer_size = 0 if answer is None else len(answer[1])
        raw: dict[str, Any] = {
            "method": self.method,
            "path": self.path,
            "request": request,
            "logprobs_added": self.added,
            "tokens_asked": bool(self.tokens),
            "status": status,
            "outcome": outcome,
            "error": self.redact.scrub(error.encode()).decode() if error else "",
            "answer": answer,
            "started_at": self.started_at,
            "ttfb_s": ttfb,
            "total_s": total,
            "request_bytes": len(content) if request_bytes is None else request_bytes,
            "answer_bytes": answer_size if answer_bytes is None else answer_bytes,
        }
        raw["truncated"] = (
            cut
            or raw["request_bytes"] > min(len(content), cap)
            or raw["answer_bytes"] > answer_size
        )
        return raw


async def read_body(
    receive: Any, headers: list[tuple[str, str]], limit: int
) -> tuple[bytes, int, str]:
    """Read an ASGI request body, never holding more than ``limit`` bytes of it.

    A body that would pass ``limit`` is dropped as soon as it does, chunked or not: what
    was read so far is freed, and only its first :data:`KEPT_PREFIX` bytes are returned.
    A whole body is joined once at the end (one chunk is returned as it came).

    Args:
        receive: The ASGI receive callable.
        headers: The request's headers (lower-case names).
        limit: The largest body accepted.

    Returns:
        ``(body, size, problem)``: ``problem`` is ``""`` (``body`` is whole),
        ``"too_large"`` (``size`` is the declared length, or what had arrived when the
        stream passed ``limit``; ``body`` at most the first :data:`KEPT_PREFIX` bytes)
        or ``"client_closed"`` (the harness hung up before the end; never forward half
        a request).
    """
    declared = next((v for k, v in headers if k == "content-length"), "")
    if declared.isdigit() and int(declared) > limit:  # refused before a byte is read
        return b"", int(declared), "too_large"
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks), size, "client_closed"
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:  # the chunk that passes the limit is never kept
            return _prefix([*chunks, chunk], KEPT_PREFIX), size, "too_large"
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body"):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks), size, ""


def _prefix(chunks: list[bytes], length: int) -> bytes:
    """The first ``length`` bytes of ``chunks`` joined, copying no more than those."""
    out: list[bytes] = []
    for chunk in chunks:
        if length <= 0:
            break
        out.append(chunk[:length])
        length -= len(out[-1])
    return b"".join(out)


def add_logprobs(content: bytes) -> tuple[bytes, bool]:
    """A Chat Completions body asking for logprobs, and whether it had to be changed."""
    try:
        body = bounded_json.loads(content)  # the harness wrote it: bounded
    except ValueError:  # not JSON, or nested too deep: it goes up as it came
        return content, False
    if not isinstance(body, dict) or body.get("logprobs") is True:
        return content, False
    body["logprobs"] = True
    return json.dumps(body).encode(), True


def error_payload(message: str) -> dict[str, Any]:
    """The JSON body of an answer the proxy makes itself (not the upstream's)."""
    return {
        "error": {"type": "gym_harness_proxy_error", "message": f"gym_harness proxy: {message}"}
    }


async def send_json(send: Any, status: int, payload: dict[str, Any], close: bool = False) -> None:
    """Answer with ``payload`` as JSON; ``close`` ends the connection (an unread body stays so)."""
    data = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})
