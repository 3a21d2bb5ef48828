"""LoopbackServer: an ASGI app served over HTTP/1.1 on 127.0.0.1 from a thread of its own.

The MCP bridge and the model proxy both serve this way, each behind a
per-episode token; this module is the one copy of the socket, thread,
event-loop, connection and token handling they share (:class:`RotatingToken`).
uvicorn's HTTP/1.1 protocol parses the requests; the server around it is ours,
because uvicorn's ``Server`` polls for shutdown every 100 ms, sleeps on the way
out and bounds neither the connection count nor the time to send headers.

Bounds, so that an untrusted client on 127.0.0.1 cannot starve the env:

* a connection must send a request's complete headers within ``header_timeout_s``
  of opening (slowloris), and an idle keep-alive connection is closed after
  ``idle_timeout_s`` (plus ``header_timeout_s`` once it starts sending);
* at most ``max_connections`` (and at most an eighth of the open-file limit) are
  open; a new one evicts, oldest first, an idle unauthenticated connection, then a
  busy unauthenticated one, then an idle authenticated one. Busy authenticated
  connections are never evicted (the app marks a connection authenticated by
  setting :attr:`Connection.owner`).

Threads: the thread that calls ``start``/``stop`` owns the lifecycle and never
runs the loop. The server thread owns the event loop (:attr:`LoopbackServer.loop`):
the protocol, the app and the optional ``context`` all run on it; other threads reach
it only through ``asyncio.run_coroutine_threadsafe`` or ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import resource
import secrets
import socket
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from gym_harness.errors import HarnessError

__all__ = ["CONNECTION_KEY", "LoopbackServer", "RotatingToken"]

logger = logging.getLogger(__name__)

#: ``scope["state"][CONNECTION_KEY]`` is the request's :class:`Connection` (for the app).
CONNECTION_KEY = "gym_harness.connection"
#: A connection must send complete request headers this soon after it opens or idles.
HEADER_TIMEOUT_S = 3.0
#: An idle keep-alive connection is closed after this long (uvicorn's default too).
IDLE_TIMEOUT_S = 5.0
#: Most connections one server keeps open (capped further by the open-file limit).
MAX_CONNECTIONS = 128
_START_TIMEOUT_S = 10.0
_CANCEL_WAIT_S = 0.2
_BACKLOG = 128
# Shared by both servers; each adds its own. lifespan is never run: ``context`` replaces it.
_BASE_CONFIG: dict[str, Any] = {
    "log_config": None,
    "log_level": "warning",
    "access_log": False,
    "ws": "none",
    "http": "h11",
    "proxy_headers": False,
    "lifespan": "off",
    "timeout_keep_alive": IDLE_TIMEOUT_S,
}
_OURS = ("timeout_graceful_shutdown",)  # read here, not passed to uvicorn.Config


class _State(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class RotatingToken:
    """Mixin: the secret a loopback server's clients must present, replaced per episode."""

    def __init__(self) -> None:
        self._token = secrets.token_urlsafe(32)

    @property
    def token(self) -> str:
        """The token a client must present (pass it via the environment, not argv)."""
        return self._token

    def rotate_token(self) -> str:
        """Issue a new token; requests carrying the old one are refused from now on.

        Returns:
            The new token.
        """
        self._token = secrets.token_urlsafe(32)
        return self._token


def connection_cap(wanted: int = MAX_CONNECTIONS) -> int:
    """``wanted``, lowered to an eighth of the soft open-file limit (at least 8).

    An eighth leaves room for the burst asyncio accepts before evicting (its backlog),
    for the other loopback server, and for the harness's pipes at the next reset.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(8, min(wanted, soft // 8))


class _Table:
    """The open connections of one server, oldest first (loop thread only)."""

    def __init__(self, cap: int, header_timeout_s: float) -> None:
        self.cap = cap
        self.header_timeout_s = header_timeout_s
        self.open: dict[Any, None] = {}
        self.evicted = 0

    def admit(self, conn: Any) -> None:
        self.open[conn] = None
        while len(self.open) > self.cap:
            victim = self._victim(conn)
            self.evict(victim if victim is not None else conn)
            if victim is None:
                return

    def evict(self, conn: Any) -> None:
        self.open.pop(conn, None)
        self.evicted += 1
        conn.transport.abort()

    def _victim(self, newcomer: Any) -> Any:
        for rank in (0, 1, 2):
            for conn in self.open:
                if conn is not newcomer and conn.rank() == rank:
                    return conn
        return None


class _Coalescing:
    """A transport whose writes of one loop iteration leave in one ``send``.

    uvicorn writes a response's headers and body separately; on a loaded machine each
    send can hand the CPU to the woken client, so one send per response is faster.
    """

    __slots__ = ("_buffer", "_loop", "_scheduled", "_transport")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._buffer: list[bytes] = []
        self._scheduled = False

    def write(self, data: bytes) -> None:
        if data:
            self._buffer.append(data)
            if not self._scheduled:
                self._scheduled = True
                self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if self._buffer:
            data = b"".join(self._buffer) if len(self._buffer) > 1 else self._buffer[0]
            self._buffer.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._buffer.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Quiet:
    """uvicorn's per-connection logger, turned down to debug on ours."""

    level = logging.WARNING

    def log(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        logger.debug(msg, *args, **kwargs)

    def debug(self, msg: str, *args: Any, **kwargs: Any) -> None:
        logger.debug(msg, *args, **kwargs)

    info = warning = error = exception = debug


_QUIET = _Quiet()


def _connection_class() -> type:
    global _CONNECTION_CLASS
    if _CONNECTION_CLASS is None:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        class Connection(H11Protocol):
            """uvicorn's HTTP/1.1 protocol with a header deadline and a place in the table."""

            def __init__(self, config: Any, server_state: Any, table: _Table) -> None:
                super().__init__(config, server_state, {})
                # Untrusted clients can make uvicorn log at will (bad requests, cut calls).
                self.logger = _QUIET  # type: ignore[assignment]
                self.app_state = {CONNECTION_KEY: self}  # reaches the app as scope["state"]
                self.table = table
                #: Set by the app once a request authenticated: "" means untrusted.
                self.owner = ""
                self._deadline: asyncio.TimerHandle | None = None

            @property
            def busy(self) -> bool:
                return self.cycle is not None and not self.cycle.response_complete

            def rank(self) -> int | None:
                """Eviction order: lower goes first; ``None`` is never evicted."""
                if not self.owner:
                    return 1 if self.busy else 0
                return None if self.busy else 2

            def connection_made(self, transport: Any) -> None:
                super().connection_made(transport)
                self.transport = _Coalescing(transport, self.loop)  # type: ignore[assignment]
                self._arm(self.table.header_timeout_s)
                self.table.admit(self)

            def connection_lost(self, exc: Exception | None) -> None:
                self._disarm()
                self.table.open.pop(self, None)
                super().connection_lost(exc)

            def data_received(self, data: bytes) -> None:
                super().data_received(data)
                if self._deadline is not None and self.busy:  # the headers are complete
                    self._disarm()

            def on_response_complete(self) -> None:
                super().on_response_complete()
                if not self.transport.is_closing() and not self.busy:
                    self._arm(self.timeout_keep_alive + self.table.header_timeout_s)

            def _arm(self, delay: float) -> None:
                self._disarm()
                self._deadline = self.loop.call_later(delay, self._expire)

            def _disarm(self) -> None:
                if self._deadline is not None:
                    self._deadline.cancel()
                    self._deadline = None

            def _expire(self) -> None:
                self._deadline = None
                if not self.busy:
                    self.table.open.pop(self, None)
                    self.transport.abort()

        _CONNECTION_CLASS = Connection
    return _CONNECTION_CLASS


_CONNECTION_CLASS: type | None = None


class LoopbackServer:
    """Serve one ASGI app on ``127.0.0.1:<OS-chosen port>``; single use.

    Args:
        app: The ASGI application (``http`` scopes only; no lifespan is run).
        label: Names the server in errors and logs ("bridge", "model proxy").
        thread_name: Name of the server thread.
        error: Raised by :meth:`start`, with the cause chained.
        stop_timeout_s: How long :meth:`stop` waits for the thread to end.
        options: More ``uvicorn.Config`` keyword arguments; ``timeout_graceful_shutdown``
            is how long :meth:`stop` lets busy requests finish (default 0).
        context: Called on the server loop before serving; the async context manager it
            returns is entered around the whole serve (e.g. an HTTP client the app uses).
        header_timeout_s: See the module docstring.
        max_connections: See the module docstring (lowered by :func:`connection_cap`).
    """

    def __init__(
        self,
        app: Any,
        *,
        label: str,
        thread_name: str,
        error: type[HarnessError],
        stop_timeout_s: float,
        options: Mapping[str, Any] | None = None,
        context: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        options = {**_BASE_CONFIG, **(options or {})}
        self._grace_s = float(options.pop("timeout_graceful_shutdown", None) or 0.0)
        options["lifespan"] = "off"
        self._app = app
        self._label = label
        self._thread_name = thread_name
        self._error = error
        self._stop_timeout_s = stop_timeout_s
        self._options = options
        self._context = context
        self._table = _Table(connection_cap(max_connections), header_timeout_s)
        self._state = _State.NEW
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stopping = asyncio.Event()  # set on the loop by stop(); bound to no loop yet
        self._failure: list[BaseException] = []
        self.port = 0

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The server thread's event loop while it serves, else ``None``."""
        return self._loop if self.alive else None

    @property
    def alive(self) -> bool:
        """True while started, not stopped, and the server thread still runs its loop."""
        thread = self._thread
        return (
            self._state is _State.RUNNING
            and thread is not None
            and thread.is_alive()
            and not self._failure
        )

    @property
    def failure(self) -> str:
        """Why the server thread died on its own ("" while alive or stopped by :meth:`stop`)."""
        if self._failure:
            return f"the {self._label}'s event loop died: {self._failure[0]!r}"
        thread = self._thread
        if self._state is _State.RUNNING and thread is not None and not thread.is_alive():
            return f"the {self._label}'s thread ended on its own"
        return ""

    @property
    def connections(self) -> list[Any]:
        """The open connections, oldest first (read on the loop thread)."""
        return list(self._table.open)

    @property
    def max_connections(self) -> int:
        """The connection cap in force."""
        return self._table.cap

    def start(self) -> None:
        """Bind, start the server thread and wait (bounded) until it serves.

        Raises:
            HarnessError: Of the ``error`` class given: the socket, loop or thread could
                not be made, or the server did not start in time (cause chained).
        """
        if self._state is not _State.NEW:
            raise self._error(f"this {self._label} server was already started")
        import uvicorn

        config = uvicorn.Config(self._app, **self._options)
        config.load()
        sock: socket.socket | None = None
        try:
            # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP.
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
            sock.listen(_BACKLOG)
            sock.setblocking(False)
            loop = asyncio.new_event_loop()
        except OSError as exc:
            if sock is not None:
                sock.close()
            raise self._error(
                f"cannot open the {self._label}'s socket on 127.0.0.1 or its event loop: {exc}"
            ) from exc
        self.port = sock.getsockname()[1]
        loop.set_exception_handler(self._quiet_exception_handler)
        thread = threading.Thread(
            target=self._serve, args=(loop, config, sock), name=self._thread_name, daemon=True
        )
        self._thread, self._loop = thread, loop
        self._state = _State.RUNNING
        try:
            thread.start()
        except RuntimeError as exc:  # "can't start new thread"
            loop.close()
            sock.close()
            self._state, self._thread, self._loop = _State.STOPPED, None, None
            raise self._error(f"cannot start the {self._label} thread: {exc}") from exc
        self._ready.wait(_START_TIMEOUT_S)
        if not self._ready.is_set() or self._failure:
            self.stop()
            cause = self._failure[0] if self._failure else None
            raise self._error(
                f"the {self._label} did not start on port {self.port}: {cause!r}"
            ) from cause

    def stop(self) -> None:
        """Close the listener and every connection, end the thread; bounded, never raises."""
        if self._state is not _State.RUNNING:
            return
        self._state = _State.STOPPED
        thread, loop, stopping = self._thread, self._loop, self._stopping
        try:
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(stopping.set)
            if thread is not None:
                thread.join(self._stop_timeout_s + self._grace_s)
                if thread.is_alive():
                    logger.warning(
                        "the %s thread did not stop in time; left as a daemon", self._label
                    )
        except Exception:  # stop must never raise; the thread is a daemon anyway
            logger.debug("error while stopping the %s", self._label, exc_info=True)
        self._thread, self._loop = None, None

    def nodelay_of_connections(self) -> list[bool]:
        """TCP_NODELAY of each open server-side connection (a diagnostic for tests)."""
        loop = self.loop
        if loop is None:
            return []

        async def probe() -> list[bool]:
            out = []
            for conn in self.connections:
                sock = conn.transport.get_extra_info("socket")
                out.append(bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
            return out

        return asyncio.run_coroutine_threadsafe(probe(), loop).result(5.0)

    def close_connections(self) -> None:
        """Close every open connection now, busy or not (loop thread only)."""
        for conn in list(self._table.open):
            self._table.open.pop(conn, None)
            conn.transport.abort()

    # -- the server thread --------------------------------------------------------------

    def _serve(self, loop: asyncio.AbstractEventLoop, config: Any, sock: socket.socket) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._run(loop, config, sock))
        except BaseException as exc:  # reported to the owner (start, failure), never raised here
            self._failure.append(exc)
        finally:
            try:
                self.close_connections()  # after a crash, the serve's own cleanup never ran
                loop.run_until_complete(asyncio.sleep(0))  # let the aborted sockets close
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for task in pending:
                    task.cancel()
                if pending:
                    # Abandoned work (a hung sync tool's call) may never finish; don't wait long.
                    loop.run_until_complete(asyncio.wait(pending, timeout=_CANCEL_WAIT_S))
                closing = loop.create_task(loop.shutdown_asyncgens())
                loop.run_until_complete(asyncio.wait([closing], timeout=_CANCEL_WAIT_S))
            except BaseException as exc:  # a dying loop: keep the first cause, close anyway
                self._failure.append(exc)
            finally:
                asyncio.set_event_loop(None)
                loop.close()
                sock.close()
                self._ready.set()

    async def _run(self, loop: asyncio.AbstractEventLoop, config: Any, sock: socket.socket) -> None:
        from uvicorn.server import ServerState

        state = ServerState()
        cls = _connection_class()
        context = self._context() if self._context is not None else contextlib.nullcontext()
        async with context:
            server = await loop.create_server(
                lambda: cls(config, state, self._table), sock=sock, backlog=_BACKLOG
            )
            self._ready.set()
            try:
                await self._stopping.wait()
            finally:
                server.close()
                await self._drain(state)

    async def _drain(self, state: Any) -> None:
        busy = [conn for conn in self._table.open if conn.busy]
        for conn in list(self._table.open):
            if not conn.busy:
                self._table.open.pop(conn, None)
                conn.transport.abort()
        if busy and self._grace_s > 0 and state.tasks:
            for conn in busy:
                conn.shutdown()  # close once the response is out
            await asyncio.wait(list(state.tasks), timeout=self._grace_s)
        self.close_connections()
        tasks = [t for t in state.tasks if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_CANCEL_WAIT_S)

    def _quiet_exception_handler(
        self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]
    ) -> None:
        # Stray errors (a hung tool finishing against a closed loop...) are no one's to handle.
        logger.debug(
            "%s loop: %s", self._label, context.get("message"), exc_info=context.get("exception")
        )
