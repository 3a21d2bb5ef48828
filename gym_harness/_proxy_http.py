"""The model proxy's side facing the harness: request bodies read under a bound, error answers.

Threads: everything runs on the proxy's event loop.
"""

from __future__ import annotations

import json
from typing import Any

from gym_harness import _json

__all__ = ["add_logprobs", "error_payload", "read_body", "send_json"]


async def read_body(
    receive: Any, headers: list[tuple[str, str]], limit: int
) -> tuple[bytes, int, str]:
    """Read an ASGI request body, never holding much more than ``limit`` bytes.

    Args:
        receive: The ASGI receive callable.
        headers: The request's headers (lower-case names).
        limit: The largest body accepted.

    Returns:
        ``(body, size, problem)``: ``problem`` is ``""`` (``body`` is whole),
        ``"too_large"`` (``size`` is the declared length, or what was read when the
        stream passed ``limit``; ``body`` what was read) or ``"client_closed"`` (the
        harness hung up before the end; never forward half a request).
    """
    declared = next((v for k, v in headers if k == "content-length"), "")
    if declared.isdigit() and int(declared) > limit:  # refused before a byte is read
        return b"", int(declared), "too_large"
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return bytes(body), len(body), "client_closed"
        body += message.get("body", b"")
        if len(body) > limit:
            return bytes(body), len(body), "too_large"
        if not message.get("more_body"):
            return bytes(body), len(body), ""


def add_logprobs(content: bytes) -> tuple[bytes, bool]:
    """A Chat Completions body asking for logprobs, and whether it had to be changed."""
    try:
        body = _json.loads(content)  # the harness wrote it: bounded
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
