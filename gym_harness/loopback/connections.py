"""One HTTP/1.1 connection of a loopback server, and the table that bounds them.

:func:`connection_class` is uvicorn's HTTP/1.1 protocol (h11) with:

* a deadline: complete request headers within ``header_timeout_s`` of opening, or of
  going idle after a response plus the keep-alive time (slowloris);
* a place in a :class:`Table` of at most ``cap`` connections, which evicts, oldest
  first, an idle unauthenticated connection, then a busy unauthenticated one, then an
  idle authenticated one (the app sets :attr:`owner` once a request authenticated);
  busy authenticated connections are never evicted, nor authenticated ones whose
  complete answer is still being written (eviction aborts the socket, and would lose
  the bytes not yet sent);
* writes of one loop iteration sent together (:class:`_Coalescing`);
* uvicorn's per-connection log turned down to debug (clients are untrusted).

Threads: everything here runs on the server loop.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any, cast

__all__ = [
    "CONNECTION_KEY",
    "HEADER_TIMEOUT_S",
    "MAX_CONNECTIONS",
    "Table",
    "connection_cap",
    "connection_class",
]

logger = logging.getLogger(__name__)

#: ``scope["state"][CONNECTION_KEY]`` is the request's connection (for the app).
CONNECTION_KEY = "gym_harness.connection"
#: A connection must send complete request headers this soon after it opens or idles.
HEADER_TIMEOUT_S = 3.0
#: Most connections one server keeps open (capped further by the open-file limit).
MAX_CONNECTIONS = 128


def connection_cap(wanted: int = MAX_CONNECTIONS) -> int:
    """``wanted``, lowered to an eighth of the soft open-file limit (at least 8).

    An eighth leaves room for the burst asyncio accepts before evicting (its backlog),
    for the other loopback server, and for the harness's pipes at the next reset.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(8, min(wanted, soft // 8))


class Table:
    """The open connections of one server, oldest first (loop thread only)."""

    def __init__(self, cap: int, header_timeout_s: float) -> None:
        self.cap = cap
        self.header_timeout_s = header_timeout_s
        self.open: dict[Any, None] = {}

    def admit(self, conn: Any) -> None:
        """Add ``conn``; past the cap, evict others (or ``conn`` itself if none may go)."""
        self.open[conn] = None
        while len(self.open) > self.cap:
            victim = self._victim(conn)
            self.drop(victim if victim is not None else conn)
            if victim is None:
                return

    def drop(self, conn: Any) -> None:
        """Forget ``conn`` and close its socket now (its buffered output is discarded)."""
        self.open.pop(conn, None)
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

    @property
    def writing(self) -> bool:
        """Bytes written are not all handed to the socket yet (ours, or asyncio's buffer)."""
        return bool(self._buffer) or self._transport.get_write_buffer_size() > 0

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


def connection_class() -> type:
    global _CONNECTION_CLASS
    if _CONNECTION_CLASS is None:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        class Connection(H11Protocol):
            """uvicorn's HTTP/1.1 protocol with a header deadline and a place in the table."""

            def __init__(self, config: Any, server_state: Any, table: Table) -> None:
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
                writing = cast(_Coalescing, self.transport).writing
                return None if self.busy or writing else 2

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
                    self.table.drop(self)

        _CONNECTION_CLASS = Connection
    return _CONNECTION_CLASS


_CONNECTION_CLASS: type | None = None
