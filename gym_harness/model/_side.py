"""Side calls forwarded upstream: model mode with ``upstream=`` set.

The env then also runs the capture proxy (:class:`~gym_harness.capture.proxy.ModelProxy`),
which swaps its per-episode token for the real key, redacts, bounds and records each
exchange. The endpoint hands a side call's raw request to that proxy over loopback,
with the proxy's token in place of its own, and relays the answer to the harness as
it arrives (SSE included), byte for byte.

Threads: :func:`answer_side` runs on the endpoint's server loop; :class:`SideUpstream`
is immutable (the caller's thread swaps the endpoint's whole value each episode).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gym_harness.capture.http import StreamBroken, send_json
from gym_harness.capture.secrets import swap_credentials
from gym_harness.model._exchange import write_whole
from gym_harness.model.action import Completion
from gym_harness.model.answer import AnswerWriter, error_body

if TYPE_CHECKING:
    from gym_harness.model.request import ModelRequest

__all__ = ["MARGIN_S", "SideUpstream", "answer_side", "forward", "is_side", "via_proxy"]

logger = logging.getLogger(__name__)

# Hop-by-hop and framing headers: the endpoint's server frames the relayed body itself.
_SKIP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length"})
#: Extra patience over the proxy's own upstream timeout, so the proxy's 504 comes first.
MARGIN_S = 30.0
_CONNECT_TIMEOUT_S = 10.0  # the proxy is on loopback

#: ``record(status, error)``: keep the side call's record (before its last byte goes out).
Record = Callable[[int, str], None]


@dataclass(frozen=True)
class SideUpstream:
    """Where an episode's side calls go.

    Attributes:
        base_url: The capture proxy's origin (``http://127.0.0.1:PORT``).
        token: The proxy's token for this episode (it stands in for the real key).
        timeout_s: Longest silence from the proxy before the call is given up.
    """

    base_url: str
    token: str
    timeout_s: float


def via_proxy(base_url: str, token: str, proxy_timeout_s: float) -> SideUpstream:
    """Side calls through the capture proxy at ``base_url``: waited on past the proxy's own
    upstream timeout (``proxy_timeout_s``), so the proxy's 504 comes first."""
    return SideUpstream(base_url, token, proxy_timeout_s + MARGIN_S)


def is_side(
    side_call: Callable[[ModelRequest, Mapping[str, str]], bool],
    request: ModelRequest,
    headers: Mapping[str, str],
) -> bool:
    """The adapter's ``side_call`` verdict on ``request``; a call it raises on is a main
    call (a step, not lost), and the traceback is logged."""
    try:
        return bool(side_call(request, headers))
    except Exception:
        logger.warning("model endpoint: side_call raised; treating the call as main", exc_info=True)
        return False


async def answer_side(
    send: Any,
    request: ModelRequest,
    scope: Any,
    body: bytes,
    *,
    side: SideUpstream | None,
    side_answer: str,
    own_token: str,
    record: Callable[[Completion | None, int, str], None],
) -> None:
    """Answer a side call (``model_calls="main"``) and have it recorded.

    It gets ``side_answer`` at once, or, with ``side`` set, the answer of the upstream
    (:func:`forward`; the record then has its status and no completion).

    Args:
        send: The ASGI send of the harness's exchange.
        request: The side call, read.
        scope: The ASGI scope of the harness's request; ``body`` its whole body.
        side: Where this episode's side calls go, if upstream.
        side_answer: The fixed answer otherwise.
        own_token: The endpoint's key (replaced by the proxy's token when forwarded).
        record: ``record(completion, status, error)`` keeps the call's record, once,
            before its last byte goes out.
    """
    completion = None if side else Completion(content=side_answer)
    if side is None:
        assert completion is not None
        record(completion, 200, "")
        await write_whole(send, AnswerWriter(request), completion)
        return
    await forward(
        send, side, own_token, scope, body, request.api,
        lambda status, error: record(None, status, error),
    )  # fmt: skip


async def forward(
    send: Any, side: SideUpstream, own_token: str, scope: Any, body: bytes, api: str, record: Record
) -> None:
    """Forward one side call to the proxy and relay its answer; never raises for a failed leg.

    Args:
        send: The ASGI send of the harness's exchange.
        side: Where it goes.
        own_token: The endpoint's key, replaced by ``side.token`` wherever the harness put it.
        scope: The ASGI scope of the harness's request.
        body: Its whole body.
        api: Its wire API (for the shape of an error answer).
        record: Called once with the status the harness gets, and why it failed, if it did.
    """
    from gym_harness.capture.upstream import UpstreamError, UpstreamPool

    method, path = scope["method"], scope["path"]
    query = scope["query_string"].decode("latin-1")
    headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]]
    outgoing, query, _ = swap_credentials(own_token, side.token, headers, query, method, path)
    target = (scope.get("raw_path") or path.encode()).decode("latin-1")
    target += f"?{query}" if query else ""
    # A pool per call: side calls are rare, and nothing is left open between them.
    pool = UpstreamPool(
        side.base_url, timeout_s=side.timeout_s, connect_timeout_s=_CONNECT_TIMEOUT_S
    )
    status = 0
    try:
        response = await pool.request(method, target, outgoing, body)
        status = response.status
        try:
            head = [(k, v) for k, v in response.headers if k not in _SKIP]
            await send({"type": "http.response.start", "status": status, "headers": head})
            while (chunk := await response.read_some()) is not None:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            await response.aclose()
    except UpstreamError as exc:
        why = f"side call not forwarded: the capture proxy failed ({exc})"
        if not status:  # nothing sent yet: the harness gets an API error
            record(502, why)
            await send_json(send, 502, error_body(api, 502, why))
            return
        record(status, why)
        raise StreamBroken(why) from exc  # uvicorn closes the harness's connection
    finally:
        await pool.aclose()
    record(status, "" if status < 400 else f"the upstream answered {status}")
    await send({"type": "http.response.body", "body": b"", "more_body": False})
