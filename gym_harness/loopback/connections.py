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
* the short way for a plain request the app offers to answer itself (a
  :class:`~gym_harness.loopback.quick.QuickPath`): read without h11 or ASGI, answered
  in one write, and busy (never evicted once authenticated) from its complete head on;
* uvicorn's per-connection log turned down to debug (clients are untrusted).

Threads: everything here runs on the server loop.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Awaitable
from typing import Any, cast

from gym_harness.loopback.quick import NEED_DATA, Head, QuickPath, read_head, response_bytes

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

    def write_now(self, data: bytes) -> None:
        """Send ``data`` now, after whatever is still buffered (one whole response)."""
        self._buffer.append(data)
        self._flush()

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
_SERVER_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: 21\r\n\r\nInternal Server Error"
)


def connection_class() -> type:
    global _CONNECTION_CLASS
    if _CONNECTION_CLASS is None:
        import h11
        from uvicorn.protocols.http.h11_impl import H11Protocol

        class Connection(H11Protocol):
            """uvicorn's HTTP/1.1 protocol with a header deadline and a place in the table."""

            def __init__(
                self, config: Any, server_state: Any, table: Table, quick: QuickPath | None
            ) -> None:
                super().__init__(config, server_state, {})
                # Untrusted clients can make uvicorn log at will (bad requests, cut calls).
                self.logger = _QUIET  # type: ignore[assignment]
                self.app_state = {CONNECTION_KEY: self}  # reaches the app as scope["state"]
                self.table = table
                #: Set by the app once a request authenticated: "" means untrusted.
                self.owner = ""
                self._deadline: asyncio.TimerHandle | None = None
                self.quick = quick
                # The short way (loopback/quick.py): the bytes of the request it reads (or,
                # while it answers, of the next one), the head it accepted, and whether
                # its answer is being made.
                self._held = b""
                self._head: Head | None = None
                self._answering = False
                self._close_after = False

            @property
            def busy(self) -> bool:
                if self._head is not None or self._answering:
                    return True
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
                self._held, self._head = b"", None
                self._disarm()
                self.table.open.pop(self, None)
                super().connection_lost(exc)

            def data_received(self, data: bytes) -> None:
                if self._answering:  # pipelined behind a short-way answer: held, bounded
                    self._held += data
                    self.transport.pause_reading()
                elif self.quick is not None and self._between_requests():
                    self._read_quick(data)
                else:
                    self._to_h11(data)

            def _to_h11(self, data: bytes) -> None:
                super().data_received(data)
                if self._deadline is not None and self.busy:  # the headers are complete
                    self._disarm()

            def _between_requests(self) -> bool:
                if self._held or self._head is not None:
                    return True  # a request the short way is reading
                cycle, conn = self.cycle, self.conn
                return (
                    (cycle is None or cycle.response_complete)
                    and conn.our_state is conn.their_state is h11.IDLE
                    and not conn.trailing_data[0]
                )

            def _read_quick(self, data: bytes) -> None:
                assert self.quick is not None
                self._unset_keepalive_if_required()
                buffer = self._held + data if self._held else data
                self._held = b""
                head = self._head
                if head is None:
                    found = read_head(buffer)
                    if found == NEED_DATA:
                        self._held = buffer
                        return
                    if not isinstance(found, tuple) or not self.quick.quick_head(
                        self, found[0], found[1]
                    ):
                        self._to_h11(buffer)
                        return
                    head = self._head = found
                    self._disarm()  # the headers are complete
                _, headers, start, length = head
                if len(buffer) < start + length:
                    self._held = buffer
                    return
                self._head = None
                answer = None
                if len(buffer) == start + length:  # else pipelined: h11's to read
                    answer = self.quick.quick_call(headers, buffer[start:])
                if answer is None:
                    self._to_h11(buffer)
                    return
                self._answering = True
                task = self.loop.create_task(self._answer_quick(answer))
                task.add_done_callback(self.tasks.discard)
                self.tasks.add(task)

            async def _answer_quick(self, answer: Awaitable[tuple[int, bytes, bytes]]) -> None:
                try:
                    status, content_type, body = await answer
                    data = response_bytes(status, content_type, body)
                except Exception:  # what uvicorn makes of an app's error
                    logger.debug("short-way answer failed", exc_info=True)
                    data, self._close_after = _SERVER_ERROR, True
                finally:
                    self._answering = False
                transport = cast(_Coalescing, self.transport)
                if transport.is_closing():
                    return
                transport.write_now(data)
                self.server_state.total_requests += 1
                if self._close_after:
                    transport.close()
                    return
                self._unset_keepalive_if_required()  # uvicorn's keep-alive, then ours
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )
                self._arm(self.timeout_keep_alive + self.table.header_timeout_s)
                if self._held:
                    held, self._held = self._held, b""
                    transport.resume_reading()
                    self.data_received(held)

            def shutdown(self) -> None:
                if self._answering:
                    self._close_after = True  # once the answer is out
                else:
                    super().shutdown()

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
