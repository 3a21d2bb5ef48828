"""The model endpoint's front door: one HTTP request's body read and checked, or refused.

:func:`take_in` reads the body of a request that presented the episode's key, under the
body bound (413 while reading, chunked bodies too), and reads it as a model call
(:class:`~gym_harness.model.request.RequestReader`). What is no model call of a model
path (a body that is empty, binary, not JSON, nested too deep, no object, or whose
messages are no list of message objects) gets 400 with the reason; what is no model
call at all (``HEAD /``, model lists, token counts) gets :func:`other_answer`.

Threads: the endpoint's server loop only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gym_harness.capture.http import read_body, send_json
from gym_harness.model._exchange import send_other
from gym_harness.model.answer import error_body
from gym_harness.model.request import BadRequest, ModelRequest, RequestReader
from gym_harness.records.exchanges import api_of

__all__ = ["Refused", "take_in", "unauthorized"]

#: ``refused(status, why)``: keep the record of a request refused before it was read.
Refused = Callable[[int, str], None]


async def take_in(
    receive: Any,
    send: Any,
    scope: Any,
    headers: list[tuple[str, str]],
    *,
    limit: int,
    request_id: str,
    refused: Refused,
    reader: RequestReader,
    episode: int,
) -> tuple[ModelRequest, bytes] | None:
    """Read one request's body and the model call it holds.

    Args:
        receive: The ASGI receive callable; ``send`` and ``scope`` likewise.
        headers: The request's headers (lower-case names).
        limit: The largest body accepted (``max_request_bytes``).
        request_id: The id the call gets.
        refused: Records a 413 or a 400 before it is answered.
        reader: The endpoint's reader; ``episode`` the key's episode number.

    Returns:
        The model call and its body; ``None`` when the request was answered here (or the
        harness hung up before its body was whole).
    """
    method, path = scope["method"], scope["path"]
    body, size, problem = await read_body(receive, headers, limit)
    if problem == "client_closed":
        return None
    if problem:
        why = f"request body of {size} bytes or more is over the endpoint's limit of "
        why += f"{limit} bytes (ModelEndpoint max_request_bytes)"
        refused(413, why)
        await send_json(send, 413, error_body(api_of(path), 413, why), close=True)
        return None
    if method != "POST":
        await send_other(send, method, path)
        return None
    query = scope["query_string"].decode("latin-1")
    try:
        request = reader.read(path, body, query=query, request_id=request_id, episode=episode)
    except BadRequest as exc:
        refused(400, str(exc))
        await send_json(send, 400, error_body(api_of(path), 400, str(exc)))
        return None
    if request is None:
        await send_other(send, method, path)
        return None
    return request, body


async def unauthorized(send: Any, path: str) -> None:
    """Answer a request without the episode's key (401)."""
    message = "missing or wrong model endpoint key; send the key rotate_token() gave"
    message += " (a key stops working when its episode ends)"
    await send_json(send, 401, error_body(api_of(path), 401, message))
