"""One model call in flight on the model endpoint, and the HTTP pieces that answer it.

:class:`PendingCall` is what the env hands the policy (``ModelEndpoint.next_request``);
:class:`Exchange` is one HTTP exchange waiting on a call (a retry opens another);
:func:`other_answer` answers what is no model call.

Threads: see :class:`PendingCall`; :class:`Exchange` and the ``async`` helpers run on the
endpoint's server loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from typing import Any

from gym_harness.capture.http import send_json
from gym_harness.model.action import ActionLimits, Completion, parse_action
from gym_harness.model.answer import AnswerWriter, Usage, error_body
from gym_harness.model.calls import CallKey
from gym_harness.model.request import ModelRequest

__all__ = [
    "Exchange",
    "PendingCall",
    "WakeFlag",
    "end_answer",
    "flush",
    "hold",
    "other_answer",
    "send_other",
    "start_answer",
    "wake",
    "write_whole",
]

_LIMITS = ActionLimits()


class PendingCall:
    """One main model call waiting for the policy's answer.

    Attributes:
        request_id: The id to pass to :meth:`ModelEndpoint.deliver` (also in the observation).
        request: The request as read (api, tools, stream form, ...).
        observation: ``request.observation()``: what the policy sees.
        observation_text: Its JSON text (the env's observation).
        path: The request path.
        side: The adapter's ``side_call`` said it is a side call (only with ``model_calls="all"``).
        started: Wall-clock time it arrived.
        retries: Retries of the harness that joined it so far.

    Threads: created on the server loop. ``claimed``, ``retries``, ``answer`` and
    ``failure`` change only under the endpoint's lock; ``exchange`` and ``timer``
    belong to the loop.
    """

    def __init__(self, seq: int, request: ModelRequest, path: str, side: bool) -> None:
        self.seq = seq
        self.request_id = request.request_id
        self.request = request
        self.observation = request.observation()
        self.path = path
        self.side = side
        self.started = time.time()
        self.retries = 0
        self.key: CallKey | None = None  # set by the endpoint: how its retries are known
        self.claimed = False
        # The answer's ids, shared by every connection's writer (a retry's too).
        first = AnswerWriter(request)
        self.answer_id, self.created = first.answer_id, first.created
        # Set once, under the lock: (completion, usage) or (status, message).
        self.answer: tuple[Completion, Usage] | None = None
        self.failure: tuple[int, str] | None = None
        self.exchange: Exchange | None = None
        self.timer: asyncio.TimerHandle | None = None

    @property
    def observation_text(self) -> str:
        """The observation as JSON text (``request.observation_text()``)."""
        return self.request.observation_text()

    @property
    def finished(self) -> bool:
        """Answered, failed, cut or timed out: no longer waiting."""
        return self.answer is not None or self.failure is not None

    def parse(self, action: str, limits: ActionLimits = _LIMITS) -> Completion:
        """The policy's action as a completion of this call (:func:`parse_action`).

        Raises:
            InvalidAction: The action fails validation against this request.
        """
        return parse_action(
            action, api=self.request.api, tool_names=self.request.tool_names, limits=limits
        )

    def writer(self, request: ModelRequest) -> AnswerWriter:
        """A writer for ``request`` (this call's, or a retry's) with this call's ids."""
        writer = AnswerWriter(request)
        writer.answer_id, writer.created = self.answer_id, self.created
        return writer

    def __repr__(self) -> str:
        return f"PendingCall({self.request_id!r}, api={self.request.api!r}, side={self.side})"


class Exchange:
    """One HTTP exchange waiting on a call (server loop only)."""

    def __init__(self, send: Any, request: ModelRequest, call: PendingCall, conn: Any) -> None:
        self.send = send
        self.request = request
        self.writer = call.writer(request)
        self.conn = conn
        self.wake = asyncio.Event()
        self.superseded = False


async def hold(call: PendingCall, ex: Exchange, receive: Any, keepalive_s: float) -> bool:
    """Hold one exchange of ``call`` open until its answer, a retry, a drop or a cut.

    A streamed exchange opens at once and gets the API's keep-alive every
    ``keepalive_s``. A newer exchange of the same call (a retry) takes over: the older
    one's connection is closed. A dropped connection ends the exchange, not the call.

    Returns:
        True when the answer (or the call's error) was written.
    """
    old, call.exchange = call.exchange, ex
    if old is not None:  # the harness retried: the newest connection gets the answer
        old.superseded = True
        old.wake.set()
    sse = ex.request.sse
    if sse:
        await start_answer(ex.send, ex.writer)
        await ex.send({"type": "http.response.body", "body": ex.writer.head(), "more_body": True})
    disconnect = asyncio.ensure_future(receive())
    waiter: asyncio.Future[Any] | None = None
    try:
        while not (call.finished or ex.superseded):
            waiter = asyncio.ensure_future(ex.wake.wait())
            done, _ = await asyncio.wait(
                {waiter, disconnect}, timeout=keepalive_s, return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()
            ex.wake.clear()
            if disconnect in done:  # the call stays: a retry may come
                return False
            if not done and sse and not call.finished:
                beat = ex.writer.keepalive()
                await ex.send({"type": "http.response.body", "body": beat, "more_body": True})
        if ex.superseded:
            if ex.conn is not None:
                ex.conn.table.drop(ex.conn)  # closes the socket of the older connection
            return False
        await _write_result(call, ex)
        return True
    finally:
        if waiter is not None:
            waiter.cancel()
        disconnect.cancel()
        if call.exchange is ex:
            call.exchange = None


async def _write_result(call: PendingCall, ex: Exchange) -> None:
    writer, sse = ex.writer, ex.request.sse
    if call.answer is not None:
        completion, usage = call.answer
        data = writer.body(completion, usage)
        if not sse:
            await start_answer(ex.send, writer, len(data))
        await end_answer(ex.send, data)
        return
    status, message = call.failure or (500, "no answer")
    if sse:
        await end_answer(ex.send, writer.fail(message))
    else:
        await send_json(ex.send, status, error_body(ex.request.api, status, message))


async def write_whole(
    send: Any, writer: AnswerWriter, completion: Completion, usage: Usage | None = None
) -> None:
    """Write a whole answer at once (a side call's, a replayed one)."""
    await start_answer(send, writer)
    await end_answer(send, writer.head() + writer.body(completion, usage))


class WakeFlag:
    """A pipe that is readable exactly while the flag is set (for the caller's ``poll``).

    Threads: :meth:`set` and :meth:`close` under the owner's lock; :attr:`fd` anywhere.
    """

    def __init__(self) -> None:
        self.fd, self._write = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write, False)
        self._set = self._closed = False

    def set(self, value: bool) -> None:
        """Raise or lower the flag."""
        if self._closed or value == self._set:
            return
        try:
            if value:
                os.write(self._write, b"!")
            else:
                os.read(self.fd, 64)
        except OSError:  # closed
            return
        self._set = value

    def close(self) -> None:
        """Close both ends (idempotent: a closed number may already be another file's)."""
        if self._closed:
            return
        self._closed = self._set = True  # never read or written again
        for fd in (self.fd, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)


def wake(call: PendingCall) -> None:
    """Wake the exchange waiting on ``call`` (server loop only)."""
    if call.timer is not None and call.finished:
        call.timer.cancel()
    if call.exchange is not None:
        call.exchange.wake.set()


async def flush(calls: list[PendingCall], timeout_s: float) -> None:
    """Wake the exchanges of ``calls`` and wait (at most ``timeout_s``) until they are written."""
    for call in calls:
        wake(call)
    deadline = time.monotonic() + timeout_s
    while any(c.exchange is not None for c in calls) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)


async def start_answer(send: Any, writer: AnswerWriter, length: int | None = None) -> None:
    headers = [(b"content-type", writer.content_type.encode())]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    elif writer.request.sse:
        headers.append((b"cache-control", b"no-cache"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})


async def end_answer(send: Any, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": False})


def other_answer(method: str, path: str) -> tuple[int, bytes]:
    """The answer to what is no model call: Claude Code's ``HEAD /``, model lists, token counts.

    Returns:
        ``(status, JSON body)``.
    """
    if path == "/":
        return 200, b"{}"
    if method == "GET" and path.endswith("/models"):
        return 200, json.dumps({"object": "list", "data": [], "models": []}).encode()
    if path.endswith("/count_tokens"):
        return 200, b'{"input_tokens": 1}'
    if path.endswith(":countTokens"):
        return 200, b'{"totalTokens": 1}'
    return 404, json.dumps({"error": {"message": f"no route for {method} {path}"}}).encode()


async def send_other(send: Any, method: str, path: str) -> None:
    status, data = other_answer(method, path)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else data})
