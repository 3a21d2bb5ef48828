"""LoopbackServer: an ASGI app served by uvicorn on 127.0.0.1 from a thread of its own.

The MCP bridge and the model proxy both serve this way, each behind a
per-episode token; this module is the one copy of the socket, thread,
event-loop and token handling they share (:class:`RotatingToken`). uvicorn is
imported on :meth:`LoopbackServer.start`, not by ``import gym_harness``.

Threads: the thread that calls ``start``/``stop`` owns the lifecycle and never
runs the loop. The server thread owns the event loop (:attr:`LoopbackServer.loop`):
uvicorn, the app and the optional ``context`` all run on it; other threads reach
it only through ``asyncio.run_coroutine_threadsafe`` or ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from gym_harness.errors import HarnessError

__all__ = ["LoopbackServer", "RotatingToken"]

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 10.0
_START_POLL_S = 0.002
_FORCE_EXIT_WAIT_S = 0.5
_CANCEL_WAIT_S = 0.2
# Shared by both servers; each adds its own (lifespan, graceful shutdown, ...).
_BASE_CONFIG: dict[str, Any] = {
    "log_config": None,
    "log_level": "warning",
    "access_log": False,
    "ws": "none",
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


class LoopbackServer:
    """Serve one ASGI app on ``127.0.0.1:<OS-chosen port>``; single use.

    Args:
        app: The ASGI application.
        label: Names the server in errors and logs ("bridge", "model proxy").
        thread_name: Name of the server thread.
        error: Raised by :meth:`start`, with the cause chained.
        stop_timeout_s: How long :meth:`stop` waits for a graceful exit before forcing it.
        options: More ``uvicorn.Config`` keyword arguments (lifespan, graceful shutdown...).
        context: Called on the server loop before serving; the async context manager it
            returns is entered around the whole serve (e.g. an HTTP client the app uses).
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
    ) -> None:
        self._app = app
        self._label = label
        self._thread_name = thread_name
        self._error = error
        self._stop_timeout_s = stop_timeout_s
        self._options = {**_BASE_CONFIG, **(options or {})}
        self._context = context
        self._state = _State.NEW
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failure: list[BaseException] = []
        self.port = 0

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The server thread's event loop while running, else ``None``."""
        return self._loop if self._state is _State.RUNNING else None

    def start(self) -> None:
        """Bind, start the server thread and wait (bounded) until uvicorn serves.

        Raises:
            HarnessError: Of the ``error`` class given: the socket, loop or thread could
                not be made, or the server did not start in time (cause chained).
        """
        if self._state is not _State.NEW:
            raise self._error(f"this {self._label} server was already started")
        import uvicorn

        _ShutdownNoise.threads.add(self._thread_name)
        uvicorn_errors = logging.getLogger("uvicorn.error")
        if _shutdown_noise not in uvicorn_errors.filters:
            uvicorn_errors.addFilter(_shutdown_noise)
        server = uvicorn.Server(uvicorn.Config(self._app, **self._options))
        sock: socket.socket | None = None
        try:
            # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP.
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
            sock.listen(128)
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
            target=self._serve, args=(loop, server, sock), name=self._thread_name, daemon=True
        )
        self._server, self._thread, self._loop = server, thread, loop
        self._state = _State.RUNNING
        try:
            thread.start()
        except RuntimeError as exc:  # "can't start new thread"
            loop.close()
            sock.close()
            self._state, self._server, self._thread, self._loop = _State.STOPPED, None, None, None
            raise self._error(f"cannot start the {self._label} thread: {exc}") from exc
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(_START_POLL_S)
        if not server.started:
            self.stop()
            cause = self._failure[0] if self._failure else None
            raise self._error(
                f"the {self._label} did not start on port {self.port}: {cause!r}"
            ) from cause

    def stop(self) -> None:
        """Ask uvicorn to exit, then force it; bounded, idempotent, never raises."""
        if self._state is not _State.RUNNING:
            return
        self._state = _State.STOPPED
        server, thread = self._server, self._thread
        try:
            server.should_exit = True
            if thread is not None:
                thread.join(self._stop_timeout_s)
                if thread.is_alive():
                    server.force_exit = True
                    thread.join(_FORCE_EXIT_WAIT_S)
                if thread.is_alive():
                    logger.warning(
                        "the %s thread did not stop in time; left as a daemon", self._label
                    )
        except Exception:  # stop must never raise; the thread is a daemon anyway
            logger.debug("error while stopping the %s", self._label, exc_info=True)
        self._server, self._thread, self._loop = None, None, None

    def nodelay_of_connections(self) -> list[bool]:
        """TCP_NODELAY of each open server-side connection (a diagnostic for tests)."""
        server, loop = self._server, self.loop
        if server is None or loop is None:
            return []

        async def probe() -> list[bool]:
            out = []
            for conn in list(server.server_state.connections):
                sock = conn.transport.get_extra_info("socket")
                out.append(bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
            return out

        return asyncio.run_coroutine_threadsafe(probe(), loop).result(5.0)

    # -- the server thread --------------------------------------------------------------

    def _serve(self, loop: asyncio.AbstractEventLoop, server: Any, sock: socket.socket) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._run(server, sock))
        except BaseException as exc:  # reported to the starting thread, never raised here
            self._failure.append(exc)
        finally:
            try:
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for task in pending:
                    task.cancel()
                if pending:
                    # Abandoned work (a hung sync tool's call) may never finish; don't wait long.
                    loop.run_until_complete(asyncio.wait(pending, timeout=_CANCEL_WAIT_S))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()
                sock.close()

    async def _run(self, server: Any, sock: socket.socket) -> None:
        context = self._context() if self._context is not None else contextlib.nullcontext()
        async with context:
            await server.serve(sockets=[sock])

    def _quiet_exception_handler(
        self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]
    ) -> None:
        # Stray errors (a hung tool finishing against a closed loop...) are no one's to handle.
        logger.debug(
            "%s loop: %s", self._label, context.get("message"), exc_info=context.get("exception")
        )
