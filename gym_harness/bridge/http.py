"""The bridge's HTTP face: one ASGI app in front of mcp's streamable-HTTP session manager.

It replaces fastmcp's ``http_app`` (Starlette routing and middleware) with the
checks the bridge needs, in this order, each answered at once with
``Connection: close``:

1. ``Host`` and ``Origin`` name this loopback server (DNS-rebinding protection):
   421 and 403 otherwise;
2. ``Authorization: Bearer <current token>``: 401 otherwise; the connection is then
   marked authenticated (see :mod:`gym_harness.loopback.server`);
3. the path is ``/mcp``: 404 otherwise;
4. the body fits ``max_body_bytes``: 413 otherwise, read no further than the limit
   (a declared ``Content-Length`` is checked before reading);
5. a request opening a session (``initialize`` of the session-based protocol versions:
   no ``mcp-session-id``) fits the token's session cap: 429 with a JSON-RPC error
   otherwise. Later protocol versions are stateless and open no session.

A plain stateless-era ``tools/call`` (most of a harness's requests) is answered the short
way, with the bytes mcp would send (:mod:`gym_harness.bridge.fast_call`); every other
request goes to mcp's session manager.

Sessions belong to the token that opened them: :meth:`BridgeHTTP.close_all`, run at
each token rotation, closes every session and connection. Responses are JSON, not
SSE (every compliant client accepts JSON: mcp's SSE mode requires it too).

Threads: everything here runs on the bridge loop.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from gym_harness.bridge.fast_call import MODERN_VERSION, PlainCall, answer, plain_tool_call
from gym_harness.loopback.connections import CONNECTION_KEY

if TYPE_CHECKING:
    from fastmcp import FastMCP

__all__ = ["MCP_PATH", "BridgeHTTP"]

MCP_PATH = "/mcp"
_LOOPBACK_NAMES = (b"127.0.0.1", b"localhost", b"[::1]")
_SESSION_HEADER = b"mcp-session-id"
_JSON = b"application/json"
_MCP_TARGET = MCP_PATH.encode()
MODERN = MODERN_VERSION.encode()
# The token of the request being served, read where mcp registers a session.
_REQUEST_TOKEN: contextvars.ContextVar[str] = contextvars.ContextVar("bridge_request_token")


class Owner(Protocol):
    """What the front end needs of the bridge that owns it (``MCPBridge``)."""

    #: Stamped on every authenticated request (a sign of life for the turn runner).
    last_activity: float

    @property
    def token(self) -> str:
        """The current episode's bearer token."""
        ...

    def close_connections(self) -> None:
        """Close every open connection of the bridge's server."""
        ...


class BridgeHTTP:
    """ASGI app: guard, per-token session table, mcp session manager.

    Args:
        bridge: The owning bridge (its token, activity stamps).
        server: The FastMCP server of the served tools.
        max_sessions: Sessions one token may have open at once.
        max_body_bytes: Largest request body accepted.
        tool_workers: Worker threads for sync tools (the loop's anyio thread limiter).
        fast_tools: The tools a plain ``tools/call`` may reach the short way
            (:mod:`gym_harness.bridge.fast_call`).
    """

    def __init__(
        self,
        bridge: Owner,
        server: FastMCP,
        *,
        max_sessions: int,
        max_body_bytes: int,
        tool_workers: int,
        fast_tools: frozenset[str] = frozenset(),
    ) -> None:
        self.bridge = bridge
        self.fast_tools = fast_tools
        #: Plain ``tools/call`` requests answered the short way so far.
        self.plain_calls = 0
        #: Of those, the ones read without h11 (``gym_harness.loopback.quick``).
        self.quick_calls = 0
        self.server = server
        self.max_sessions = max_sessions
        self.max_body_bytes = max_body_bytes
        self.tool_workers = tool_workers
        self.port = 0
        self.manager: Any = None
        #: session id -> the token that opened it.
        self.sessions: dict[str, str] = {}
        self._opening = 0
        self._expected = (b"", b"")

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Run the session manager around the serve (the LoopbackServer ``context``)."""
        import anyio.to_thread
        from mcp.server.transport_security import TransportSecuritySettings

        # Sync tools run on anyio's worker threads; the limiter bounds how many exist.
        anyio.to_thread.current_default_thread_limiter().total_tokens = self.tool_workers
        manager = _manager_class()(
            app=self.server._mcp_server,
            json_response=True,
            stateless=False,
            # Host and Origin are checked here, before mcp sees the request.
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_request_body_size=self.max_body_bytes,
            max_sessions=4 * self.max_sessions,  # a backstop; the per-token cap is ours
        )
        manager.owner = self
        async with manager.run():
            self.manager = manager
            try:
                yield
            finally:
                await self.close_all()
                self.manager = None

    async def close_all(self) -> None:
        """Close every session and every connection (the token just changed)."""
        manager = self.manager
        if manager is not None:
            for session_id in list(manager._server_instances):
                transport = manager._server_instances.get(session_id)
                if transport is not None:
                    await manager._discard_session(session_id, transport)
        self.sessions.clear()
        self.bridge.close_connections()

    def session_count(self, token: str) -> int:
        """Open sessions of ``token``."""
        return sum(1 for owner in self.sessions.values() if owner == token)

    # -- requests ------------------------------------------------------------------------

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        host, origin, supplied, session, length, version = _guarded(scope["headers"])
        if host is None or not self._local(host):
            await _refuse(send, 421, b"Misdirected Request")
            return
        if origin is not None and not self._local_origin(origin):
            await _refuse(send, 403, b"Forbidden Origin")
            return
        token = self._authorized(supplied)
        if token is None:
            await _refuse(
                send, 401, b"invalid or missing bearer token",
                [(b"www-authenticate", b'Bearer realm="gym_harness"')],
            )  # fmt: skip
            return
        conn = scope["state"].get(CONNECTION_KEY)
        if conn is not None:
            conn.owner = token
        self.bridge.last_activity = time.monotonic()
        if scope["path"] != MCP_PATH:
            await _refuse(send, 404, b"Not Found")
            return
        if scope["method"] == "POST":
            if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
                await _refuse(send, 413, self._too_large())
                return
            body = await self._read_body(receive)
            if body is None:
                await _refuse(send, 413, self._too_large())
                return
            if session is None and version == MODERN and self.fast_tools:
                call = plain_tool_call(body, scope["headers"], self.fast_tools)
                if call is not None:
                    await self._answer_plain(call, scope, send)
                    return
            receive = _replay(body, receive)
            if session is None and (version is None or version in _handshake_versions()):
                await self._open_session(token, body, scope, receive, send)
                return
        await self._serve(token, scope, receive, send)

    def _authorized(self, supplied: bytes | None) -> str | None:
        """The bridge's token when ``supplied`` is its ``Authorization`` header, else ``None``."""
        token = self.bridge.token
        if self._expected[0] != token.encode():
            self._expected = (token.encode(), b"Bearer " + token.encode())
        if supplied is None or not hmac.compare_digest(supplied, self._expected[1]):
            return None
        return token

    # -- the short way (gym_harness.loopback.quick) ----------------------------------------

    def quick_head(self, conn: Any, target: bytes, headers: list[tuple[bytes, bytes]]) -> bool:
        """True for a session-less, authenticated stateless-era ``POST /mcp`` within bounds.

        Anything else is declined, and answered the whole way (refusals included).
        """
        if target != _MCP_TARGET or not self.fast_tools:
            return False
        host, origin, supplied, session, length, version = _guarded(headers)
        if session is not None or version != MODERN or length is None:
            return False
        if not length.isdigit() or int(length) > self.max_body_bytes:
            return False
        if (
            host is None
            or not self._local(host)
            or (origin is not None and not self._local_origin(origin))
        ):
            return False
        token = self._authorized(supplied)
        if token is None:
            return False
        conn.owner = token
        self.bridge.last_activity = time.monotonic()
        return True

    def quick_call(
        self, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Awaitable[tuple[int, bytes, bytes]] | None:
        """The answer to a plain ``tools/call`` (``fast_call``), or ``None`` to decline."""
        call = plain_tool_call(body, headers, self.fast_tools)
        if call is None:
            return None
        self.plain_calls += 1
        self.quick_calls += 1
        return self._quick_answer(call, headers)

    async def _quick_answer(
        self, call: PlainCall, headers: list[tuple[bytes, bytes]]
    ) -> tuple[int, bytes, bytes]:
        scope = {
            "type": "http", "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": MCP_PATH, "raw_path": _MCP_TARGET, "root_path": "", "query_string": b"",
            "headers": headers, "server": ("127.0.0.1", self.port), "client": None,
        }  # fmt: skip
        status, data = await self._run_plain(call, scope)
        return status, _JSON, data

    async def _open_session(self, token: str, body: bytes, *args: Any) -> None:
        if self.session_count(token) + self._opening >= self.max_sessions:
            message = (
                f"too many MCP sessions: this episode already opened {self.max_sessions}, "
                f"the bridge's per-episode limit (HarnessConfig.max_mcp_sessions); reuse an "
                f"open session or end one with DELETE"
            )
            await _refuse_jsonrpc(args[2], _request_id(body), message)
            return
        self._opening += 1
        try:
            await self._serve(token, *args)
        finally:
            self._opening -= 1

    async def _serve(self, token: str, scope: Any, receive: Any, send: Any) -> None:
        set_transport, reset_transport, set_http_request, Request = _fastmcp_context()
        reset = _REQUEST_TOKEN.set(token)
        transport = set_transport("streamable-http")
        try:
            with set_http_request(Request(scope)):
                await self.manager.handle_request(scope, receive, send)
        finally:
            reset_transport(transport)
            _REQUEST_TOKEN.reset(reset)

    async def _run_plain(self, call: PlainCall, scope: Any) -> tuple[int, bytes]:
        """Run a plain ``tools/call`` (with the context fastmcp's app sets)."""
        set_transport, reset_transport, set_http_request, Request = _fastmcp_context()
        transport = set_transport("streamable-http")
        try:
            with set_http_request(Request(scope)):
                return await answer(self.server, call)
        finally:
            reset_transport(transport)

    async def _answer_plain(self, call: PlainCall, scope: Any, send: Any) -> None:
        """A plain ``tools/call`` that came the whole way through h11 (split, pipelined...)."""
        self.plain_calls += 1
        status, data = await self._run_plain(call, scope)
        headers = [(b"content-length", str(len(data)).encode()), (b"content-type", _JSON)]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    async def _read_body(self, receive: Any) -> bytes | None:
        """The whole body, or ``None`` as soon as it passes the limit."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    def _local(self, authority: bytes) -> bool:
        if authority.endswith(b"]") or b":" not in authority:
            name, port = authority, b""
        else:
            name, _, port = authority.rpartition(b":")
        return name in _LOOPBACK_NAMES and port in (b"", str(self.port).encode())

    def _local_origin(self, origin: bytes) -> bool:
        return origin.startswith(b"http://") and self._local(origin[len(b"http://") :])

    def _too_large(self) -> bytes:
        return f"request body larger than {self.max_body_bytes} bytes".encode()


@functools.cache
def _handshake_versions() -> frozenset[bytes]:
    """Protocol versions of the session-based (``initialize``) era; later ones are stateless."""
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    return frozenset(v.encode() for v in HANDSHAKE_PROTOCOL_VERSIONS)


def _request_id(body: bytes) -> Any:
    try:
        message = json.loads(body)
    except ValueError:
        return None
    return message.get("id") if isinstance(message, dict) else None


def _replay(body: bytes, receive: Any) -> Any:
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


#: The request headers the guard reads, in the order ``_guarded`` returns them.
_GUARDED = (
    b"host", b"origin", b"authorization", _SESSION_HEADER, b"content-length",
    b"mcp-protocol-version",
)  # fmt: skip
_GUARDED_AT = {name: index for index, name in enumerate(_GUARDED)}


def _guarded(headers: Iterable[tuple[bytes, bytes]]) -> list[bytes | None]:
    """The ``_GUARDED`` headers' values, in its order (``None`` where absent; the last wins)."""
    found: list[bytes | None] = [None] * len(_GUARDED)
    for key, value in headers:
        index = _GUARDED_AT.get(key)
        if index is not None:
            found[index] = value
    return found


async def _refuse(
    send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer and close: the rest of the request (an unread body...) is never read."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _refuse_jsonrpc(send: Any, request_id: Any, message: str) -> None:
    body = json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32000, "message": message}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 429,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


@functools.cache
def _fastmcp_context() -> tuple[Any, Any, Any, Any]:
    """What fastmcp's own HTTP app sets per request, so tools see the same context."""
    from fastmcp.server.context import reset_transport, set_transport
    from fastmcp.server.http import set_http_request
    from starlette.requests import Request

    return set_transport, reset_transport, set_http_request, Request


def _manager_class() -> type:
    global _MANAGER_CLASS
    if _MANAGER_CLASS is None:
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        class SessionManager(StreamableHTTPSessionManager):
            """Records which token opened each session; refuses sessions of a stale token."""

            owner: BridgeHTTP

            def _admit_session(self, requestor: Any) -> Any:
                token = _REQUEST_TOKEN.get("")
                if token != self.owner.bridge.token:  # rotated while the request waited
                    return None
                transport = super()._admit_session(requestor)
                if transport is not None and transport.mcp_session_id is not None:
                    self.owner.sessions[transport.mcp_session_id] = token
                return transport

            async def _discard_session(self, session_id: str, transport: Any) -> None:
                self.owner.sessions.pop(session_id, None)
                await super()._discard_session(session_id, transport)

        _MANAGER_CLASS = SessionManager
    return _MANAGER_CLASS


_MANAGER_CLASS: type | None = None
