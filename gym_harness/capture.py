"""ModelProxy: a loopback pass-through that records every model call a harness makes.

The harness talks to ``ModelProxy.base_url`` instead of its model API, with a
per-episode proxy token in place of the API key. The proxy swaps that token
for the real key (which never leaves the env process), forwards the request to
the upstream, and passes the answer back byte for byte as it arrives, SSE
streams included. Per request it keeps a :class:`ModelExchange` (see
``gym_harness.capture_records``, whose names are importable from here too).

Wire APIs understood for recording (anything else is still forwarded):
OpenAI Chat Completions, OpenAI Responses, Anthropic Messages, Gemini.

Threads: the caller's thread owns the lifecycle (``start``/``stop``/
``rotate_token``/``drain``). The proxy thread owns one asyncio loop running
uvicorn and the upstream connections (``gym_harness._upstream``); it appends records
behind a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hmac
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode

from gym_harness import _json
from gym_harness._loopback import LoopbackServer, RotatingToken
from gym_harness.capture_records import (
    ModelExchange,
    SSEEvent,
    TokenLogprob,
    ToolCallRecord,
    api_of,
    assemble,
    parse_sse,
)
from gym_harness.errors import CaptureError

if TYPE_CHECKING:
    from gym_harness._upstream import UpstreamPool, UpstreamResponse

__all__ = [
    "ModelExchange",
    "ModelProxy",
    "ProxyState",
    "SSEEvent",
    "TokenLogprob",
    "ToolCallRecord",
    "api_of",
    "assemble",
    "parse_sse",
]

logger = logging.getLogger(__name__)

_STOP_TIMEOUT_S = 3.0
_UVICORN_OPTIONS = {
    "interface": "asgi3",
    "proxy_headers": False,
    "lifespan": "off",
    "timeout_graceful_shutdown": 1,
}
_KEY_HEADERS = ("x-api-key", "x-goog-api-key")
# Hop-by-hop or rewritten by us; never copied between the two connections.
_SKIP_REQUEST = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "accept-encoding",
        "authorization",
        *_KEY_HEADERS,
    }
)
# content-length too: the answer goes out chunked, so its end reaches the harness only after
# the exchange is recorded (a harness that has its answer finds it in records()).
_SKIP_RESPONSE = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"content-encoding", b"content-length"}
)


class ProxyState(enum.Enum):
    """Lifecycle of a :class:`ModelProxy`."""

    UNOPENED = "unopened"
    RUNNING = "running"
    CLOSED = "closed"


class _StreamBroken(Exception):
    """Raised inside the ASGI app to cut the harness's connection like the upstream cut ours."""


class _QuietBrokenStreams(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, _StreamBroken | asyncio.CancelledError)


class ModelProxy(RotatingToken):
    """Forward a harness's model calls to the real API and record each exchange.

    Args:
        upstream: Origin of the real API, optionally with a path prefix
            (``https://host`` or ``http://127.0.0.1:8000``); the request path is appended.
        api_key: The real key, sent upstream in the header the harness used for the
            proxy token (``Authorization: Bearer``, ``x-api-key``, ``x-goog-api-key``,
            or ``?key=``). ``None`` sends no credential upstream.
        request_logprobs: Add ``"logprobs": true`` to Chat Completions requests.
        timeout_s: Longest silence from the upstream (before the answer starts or between
            two chunks) before the exchange is given up as ``"stalled"``.
        connect_timeout_s: Longest wait to connect to the upstream.

    Example:
        >>> with ModelProxy("http://127.0.0.1:8000", api_key=key) as proxy:  # doctest: +SKIP
        ...     env = {"OPENAI_BASE_URL": proxy.base_url + "/v1", "OPENAI_API_KEY": proxy.token}
        ...     ...
        ...     exchanges = proxy.drain()
    """

    def __init__(
        self,
        upstream: str,
        *,
        api_key: str | None = None,
        request_logprobs: bool = False,
        timeout_s: float = 300.0,
        connect_timeout_s: float = 10.0,
    ) -> None:
        if not upstream.startswith(("http://", "https://")):
            raise CaptureError(f"upstream must be an http(s) URL, got {upstream!r}")
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise CaptureError("timeout_s and connect_timeout_s must be positive")
        self.upstream = upstream.rstrip("/")
        self.request_logprobs = request_logprobs
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._api_key = api_key
        super().__init__()
        self._lock = threading.Lock()
        self._records: list[ModelExchange] = []
        self._pending: list[dict[str, Any]] = []
        self._seq = 0
        self._state = ProxyState.UNOPENED
        self._server: LoopbackServer | None = None
        self._pool: UpstreamPool | None = None
        # ASGI tasks of exchanges in flight (proxy thread), and why the env cut any of them.
        self._inflight: set[asyncio.Task[Any]] = set()
        self._cut: dict[asyncio.Task[Any], str] = {}
        #: ``time.monotonic()`` of the last request or answer chunk: model traffic is a
        #: sign of life for the env's idle (stall) detection.
        self.last_activity = time.monotonic()

    def __repr__(self) -> str:  # the key stays out of reprs and logs
        return f"ModelProxy(upstream={self.upstream!r}, state={self._state.value})"

    # -- public surface ---------------------------------------------------------------

    @property
    def state(self) -> ProxyState:
        """Where the proxy is in its lifecycle."""
        return self._state

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``: use it where the harness expects the API's origin.

        Raises:
            CaptureError: The proxy is not running.
        """
        if self._state is not ProxyState.RUNNING or self._server is None:
            raise CaptureError(f"the model proxy is {self._state.value}; call start() first")
        return f"http://127.0.0.1:{self._server.port}"

    def records(self) -> list[ModelExchange]:
        """The exchanges recorded since the last :meth:`drain`, oldest first (not consumed)."""
        with self._lock:
            self._assemble_pending()
            return list(self._records)

    def drain(self) -> list[ModelExchange]:
        """The exchanges recorded since the last call, oldest first; forgets them."""
        with self._lock:
            self._assemble_pending()
            out, self._records = self._records, []
        return out

    def cut_in_flight(self, why: str, timeout_s: float = 2.0) -> int:
        """End every exchange still waiting on the upstream, recording it as ``"stalled"``.

        The env calls this when a turn ends in an error while the harness may still
        wait on the model (a deadline passed, say), so the record of that call lands
        in the turn it belongs to. A cut exchange answers the harness 504 if it had no
        answer yet, or breaks its connection mid-stream.

        Args:
            why: Goes into each cut record's ``error``.
            timeout_s: Longest wait for the cut exchanges to be recorded.

        Returns:
            How many exchanges were in flight.
        """
        loop = self._server.loop if self._server is not None else None
        if self._state is not ProxyState.RUNNING or loop is None or not self._inflight:
            return 0
        count = len(self._inflight)

        def cut() -> None:
            for task in self._inflight:
                self._cut[task] = why
                task.cancel()

        try:
            loop.call_soon_threadsafe(cut)
        except RuntimeError:  # the loop closed meanwhile
            return 0
        deadline = time.monotonic() + timeout_s
        while self._inflight and time.monotonic() < deadline:
            time.sleep(0.005)
        return count

    def start(self) -> None:
        """Bind 127.0.0.1 on an OS-chosen port and serve from a thread of its own.

        Raises:
            CaptureError: The proxy was closed, or could not bind or start in time.
        """
        if self._state is ProxyState.RUNNING:
            return
        if self._state is ProxyState.CLOSED:
            raise CaptureError("this model proxy was stopped; make a new ModelProxy")
        logging.getLogger("uvicorn.error").addFilter(_QUIET)
        server = LoopbackServer(
            self._app,
            label="model proxy",
            thread_name="gym-harness-capture",
            error=CaptureError,
            stop_timeout_s=_STOP_TIMEOUT_S,
            options=_UVICORN_OPTIONS,
            context=self._upstream_pool,
        )
        server.start()
        self._server = server
        self._state = ProxyState.RUNNING

    def stop(self) -> None:
        """Stop serving and close the upstream client. Idempotent, bounded, never raises."""
        if self._state is ProxyState.CLOSED:
            return
        self._state = ProxyState.CLOSED
        server, self._server = self._server, None
        if server is not None:
            server.stop()  # bounded, never raises
        self._pool = None

    def __enter__(self) -> ModelProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- the ASGI app (proxy thread) ----------------------------------------------------

    async def _app(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        started_at, t0 = time.time(), time.perf_counter()
        self.last_activity = time.monotonic()
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        method, path = scope["method"], scope["path"]
        query = scope["query_string"].decode("latin-1")
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]]
        outgoing, query, ok = self._credentials(headers, query, method, path)
        call = _Call(method, path, bytes(body), False, send, started_at, t0)
        if not ok:
            self._record(call, 401, "unauthorized", "", None)
            await _send_json(send, 401, _error("missing or wrong gym_harness proxy token"))
            return
        call.content, call.added = self._maybe_add_logprobs(path, call.content)
        # raw_path: the path as the harness wrote it (scope["path"] is percent-decoded).
        raw_path = scope.get("raw_path") or path.encode()
        target = raw_path.decode("latin-1") + (f"?{query}" if query else "")
        call.disconnect = asyncio.ensure_future(receive())  # resolves when the harness hangs up
        task = asyncio.current_task()
        assert task is not None
        self._inflight.add(task)
        try:
            await self._forward(call, target, outgoing)
        finally:
            call.disconnect.cancel()
            self._inflight.discard(task)
            self._cut.pop(task, None)

    async def _forward(self, call: _Call, target: str, headers: list[tuple[str, str]]) -> None:
        # Imported by the proxy thread, not by ``import gym_harness`` (h11 takes ~20 ms).
        from gym_harness._upstream import UpstreamDropped, UpstreamTimeout, UpstreamUnreachable

        assert self._pool is not None
        try:
            response = await self._pool.request(call.method, target, headers, call.content)
        except UpstreamTimeout as exc:
            outcome, status, why = "stalled", 504, f"upstream silent for {self.timeout_s}s: {exc}"
        except UpstreamDropped as exc:
            # Connected, then closed before any answer. The harness gets a 502 (ASGI has
            # no way to close its connection before a response starts).
            outcome, status, why = "dropped", 502, f"upstream closed without answering: {exc}"
        except UpstreamUnreachable as exc:
            outcome, status, why = "unreachable", 502, f"upstream unreachable: {exc}"
        except asyncio.CancelledError:
            cut = self._cut.get(asyncio.current_task())  # type: ignore[arg-type]
            outcome, status = ("stalled", 504) if cut is not None else ("cancelled", 502)
            why = f"no answer from the upstream when {cut}" if cut else "the proxy stopped"
            self._record(call, status, outcome, why, None)
            if cut is None:
                raise
            await _send_json(call.send, status, _error(why))
            return
        else:
            await self._relay(call, response)
            return
        self._record(call, status, outcome, why, None)
        await _send_json(call.send, status, _error(why))

    async def _relay(self, call: _Call, response: UpstreamResponse) -> None:
        from gym_harness._upstream import UpstreamDropped, UpstreamTimeout

        out_headers = [(k, v) for k, v in response.headers if k not in _SKIP_RESPONSE]
        send, disconnect = call.send, call.disconnect
        await send(
            {"type": "http.response.start", "status": response.status, "headers": out_headers}
        )
        chunks: list[bytes] = []
        ttfb: float | None = None
        outcome, why = ("refused" if response.status >= 400 else "ok"), ""
        try:
            # Each piece is every body byte one socket read brought, sent on at once.
            while (chunk := await response.read_some()) is not None:
                self.last_activity = time.monotonic()
                if ttfb is None:
                    ttfb = time.perf_counter() - call.t0
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                chunks.append(chunk)
                if disconnect is not None and disconnect.done():
                    outcome, why = "client_closed", "the harness hung up mid-answer"
                    break
        except UpstreamTimeout as exc:
            outcome, why = "stalled", f"upstream silent for {self.timeout_s}s mid-answer: {exc}"
        except UpstreamDropped as exc:
            outcome, why = "dropped", f"upstream connection broke mid-answer: {exc}"
        except asyncio.CancelledError:  # the env cut it, or the proxy is stopping
            cut = self._cut.get(asyncio.current_task())  # type: ignore[arg-type]
            if cut is None:
                outcome, why = "cancelled", "the proxy stopped mid-answer"
                raise
            outcome, why = "stalled", f"the answer was unfinished when {cut}"
        finally:
            await response.aclose()
            answer = (response.header(b"content-type"), b"".join(chunks))
            self._record(call, response.status, outcome, why, answer, ttfb)
        if outcome in ("stalled", "dropped"):
            raise _StreamBroken(why)  # uvicorn then closes the harness's connection mid-body
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # -- helpers ----------------------------------------------------------------------------

    def _credentials(
        self, headers: list[tuple[str, str]], query: str, method: str, path: str
    ) -> tuple[list[tuple[str, str]], str, bool]:
        """Check the proxy token and put the real key where the harness put the token."""
        token, key = self._token, self._api_key
        presented: str | None = None
        out = [(k, v) for k, v in headers if k not in _SKIP_REQUEST]
        out.append(("accept-encoding", "identity"))  # keep the recorded bytes readable
        for name, value in headers:
            if name == "authorization" and value.lower().startswith("bearer "):
                presented = value[7:].strip()
                if key is not None:
                    out.append(("authorization", f"Bearer {key}"))
            elif name in _KEY_HEADERS:
                presented = value.strip()
                if key is not None:
                    out.append((name, key))
        if "key=" in query:
            pairs = parse_qsl(query, keep_blank_values=True)
            presented = next((v for k, v in pairs if k == "key"), presented)
            pairs = [(k, v) for k, v in pairs if k != "key"]
            if key is not None:
                pairs.append(("key", key))
            query = urlencode(pairs)
        if presented is None:  # connectivity probes (Claude Code's HEAD /) carry no key
            return out, query, method in ("HEAD", "GET") and path == "/"
        return out, query, hmac.compare_digest(presented.encode(), token.encode())

    def _maybe_add_logprobs(self, path: str, content: bytes) -> tuple[bytes, bool]:
        if not (self.request_logprobs and path.endswith("/chat/completions")):
            return content, False
        try:
            body = _json.loads(content)  # the harness wrote it: bounded
        except ValueError:
            return content, False
        if not isinstance(body, dict) or body.get("logprobs") is True:
            return content, False
        body["logprobs"] = True
        return json.dumps(body).encode(), True

    def _record(
        self,
        call: _Call,
        status: int,
        outcome: str,
        error: str,
        answer: tuple[str, bytes] | None,
        ttfb: float | None = None,
    ) -> None:
        total = time.perf_counter() - call.t0
        # Only the raw facts here: parsing waits for records()/drain() in the caller's
        # thread, so it costs the harness's call nothing.
        raw = {
            "method": call.method,
            "path": call.path,
            "request": call.content,
            "logprobs_added": call.added,
            "status": status,
            "outcome": outcome,
            "error": error,
            "answer": answer,
            "started_at": call.started_at,
            "ttfb_s": ttfb,
            "total_s": total,
        }
        with self._lock:
            self._seq += 1
            self._pending.append({**raw, "seq": self._seq})

    def _assemble_pending(self) -> None:
        """Turn raw exchanges into records (caller's thread; holds the lock)."""
        for raw in self._pending:
            try:
                self._records.append(assemble(**raw))
            except Exception as exc:  # one unreadable exchange must not hide the others
                logger.warning("model proxy could not assemble exchange %s: %r", raw["seq"], exc)
        self._pending = []

    @contextlib.asynccontextmanager
    async def _upstream_pool(self) -> AsyncIterator[None]:
        """The upstream connections, opened and closed on the proxy loop around serving."""
        from gym_harness._upstream import UpstreamPool

        self._pool = UpstreamPool(
            self.upstream, timeout_s=self.timeout_s, connect_timeout_s=self.connect_timeout_s
        )
        try:
            yield
        finally:
            await self._pool.aclose()


_QUIET = _QuietBrokenStreams()


@dataclass(slots=True)
class _Call:
    """One harness call in flight through the proxy (the proxy thread's own state)."""

    method: str
    path: str
    content: bytes  # the body as sent upstream
    added: bool  # the proxy added a logprobs request to it
    send: Any  # the ASGI send of the harness's connection
    started_at: float  # wall clock when the whole request had arrived
    t0: float  # perf_counter at the same moment
    disconnect: asyncio.Future[Any] | None = None  # resolves when the harness hangs up


def _error(message: str) -> dict[str, Any]:
    return {
        "error": {"type": "gym_harness_proxy_error", "message": f"gym_harness proxy: {message}"}
    }


async def _send_json(send: Any, status: int, payload: dict[str, Any]) -> None:
    data = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})
