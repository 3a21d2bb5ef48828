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
  open; busy authenticated connections are never evicted (see
  :mod:`gym_harness.loopback.connections`, which holds the per-connection side);
* :meth:`LoopbackServer.stop` closes every connection at once, waits at most
  ``timeout_graceful_shutdown`` for busy requests, and never sleeps.

Threads: the thread that calls ``start``/``stop`` owns the lifecycle and never
runs the loop. The server thread owns the event loop (:attr:`LoopbackServer.loop`):
the protocol, the app and the optional ``context`` all run on it; other threads reach
it only through ``asyncio.run_coroutine_threadsafe`` or ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from typing import Any, TypeVar

from gym_harness.errors import BridgeError, HarnessError
from gym_harness.lifecycle import Lifecycle
from gym_harness.loopback.connections import (
    HEADER_TIMEOUT_S,
    MAX_CONNECTIONS,
    Table,
    connection_cap,
    connection_class,
)
from gym_harness.loopback.quick import QuickPath

__all__ = ["IDLE_TIMEOUT_S", "LoopbackServer", "RotatingToken", "listening_with", "run_sync"]

_T = TypeVar("_T")

logger = logging.getLogger(__name__)

#: An idle keep-alive connection is closed after this long (uvicorn's default too).
IDLE_TIMEOUT_S = 5.0
_START_TIMEOUT_S = 10.0
_CANCEL_WAIT_S = 0.2
_BACKLOG = 128
#: Makes the listening socket of the servers this thread starts (``listening_with``).
_LISTENER: ContextVar[Callable[[], socket.socket] | None] = ContextVar(
    "gym_harness_listener", default=None
)
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


class _ShutdownNoise(logging.Filter):
    """Drops uvicorn's reports of the requests our own ``stop`` cancels.

    A harness may hold a request open (a tool call, an SSE stream) when its server
    stops; uvicorn then logs "Cancel N running task(s)" and, for each task, "Exception
    in ASGI application" with a ``CancelledError`` traceback at ERROR. With no logging
    configured, Python prints those to the terminal. They are expected, so they are
    kept at DEBUG on our logger; records from anyone else's uvicorn pass untouched
    (only our server threads are filtered, by name).
    """

    threads: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if threading.current_thread().name not in self.threads:
            return True
        cancelled = record.exc_info is not None and isinstance(
            record.exc_info[1], asyncio.CancelledError
        )
        if cancelled or "graceful shutdown exceeded" in record.getMessage():
            logger.debug("while stopping: %s", record.getMessage())
            return False
        return True


_shutdown_noise = _ShutdownNoise()


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


@contextlib.contextmanager
def listening_with(make: Callable[[], socket.socket] | None) -> Iterator[None]:
    """Servers started in this block listen on ``make()``'s bound socket (an env's
    network namespace) instead of a new one on ``127.0.0.1``; ``None`` changes nothing."""
    token = _LISTENER.set(make)
    try:
        yield
    finally:
        _LISTENER.reset(token)


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
        quick: What of ``app`` answers plain requests the short way
            (:mod:`gym_harness.loopback.quick`), if anything.
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
        quick: QuickPath | None = None,
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
        self._quick = quick
        self._table = Table(connection_cap(max_connections), header_timeout_s)
        self._state = Lifecycle.NEW
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
            self._state is Lifecycle.RUNNING
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
        if self._state is Lifecycle.RUNNING and thread is not None and not thread.is_alive():
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
        if self._state is not Lifecycle.NEW:
            raise self._error(f"this {self._label} server was already started")
        import uvicorn

        _ShutdownNoise.threads.add(self._thread_name)
        uvicorn_errors = logging.getLogger("uvicorn.error")
        if _shutdown_noise not in uvicorn_errors.filters:
            uvicorn_errors.addFilter(_shutdown_noise)
        config = uvicorn.Config(self._app, **self._options)
        config.load()
        sock: socket.socket | None = None
        try:
            # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP.
            make = _LISTENER.get()
            if make is not None:
                sock = make()
            else:
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
        self._state = Lifecycle.RUNNING
        try:
            thread.start()
        except RuntimeError as exc:  # "can't start new thread"
            loop.close()
            sock.close()
            self._state, self._thread, self._loop = Lifecycle.STOPPED, None, None
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
        if self._state is not Lifecycle.RUNNING:
            return
        self._state = Lifecycle.STOPPED
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

    def close_connections(self) -> None:
        """Close every open connection now, busy or not (loop thread only)."""
        for conn in list(self._table.open):
            self._table.drop(conn)

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
        cls = connection_class()
        context = self._context() if self._context is not None else contextlib.nullcontext()
        async with context:
            server = await loop.create_server(
                lambda: cls(config, state, self._table, self._quick), sock=sock, backlog=_BACKLOG
            )
            self._ready.set()
            try:
                await self._stopping.wait()
            finally:
                server.close()
                await self._drain(state)

    async def _drain(self, state: Any) -> None:
        if self._grace_s > 0 and state.tasks:
            for conn in list(self._table.open):
                conn.shutdown()  # idle ones close now, busy ones once their response is out
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


def run_sync(coro_factory: Callable[[], Coroutine[Any, Any, _T]], timeout_s: float = 30.0) -> _T:
    """Run a coroutine to completion from synchronous code, whatever loop is running.

    The coroutine runs on a private event loop in a short-lived worker thread, so
    this works in a thread that already runs a loop (Jupyter) and never touches it.

    Args:
        coro_factory: Makes the coroutine (called in the worker thread).
        timeout_s: How long to wait before giving up.

    Returns:
        The coroutine's result.

    Raises:
        BridgeError: The coroutine did not finish within ``timeout_s``.
        Exception: Whatever the coroutine raised.
    """
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = asyncio.run(coro_factory())
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=work, name="gym-harness-run-sync", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise BridgeError(f"a tool-server call did not finish within {timeout_s}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
