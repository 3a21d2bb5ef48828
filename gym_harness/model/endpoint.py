"""ModelEndpoint: the loopback server a harness's model calls reach in model mode.

The harness talks to :attr:`ModelEndpoint.base_url` as if it were its model API, with
the per-episode key :meth:`~ModelEndpoint.rotate_token` gives. Each main model call
waits, unanswered, until the env hands it to the policy (:meth:`next_request`) and
answers it (:meth:`deliver`, or :meth:`fail`); the answer goes out in the harness's own
wire format (:class:`~gym_harness.model.AnswerWriter`).

* **Slow policies.** A streamed call gets its response head at once, then the API's
  keep-alive every ``keepalive_s`` until the answer, so a CLI's header and idle
  timers never fire. An unstreamed call waits silently. Either way a call unanswered
  ``policy_timeout_s`` after it arrived ends with an API error (504, or the stream's
  error event) and is recorded.
* **Side calls** (the adapter's ``side_call`` says which: titles, summaries) get
  ``side_answer`` at once when ``model_calls="main"`` (or go to :attr:`side_upstream`,
  when set: see ``gym_harness.model._side``); with ``"all"`` they are steps too.
* **Retries are not new steps.** A request equal to a waiting call (``stream`` aside;
  on ``x-stainless-retry-count`` > 0, its conversation alone) joins it; one equal to a
  recently answered call gets the same answer again (see docs/model-mode.md); a cheap
  key (:class:`~gym_harness.model.calls.CallKey`) finds candidates to compare.
* **Incremental reads.** Each request is read from what the episode's earlier ones left
  (:class:`~gym_harness.model.request.RequestReader`): only the new part of the
  conversation is parsed and converted.
* **A dropped connection** leaves its call waiting (a retry may come); delivering to it
  records the answer and keeps it for that retry.
* **Malformed bodies** of a model call's path get 400 with the reason
  (:class:`~gym_harness.model.request.BadRequest`) and never become a step.
* **Episodes**: :meth:`~ModelEndpoint.cut` ends the episode's calls and retires its key
  at once, so a late request of the old episode gets 401 and is recorded nowhere.
  :meth:`~ModelEndpoint.lapses` names the calls that timed out since the last answer.
* **Bounds**: request bodies (413, while read), waiting calls (``max_pending``, 429), the
  replay table (``max_replay``), the records (count and bytes, :class:`CallLog`),
  connections (:class:`LoopbackServer`'s cap; a complete answer still being written is
  never evicted).

Threads: the caller's thread owns the lifecycle (``start``/``stop``/``rotate_token``/
``cut``) and the policy side (``next_request``/``deliver``/``fail``/``calls``/
``drain``). The server thread owns one asyncio loop: the HTTP exchanges, their
writers and the policy-timeout timers. Both share the waiting calls, the unclaimed
queue, the wake pipe, the replay table, the records, the lapses, the key and its episode
number (``_epoch``), only under ``_lock``; the caller reaches the loop with
``call_soon_threadsafe``/``run_coroutine_threadsafe``. The request reader is the loop's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from gym_harness.capture.http import send_json
from gym_harness.capture.secrets import swap_credentials
from gym_harness.errors import EndpointError
from gym_harness.lifecycle import Lifecycle
from gym_harness.loopback.connections import CONNECTION_KEY
from gym_harness.loopback.service import LoopbackService
from gym_harness.model._exchange import (
    Exchange,
    PendingCall,
    WakeFlag,
    flush,
    hold,
    other_answer,
    wake,
    write_whole,
)
from gym_harness.model._intake import take_in, unauthorized
from gym_harness.model._side import SideUpstream, answer_side, is_side
from gym_harness.model.action import Completion
from gym_harness.model.answer import AnswerWriter, Usage, error_body
from gym_harness.model.calls import (
    Answered,
    CallKey,
    CallLog,
    EndpointConfig,
    Lapses,
    ModelCall,
    ReplayTable,
)
from gym_harness.model.request import ModelRequest, RequestReader

__all__ = [
    "EndpointConfig",
    "EndpointError",
    "ModelEndpoint",
    "PendingCall",
    "SideCall",
    "other_answer",
]

logger = logging.getLogger(__name__)

#: ``side_call(request, headers) -> bool``: the adapter's test for an auxiliary call.
SideCall = Callable[[ModelRequest, Mapping[str, str]], bool]
_CUT_TIMEOUT_S = 2.0
_UVICORN_OPTIONS = {"interface": "asgi3", "timeout_graceful_shutdown": 0.5}


def _never(request: ModelRequest, headers: Mapping[str, str]) -> bool:
    return False


class ModelEndpoint(LoopbackService):
    """Serve a harness's model calls to a policy, one step per main call.

    Args:
        side_call: ``(request, headers) -> bool``, the adapter's test for a side call
            (default: none is).
        config: The settings; or give them as keyword ``options`` instead.
        **options: :class:`EndpointConfig` fields (``model_calls``, ``keepalive_s``,
            ``policy_timeout_s``, ``max_pending``, ...).

    Raises:
        ConfigError: A setting is out of range.

    Example:
        >>> ep = ModelEndpoint(keepalive_s=5.0)  # doctest: +SKIP
        >>> ep.start(); key = ep.rotate_token()
        >>> # ... start the harness against ep.base_url with key ...
        >>> call = ep.next_request()  # None until a model call waits (poll ep.wake_fd)
        >>> ep.deliver(call.request_id, call.parse(policy(call.observation)))
        >>> ep.stop()
    """

    label = "model endpoint"
    error = EndpointError

    def __init__(
        self,
        side_call: SideCall | None = None,
        *,
        config: EndpointConfig | None = None,
        **options: Any,
    ) -> None:
        self.config = config = config or EndpointConfig(**options)
        super().__init__()
        self.side_call = side_call or _never
        self._lock = threading.Lock()
        self._log = CallLog(config.max_records, config.max_record_bytes)
        self._replay = ReplayTable(config.max_replay, max(config.max_record_bytes // 4, 1))
        self._open: dict[str, PendingCall] = {}  # waiting calls by request_id
        self._by_key: dict[tuple[str, int], list[PendingCall]] = {}  # by CallKey.cheap
        self._reader = RequestReader()  # the server loop's
        self._unclaimed: collections.deque[PendingCall] = collections.deque()
        self._lapses = Lapses()
        self._epoch = 0  # the key's episode: a request let in under an older one is refused
        self._seq = 0
        self._ids = f"req_{uuid.uuid4().hex[:8]}_"  # request ids unique across endpoints
        self._wake = WakeFlag()
        self.side_upstream: SideUpstream | None = None  #: where side calls go, if set
        #: ``time.monotonic()`` of the last request, or answer written: the harness's signs
        #: of life (keep-alives are the endpoint's own bytes and do not count).
        self.last_activity = time.monotonic()

    def __repr__(self) -> str:
        return f"ModelEndpoint(state={self._state.value}, model_calls={self.config.model_calls!r})"

    # -- lifecycle (caller's thread) ----------------------------------------------------------

    @property
    def wake_fd(self) -> int:
        """A file descriptor that is readable while a main call waits unclaimed (``poll`` it).

        Closed by :meth:`stop`.
        """
        return self._wake.fd

    @property
    def busy(self) -> bool:
        """A claimed call waits for the policy's answer."""
        with self._lock:
            return any(c.claimed for c in self._open.values())

    @property
    def waiting(self) -> bool:
        """A main call waits unclaimed: :meth:`next_request` would return it (``Wake``)."""
        with self._lock:
            return any(not c.finished for c in self._unclaimed)

    @property
    def dropped(self) -> int:
        """Records not kept since the last :meth:`drain` (past ``max_records``)."""
        with self._lock:
            return self._log.dropped

    def start(self) -> None:
        """Bind 127.0.0.1 on an OS-chosen port and serve from a thread of its own.

        Raises:
            EndpointError: The endpoint was stopped, or could not bind or start in time.
        """
        self._start_server(
            self._app,
            thread_name="gym-harness-model",
            options=_UVICORN_OPTIONS,
            max_connections=self.config.max_connections,
        )

    def rotate_token(self, side_upstream: SideUpstream | None = None) -> str:
        """A new per-episode key (the old one is refused from now on); forgets old answers.

        Args:
            side_upstream: Where the new episode's side calls go (the capture proxy),
                if anywhere; ``None`` keeps the one set before.

        Returns:
            The key the harness must send (``x-api-key``, ``Authorization: Bearer``,
            ``x-goog-api-key`` or ``?key=``).
        """
        if side_upstream is not None:
            self.side_upstream = side_upstream
        with self._lock:
            return self._new_episode()

    def cut(self, why: str) -> int:
        """End the episode: every waiting call ends now with an API error, recorded, and
        the key is retired (a request with it gets 401 and no record) until
        :meth:`rotate_token`.

        Args:
            why: Goes into each record's ``error`` and the harness's error message.

        Returns:
            How many calls were waiting.
        """
        with self._lock:
            calls = list(self._open.values())
            for call in calls:
                self._finish(call, failure=(504, why))
            self._new_episode()  # a key nobody was given: the old one stops working now
        loop = self._server.loop if self._server is not None else None
        if calls and loop is not None:
            try:
                future = asyncio.run_coroutine_threadsafe(flush(calls, _CUT_TIMEOUT_S / 2), loop)
                future.result(_CUT_TIMEOUT_S)
            except Exception:  # the loop stopped meanwhile, or the writes took too long
                logger.debug("model endpoint: cut did not finish writing", exc_info=True)
        return len(calls)

    def stop(self) -> None:
        """Cut every waiting call, stop serving, close the wake pipe. Idempotent, never raises."""
        if self._state is Lifecycle.STOPPED:
            return
        try:
            self.cut("the model endpoint stopped")
        except Exception:
            logger.debug("model endpoint: cut on stop failed", exc_info=True)
        self._stop_server()
        with self._lock:
            self._wake.close()

    # -- the policy side (caller's thread) ----------------------------------------------------

    def next_request(self) -> PendingCall | None:
        """Claim the oldest main call nobody claimed yet; ``None`` when none waits. Never blocks."""
        with self._lock:
            while self._unclaimed:
                call = self._unclaimed.popleft()
                if not call.finished:
                    call.claimed = True
                    self._set_wake()
                    return call
            self._set_wake()
            return None

    def deliver(self, request_id: str, completion: Completion, usage: Usage | None = None) -> bool:
        """Answer a waiting call: record it, then write the answer to the harness.

        The record is kept before the answer's last byte goes out. A call whose
        connection dropped is recorded all the same, and its answer kept for the retry.

        Args:
            request_id: The call's id.
            completion: The policy's checked completion (:meth:`PendingCall.parse`).
            usage: Token counts for the wire (``None``: an estimate).

        Returns:
            False when no such call waits (it was answered, cut or timed out already).
        """
        with self._lock:
            call = self._open.get(request_id)
            if call is None:
                return False
            wire = usage or Usage.estimate(call.request, completion)
            self._finish(call, answer=(completion, wire))
            self._lapses.clear()  # an answer went out after them
        self._wake_exchange(call)
        return True

    def fail(self, request_id: str, message: str) -> bool:
        """End a waiting call with an API error (status 500, or the stream's error event).

        Returns:
            False when no such call waits.
        """
        with self._lock:
            call = self._open.get(request_id)
            if call is None:
                return False
            self._finish(call, failure=(500, message))
        self._wake_exchange(call)
        return True

    def calls(self) -> list[ModelCall]:
        """The records since the last :meth:`drain`, in arrival order (not consumed)."""
        with self._lock:
            return self._log.records()

    def drain(self) -> list[ModelCall]:
        """The records since the last call, in arrival order; forgets them."""
        with self._lock:
            return self._log.drain()

    def lapses(self) -> tuple[int, tuple[str, ...]]:
        """The calls that timed out (``policy_timeout_s``) since the last answer delivered.

        Returns:
            How many, and the request ids of the first of them (at most
            :attr:`Lapses.KEPT`), oldest first. :meth:`deliver`, :meth:`cut` and
            :meth:`rotate_token` start the count again.
        """
        with self._lock:
            return self._lapses.count, tuple(self._lapses.ids)

    # -- shared state (under _lock) -----------------------------------------------------------

    def _new_episode(self) -> str:
        """A fresh key and episode number; forget answers and lapses (holds the lock)."""
        self._replay.clear()
        self._lapses.clear()
        self._epoch += 1
        return super().rotate_token()

    def _set_wake(self) -> None:
        """Make the wake pipe readable exactly while an unclaimed call waits (holds the lock)."""
        self._wake.set(any(not c.finished for c in self._unclaimed))

    def _finish(
        self,
        call: PendingCall,
        *,
        answer: tuple[Completion, Usage] | None = None,
        failure: tuple[int, str] | None = None,
    ) -> None:
        """Settle ``call`` once, record it, remember an answer for retries (holds the lock)."""
        call.answer, call.failure = answer, failure
        self._open.pop(call.request_id, None)
        if not call.claimed:
            with contextlib.suppress(ValueError):  # already taken out by next_request
                self._unclaimed.remove(call)
        key = call.key
        same = self._by_key.get(key.cheap, []) if key is not None else []
        if key is not None and call in same:
            same.remove(call)
            if not same:
                del self._by_key[key.cheap]
        completion = answer[0] if answer else None
        status, error = failure if failure else (200, "")
        record = ModelCall.of(
            call.seq, call.request_id, call.request, call.path, call.side, completion, status,
            error, call.started, call.retries,
        )  # fmt: skip
        self._log.add(record, call.request.size)
        if answer is not None and call.key is not None:
            answered = Answered(*answer, call.answer_id, call.created, call.seq)
            self._replay.put(call.key, answered, call.request.size)
        self._set_wake()

    def _log_call(self, epoch: int, seq: int, request: ModelRequest | None, path: str,
                  side: bool, completion: Completion | None, status: int, error: str,
                  started: float) -> None:  # fmt: skip
        """Keep the record of a call that never waited, unless its episode ended (takes the
        lock): what reaches the endpoint after the cut is in no trajectory."""
        request_id = request.request_id if request else f"{self._ids}{seq}"
        with self._lock:
            if epoch == self._epoch:
                record = ModelCall.of(
                    seq, request_id, request, path, side, completion, status, error, started
                )
                self._log.add(record, request.size if request else 0)

    def _next_seq(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq

    def _wake_exchange(self, call: PendingCall) -> None:
        loop = self._server.loop if self._server is not None else None
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody to answer
            loop.call_soon_threadsafe(wake, call)

    # -- the ASGI app (server thread) ---------------------------------------------------------

    async def _app(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        started = time.time()
        method, path = scope["method"], scope["path"]
        query = scope["query_string"].decode("latin-1")
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]]
        with self._lock:  # the key and its episode, read together
            token, epoch = self._token, self._epoch
        _, _, ok = swap_credentials(token, None, headers, query, method, path)
        if not ok:
            await unauthorized(send, path)
            return
        self.last_activity = time.monotonic()  # a sign of life only from the key's holder
        conn = scope.get("state", {}).get(CONNECTION_KEY)
        if conn is not None:
            conn.owner = token  # authenticated: never evicted while busy
        seq = self._next_seq()
        taken = await take_in(
            receive, send, scope, headers, limit=self.config.max_request_bytes,
            request_id=f"{self._ids}{seq}",
            refused=lambda status, why: self._log_call(
                epoch, seq, None, path, False, None, status, why, started
            ),
            reader=self._reader, episode=epoch,
        )  # fmt: skip
        if taken is None:
            return
        request, body = taken
        hdrs = dict(headers)
        side = is_side(self.side_call, request, hdrs)
        if side and self.config.model_calls == "main":
            side_upstream = self.side_upstream

            def record(completion: Completion | None, status: int, error: str) -> None:
                self._log_call(epoch, seq, request, path, True, completion, status, error, started)

            await answer_side(
                send, request, scope, body, side=side_upstream,
                side_answer=self.config.side_answer, own_token=token, record=record,
            )  # fmt: skip
            if side_upstream is not None:
                self.last_activity = time.monotonic()  # the harness has its answer
            return
        await self._main(send, receive, (seq, epoch), request, path, side, hdrs, conn)

    async def _main(
        self,
        send: Any,
        receive: Any,
        order: tuple[int, int],
        request: ModelRequest,
        path: str,
        side: bool,
        headers: dict[str, str],
        conn: Any,
    ) -> None:
        key = CallKey.of(path, request)
        retry = headers.get("x-stainless-retry-count", "0").strip() not in ("", "0")
        replay: Answered | None = None
        (seq, epoch), stale = order, False
        with self._lock:
            same = self._by_key.get(key.cheap, ())
            call = next((c for c in same if c.key and key.matches(c.key, retry)), None)
            if call is None:
                replay = self._replay.get(key, retry)
            if epoch != self._epoch:  # its episode ended while it was read: never a step
                call, replay, stale = None, None, True
            elif call is None and replay is None:
                if len(self._open) < self.config.max_pending:
                    call = PendingCall(seq, request, path, side)
                    call.key = key
                    call.timer = asyncio.get_running_loop().call_later(
                        self.config.policy_timeout_s, self._expire, call
                    )
                    self._open[call.request_id] = call
                    self._by_key.setdefault(key.cheap, []).append(call)
                    self._unclaimed.append(call)
                    self._set_wake()
            elif call is not None:
                call.retries += 1
        if stale:
            await unauthorized(send, path)
        elif replay is not None:
            writer = AnswerWriter(request)
            writer.answer_id, writer.created = replay.answer_id, replay.created
            await write_whole(send, writer, replay.completion, replay.usage)
            self.last_activity = time.monotonic()
        elif call is None:
            why = f"{self.config.max_pending} model calls already wait for the policy (max_pending)"
            self._log_call(epoch, seq, request, path, side, None, 429, why, time.time())
            await send_json(send, 429, error_body(request.api, 429, why))
        else:
            exchange = Exchange(send, request, call, conn)
            if await hold(call, exchange, receive, self.config.keepalive_s):
                self.last_activity = time.monotonic()

    def _expire(self, call: PendingCall) -> None:
        why = f"the policy did not answer within policy_timeout_s={self.config.policy_timeout_s}s"
        with self._lock:
            if call.finished:
                return
            self._finish(call, failure=(504, why))
            self._lapses.add(call.request_id)
        wake(call)
