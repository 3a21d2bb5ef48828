"""A minimal loopback model endpoint whose answers come from ``gym_harness.model``.

Test scaffolding for model mode before the env serves it itself: every model call a
harness makes is read with :func:`read_request`, handed to a policy (observation dict
-> action str), checked with :func:`parse_action` and answered with
:class:`AnswerWriter`. A streamed answer opens before the policy is asked (the writer's
head), sends ``keepalives`` keep-alive events ``pause_s`` apart, then the body, so a real
CLI sees the bytes a slow policy would produce; an invalid action ends a started stream
with the writer's ``fail()`` and an unstreamed call with status 500.

Threads: ``ThreadingHTTPServer`` runs one thread per connection; the call log sits
behind a lock. ``stop()`` shuts the server and joins its threads, bounded.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gym_harness.model import (
    AnswerWriter,
    BadRequest,
    Completion,
    InvalidAction,
    error_body,
    other_answer,
    parse_action,
    read_request,
)
from gym_harness.records.exchanges import api_of
from support.model_server import QuietHandler, read_body, serve_in_thread

Policy = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class Call:
    """One model call: what the policy saw, what it said, what was sent back."""

    observation: dict[str, Any]
    action: str
    completion: Completion | None
    error: str
    answer: bytes


class ModelEndpoint:
    """Serve a harness's model calls from ``policy`` on 127.0.0.1.

    Args:
        policy: Observation dict -> action string.
        keepalives: Keep-alive events sent on a stream before its answer.
        pause_s: Pause before each keep-alive.
    """

    def __init__(self, policy: Policy, *, keepalives: int = 2, pause_s: float = 0.1) -> None:
        self.policy = policy
        self.keepalives = keepalives
        self.pause_s = pause_s
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self._count = 0
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ModelEndpoint:
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = serve_in_thread(self._httpd)
        return self

    def __exit__(self, *exc: object) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def calls(self) -> list[Call]:
        """The model calls served so far, in order."""
        with self._lock:
            return list(self._calls)

    # -- one request (handler thread) ----------------------------------------------------------

    def handle(self, h: _Handler) -> None:
        path, _, query = h.path.partition("?")
        raw = read_body(h)
        with self._lock:
            self._count += 1
            request_id = f"req-{self._count}"
        try:
            request = None if h.command != "POST" else read_request(
                path, raw, query=query, request_id=request_id
            )  # fmt: skip
        except BadRequest as exc:
            _send(h, 400, json.dumps(error_body(api_of(path), 400, str(exc))).encode())
            return
        if request is None:
            _send(h, *other_answer(h.command, path))
            return
        observation = request.observation()
        writer = AnswerWriter(request)
        if request.sse:  # open the stream before the policy answers, as a slow policy needs
            h.send_response(200)
            h.send_header("Content-Type", writer.content_type)
            h.send_header("Cache-Control", "no-cache")
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            _chunk(h, writer.head())
        action = self.policy(observation)
        try:
            completion = parse_action(action, api=request.api, tool_names=request.tool_names)
        except InvalidAction as exc:
            self._log(Call(observation, action, None, str(exc), b""))
            if request.sse:
                _chunk(h, writer.fail(str(exc)))
                h.wfile.write(b"0\r\n\r\n")
            else:
                _send(h, 500, json.dumps(error_body(request.api, 500, str(exc))).encode())
            return
        if not request.sse:
            data = writer.body(completion)
            self._log(Call(observation, action, completion, "", data))
            _send(h, 200, data)
            return
        sent = []
        for _ in range(self.keepalives):
            time.sleep(self.pause_s)
            sent.append(writer.keepalive())
            _chunk(h, sent[-1])
        sent.append(writer.body(completion))
        _chunk(h, sent[-1])
        h.wfile.write(b"0\r\n\r\n")
        self._log(Call(observation, action, completion, "", b"".join(sent)))

    def _log(self, call: Call) -> None:
        with self._lock:
            self._calls.append(call)


def _send(h: BaseHTTPRequestHandler, status: int, data: bytes) -> None:
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(data)


def _chunk(h: BaseHTTPRequestHandler, data: bytes) -> None:
    if data:
        h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        h.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: ModelEndpoint


class _Handler(QuietHandler):
    server: _Server

    def serve(self) -> None:
        self.server.owner.handle(self)
