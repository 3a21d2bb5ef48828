"""ModelProxy: a loopback pass-through that records every model call a harness makes.

The harness talks to ``ModelProxy.base_url`` instead of its model API, with a
per-episode proxy token in place of the API key. The proxy swaps that token
for the real key (which never leaves the env process), forwards the request to
the upstream, and passes the answer back byte for byte as it arrives, SSE
streams included. Per request it keeps a :class:`ModelExchange` (see
``gym_harness.records.exchanges``, whose names are importable from here too).

Wire APIs understood for recording (anything else is still forwarded):
OpenAI Chat Completions, OpenAI Responses, Anthropic Messages, Gemini.

Threads: the caller's thread owns the lifecycle (``start``/``stop``/
``rotate_token``/``drain``). The proxy thread owns one asyncio loop running
uvicorn and the upstream connections (``gym_harness.capture.upstream``); it appends records
behind a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from gym_harness.capture.http import (
    Call,
    StreamBroken,
    add_logprobs,
    error_payload,
    read_body,
    send_json,
)
from gym_harness.capture.secrets import Redactor, carries, swap_credentials
from gym_harness.errors import CaptureError, ConfigError
from gym_harness.lifecycle import Lifecycle
from gym_harness.loopback.service import LoopbackService
from gym_harness.records.exchanges import (
    ModelExchange,
    SSEEvent,
    TokenLogprob,
    ToolCallRecord,
    api_of,
    assemble,
    parse_sse,
)

if TYPE_CHECKING:
    from gym_harness.capture.tokens import TokenStripper
    from gym_harness.capture.upstream import UpstreamPool, UpstreamResponse
    from gym_harness.config import HarnessConfig
    from gym_harness.records.events import TurnResult

__all__ = [
    "ModelExchange",
    "ModelProxy",
    "SSEEvent",
    "TokenLogprob",
    "ToolCallRecord",
    "api_of",
    "assemble",
    "parse_sse",
    "start_proxy",
]

logger = logging.getLogger(__name__)

#: Default cap on each recorded body (the harness still gets the whole answer).
DEFAULT_MAX_RECORD_BYTES = 4 * 1024 * 1024
#: Default limit on a request body; larger ones get 413 before they are read.
DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024
_UVICORN_OPTIONS = {
    "interface": "asgi3",
    "proxy_headers": False,
    "lifespan": "off",
    "timeout_graceful_shutdown": 1,
}
# content-length too: the answer goes out chunked, so its end reaches the harness only after
# the exchange is recorded (a harness that has its answer finds it in records()).
_SKIP_RESPONSE = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"content-encoding", b"content-length"}
)


class _QuietBrokenStreams(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, StreamBroken | asyncio.CancelledError)


class ModelProxy(LoopbackService):
    """Forward a harness's model calls to the real API and record each exchange.

    Args:
        upstream: Origin of the real API, optionally with a path prefix
            (``https://host`` or ``http://127.0.0.1:8000``); the request path is appended.
        api_key: The real key, sent upstream in the header the harness used for the
            proxy token (``Authorization: Bearer``, ``x-api-key``, ``x-goog-api-key``,
            or ``?key=``). ``None`` sends no credential upstream.
        request_logprobs: Add ``"logprobs": true`` to Chat Completions requests.
        request_tokens: Ask Chat Completions upstreams for the engine's token ids and
            logprobs (``capture/tokens.py``: ``return_token_ids``, ``logprobs``), record
            them, and take what the harness did not ask for out of its copy of the answer.
        timeout_s: Longest silence from the upstream (before the answer starts or between
            two chunks) before the exchange is given up as ``"stalled"``.
        connect_timeout_s: Longest wait to connect to the upstream.
        max_record_bytes: Each recorded body (request, answer) is kept up to this many
            bytes and the record marked ``truncated``; the harness still gets it whole.
        max_request_bytes: A larger request body is refused (413, recorded as
            ``"too_large"``) before it is read, or as soon as its stream passes the limit.

    The real key and the proxy token are replaced by ``[redacted]`` in every answer
    relayed to the harness (headers and body) and in every record.

    Example:
        >>> with ModelProxy("http://127.0.0.1:8000", api_key=key) as proxy:  # doctest: +SKIP
        ...     env = {"OPENAI_BASE_URL": proxy.base_url + "/v1", "OPENAI_API_KEY": proxy.token}
        ...     ...
        ...     exchanges = proxy.drain()
    """

    label = "model proxy"
    error = CaptureError

    def __init__(
        self,
        upstream: str,
        *,
        api_key: str | None = None,
        request_logprobs: bool = False,
        request_tokens: bool = False,
        timeout_s: float = 300.0,
        connect_timeout_s: float = 10.0,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        if not upstream.startswith(("http://", "https://")):
            raise CaptureError(f"upstream must be an http(s) URL, got {upstream!r}")
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise CaptureError("timeout_s and connect_timeout_s must be positive")
        for name, value in (
            ("max_record_bytes", max_record_bytes),
            ("max_request_bytes", max_request_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CaptureError(f"{name} must be a positive int, got {value!r}")
        self.max_record_bytes = max_record_bytes
        self.max_request_bytes = max_request_bytes
        self.upstream = upstream.rstrip("/")
        self.request_logprobs = request_logprobs
        self.request_tokens = request_tokens
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._api_key = api_key
        super().__init__()
        self._lock = threading.Lock()
        self._records: list[ModelExchange] = []
        self._pending: list[dict[str, Any]] = []
        self._seq = 0
        self._pool: UpstreamPool | None = None
        # ASGI tasks of exchanges in flight (proxy thread), and why the env cut any of them.
        self._inflight: set[asyncio.Task[Any]] = set()
        # Proxy thread: the redactors of the current token (see _redactors), and the last
        # token a harness sent upstream itself (an upstream can echo only what it got).
        self._redaction: tuple[str, Redactor, Redactor] | None = None
        self._token_upstream = ""
        self._cut: dict[asyncio.Task[Any], str] = {}
        #: ``time.monotonic()`` of the last request or answer chunk: model traffic is a
        #: sign of life for the env's idle (stall) detection.
        self.last_activity = time.monotonic()

    def __repr__(self) -> str:  # the key stays out of reprs and logs
        return f"ModelProxy(upstream={self.upstream!r}, state={self._state.value})"

    # -- public surface ---------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Always False (``Liveness``): a model call in flight does not hold the idle
        deadline, so a stalled upstream ends the turn as ``idle_timeout``."""
        return False

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

    def close_turn(self, result: TurnResult) -> TurnResult:
        """``result`` with the exchanges of its turn as events; a turn that ended in a
        fault first cuts the calls still waiting upstream into it (``cut_in_flight``)."""
        if result.error_type:
            self.cut_in_flight(f"the turn ended ({result.error_type})")
        return result.with_events(e for call in self.drain() for e in call.to_events())

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
        if self._state is not Lifecycle.RUNNING or loop is None or not self._inflight:
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
        logging.getLogger("uvicorn.error").addFilter(_QUIET)
        self._start_server(
            self._app,
            thread_name="gym-harness-capture",
            options=_UVICORN_OPTIONS,
            context=self._upstream_pool,
        )

    def stop(self) -> None:
        """Stop serving and close the upstream client. Idempotent, bounded, never raises."""
        if self._stop_server():
            self._pool = None

    # -- the ASGI app (proxy thread) ----------------------------------------------------

    async def _app(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        started_at, t0 = time.time(), time.perf_counter()
        self.last_activity = time.monotonic()
        method, path = scope["method"], scope["path"]
        query = scope["query_string"].decode("latin-1")
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]]
        token, redact, relay = self._redactors()
        outgoing, query, ok = swap_credentials(token, self._api_key, headers, query, method, path)
        call = Call(
            method, path, b"", False, send, started_at, t0, redact, relay, self.max_record_bytes
        )
        if not ok:  # refused before its body is read
            self._keep(call.record(401, "unauthorized", "", None))
            await send_json(send, 401, error_payload("missing or wrong gym_harness proxy token"))
            return
        call.content, size, problem = await read_body(receive, headers, self.max_request_bytes)
        if problem == "client_closed":
            self._keep(call.record(499, problem, "the harness hung up mid-request", None, cut=True))
            return
        if problem:
            why = f"request body of {size} bytes or more is over the proxy's limit of "
            why += f"{self.max_request_bytes} bytes (ModelProxy max_request_bytes)"
            self._keep(call.record(413, problem, why, None, request_bytes=size, cut=True))
            # Connection: close, so the rest of the body is never read.
            await send_json(send, 413, error_payload(why), close=True)
            return
        if self.request_logprobs and path.endswith("/chat/completions"):
            call.content, call.added = add_logprobs(call.content)
        if self.request_tokens and path.endswith("/chat/completions"):
            from gym_harness.capture.tokens import ask_for_tokens

            call.content, call.tokens = ask_for_tokens(call.content)
            call.added = call.added or "logprobs" in call.tokens
        if self._token_upstream != token and carries(token, call.content, outgoing, query):
            self._token_upstream = token  # from now on the upstream may echo it
        if self._token_upstream == token:
            call.relay = redact
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

    async def _forward(self, call: Call, target: str, headers: list[tuple[str, str]]) -> None:
        # Imported by the proxy thread, not by ``import gym_harness`` (h11 takes ~20 ms).
        from gym_harness.capture.upstream import (
            UpstreamDropped,
            UpstreamTimeout,
            UpstreamUnreachable,
        )

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
            self._keep(call.record(status, outcome, why, None))
            if cut is None:
                raise
            await send_json(call.send, status, error_payload(why))
            return
        else:
            await self._relay(call, response)
            return
        self._keep(call.record(status, outcome, why, None))
        await send_json(call.send, status, error_payload(why))

    async def _relay(self, call: Call, response: UpstreamResponse) -> None:
        from gym_harness.capture.upstream import UpstreamDropped, UpstreamTimeout

        redact = call.relay
        out_headers = redact.scrub_headers(
            [(k, v) for k, v in response.headers if k not in _SKIP_RESPONSE]
        )
        send, disconnect = call.send, call.disconnect
        await send(
            {"type": "http.response.start", "status": response.status, "headers": out_headers}
        )
        chunks: list[bytes] = []
        kept, cap, size, held = 0, self.max_record_bytes, 0, b""
        strip = _stripper(call, response)
        ttfb: float | None = None
        outcome, why = ("refused" if response.status >= 400 else "ok"), ""
        try:
            # Each piece is every body byte one socket read brought, sent on at once
            # (bar the start of a secret at its very end, held for the next read).
            while (raw := await response.read_some()) is not None:
                self.last_activity = time.monotonic()
                if ttfb is None:
                    ttfb = time.perf_counter() - call.t0
                chunk, held = redact.split(held + raw if held else raw)
                if not chunk:
                    continue
                if out := strip.feed(chunk) if strip else chunk:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                size += len(chunk)
                if kept < cap:  # the record keeps the first cap bytes; the harness gets all
                    chunks.append(chunk if kept + len(chunk) <= cap else chunk[: cap - kept])
                    kept += len(chunks[-1])
                if disconnect is not None and disconnect.done():
                    outcome, why = "client_closed", "the harness hung up mid-answer"
                    break
            else:
                if held:  # the stream ended: it was no secret after all
                    out = strip.feed(held) if strip else held
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                    size += len(held)
                    if kept < cap:
                        chunks.append(held[: cap - kept])
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
            self._keep(call.record(response.status, outcome, why, answer, ttfb, answer_bytes=size))
        if outcome in ("stalled", "dropped"):
            raise StreamBroken(why)  # uvicorn then closes the harness's connection mid-body
        rest = strip.end() if strip else b""
        await send({"type": "http.response.body", "body": rest, "more_body": False})

    # -- helpers ----------------------------------------------------------------------------

    def _redactors(self) -> tuple[str, Redactor, Redactor]:
        """The current token, a redactor of key and token, and one of the key alone.

        Made once per token, not per call. Answers are scrubbed of the token only once
        the harness sent it upstream: searching every piece of every answer for both
        secrets would cost the proxy's hot path for nothing.
        """
        token, cached = self._token, self._redaction
        if cached is None or cached[0] != token:
            cached = self._redaction = (
                token,
                Redactor((self._api_key, token)),
                Redactor((self._api_key,)),
            )
        return cached

    def _keep(self, raw: dict[str, Any]) -> None:
        """Keep one exchange's raw facts (``Call.record``); records()/drain() parse them."""
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
        from gym_harness.capture.upstream import UpstreamPool

        self._pool = UpstreamPool(
            self.upstream, timeout_s=self.timeout_s, connect_timeout_s=self.connect_timeout_s
        )
        try:
            yield
        finally:
            await self._pool.aclose()


_QUIET = _QuietBrokenStreams()


def _stripper(call: Call, response: UpstreamResponse) -> TokenStripper | None:
    """What takes the token fields the proxy asked for out of the harness's answer."""
    if not call.tokens or response.status >= 400:
        return None
    from gym_harness.capture.tokens import TokenStripper

    streamed = response.header(b"content-type").startswith("text/event-stream")
    return TokenStripper(call.tokens, streamed)


def start_proxy(config: HarnessConfig) -> ModelProxy:
    """A started ``ModelProxy`` for an env's capture settings.

    Args:
        config: The env's config: ``upstream`` (the real API's origin),
            ``upstream_api_key_env`` (the variable holding its key, read here; it stays
            here), ``request_logprobs``, ``capture_max_bytes`` (bounds the records) and
            ``capture_tokens`` (asks the upstream for token ids).

    Raises:
        ConfigError: ``upstream_api_key_env`` is named but not set in this process.
    """
    key_env = config.upstream_api_key_env
    key = os.environ.get(key_env) if key_env else None
    if key_env and key is None:
        raise ConfigError(f"upstream_api_key_env={key_env!r} is not set in this process.")
    proxy = ModelProxy(
        str(config.upstream),
        api_key=key,
        request_logprobs=config.request_logprobs,
        request_tokens=config.capture_tokens,
        max_record_bytes=config.capture_max_bytes,
    )
    proxy.start()
    return proxy
