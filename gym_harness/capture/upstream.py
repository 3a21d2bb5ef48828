"""A lean HTTP/1.1 client for the model proxy's upstream leg, on asyncio streams.

httpx2 cost the proxy ~1.5 ms of CPU per streamed completion on loopback (request
building, pool bookkeeping, a timeout scope and four wrapper generators per chunk),
enough to miss the proxy's budget of 1 ms added. This client does only what the proxy
needs: one origin, kept-alive connections, the request body in memory, and the answer
handed on as it arrives, every body byte of one socket read at once (nothing waits for
that: they had all arrived). h11 writes the request and parses the answer's head (1xx,
validation); the body is decoded here (:class:`_Body`). Errors are this module's own
(:class:`UpstreamTimeout`, :class:`UpstreamUnreachable`, :class:`UpstreamDropped`); the
proxy turns them into outcomes.

Threads: everything runs on the proxy's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from urllib.parse import urlsplit

import h11

__all__ = [
    "UpstreamDropped",
    "UpstreamPool",
    "UpstreamResponse",
    "UpstreamTimeout",
    "UpstreamUnreachable",
]

_READ_BYTES = 64 * 1024
_MAX_HEAD_BYTES = 100 * 1024  # as httpcore: some APIs send large response heads
_MAX_IDLE = 8
# As httpx2: an idle connection older than this may be dead without a FIN (NAT, balancer).
_KEEPALIVE_S = 5.0


class UpstreamError(Exception):
    """The upstream leg of one exchange failed."""


class UpstreamTimeout(UpstreamError):
    """No connection, or no byte, within the timeout."""


class UpstreamUnreachable(UpstreamError):
    """The connection could not be made (or the request could not be written as HTTP)."""


class UpstreamDropped(UpstreamError):
    """The upstream closed the connection, or broke HTTP, before the answer was complete."""


class _Conn:
    """One TCP (or TLS) connection to the upstream."""

    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.idle_since = 0.0  # loop time it was given back

    def usable(self) -> bool:
        # An idle connection the upstream closed meanwhile has its EOF in the reader already.
        return not (self.writer.is_closing() or self.reader.at_eof())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class _Body:
    """Decodes one answer's body as it arrives: chunked, counted, or up to the EOF.

    Not h11's body reader: that one costs ~6 us per chunk, five times this, and a
    streamed completion is hundreds of small chunks. h11 still parses the head and so
    has validated the framing headers this reads (RFC 9112 section 6.3).
    """

    __slots__ = ("_buf", "_chunked", "_left", "_state", "_to_eof", "clean", "done")

    def __init__(self, method: str, head: h11.Response) -> None:
        self.done = self.clean = self._chunked = self._to_eof = False
        self._left, self._state, self._buf = 0, _SIZE, b""
        te = cl = None
        for name, value in head.headers.raw_items():
            name = name.lower()
            if name == b"transfer-encoding":
                te = value
            elif name == b"content-length":
                cl = value
        if method == "HEAD" or head.status_code in (204, 304):
            self.done = self.clean = True
        elif te is not None:  # h11 accepts no coding but chunked
            self._chunked = True
        elif cl is not None:
            self._left = int(cl)
            self.done = self.clean = not self._left
        else:
            self._to_eof = True  # the connection's end is the body's end: never reused

    def feed(self, data: bytes) -> bytes:
        """The body bytes in ``data`` (framing removed).

        Raises:
            UpstreamDropped: The chunked framing is broken.
        """
        if not self._chunked:
            if self._to_eof:
                return data
            if len(data) >= self._left:  # bytes past the body: the connection is not reused
                data, self.clean, self.done = data[: self._left], len(data) == self._left, True
            self._left -= len(data)
            return data
        buf = self._buf + data if self._buf else data
        out, i, n = [], 0, len(buf)
        while not self.done:
            if self._left:  # inside a chunk's data
                if i == n:
                    break
                piece = buf[i : i + self._left]
                out.append(piece)
                i += len(piece)
                self._left -= len(piece)
                if not self._left:
                    self._state = _CRLF
            elif self._state is _CRLF:
                if n - i < 2:
                    break
                if buf[i : i + 2] != b"\r\n":
                    raise UpstreamDropped("broken HTTP from the upstream: no CRLF after a chunk")
                i += 2
                self._state = _SIZE
            else:
                j = buf.find(b"\r\n", i)
                if j < 0:
                    if n - i > _MAX_LINE:
                        raise UpstreamDropped("broken HTTP from the upstream: endless chunk line")
                    break
                line, i = buf[i:j], j + 2
                if self._state is _TRAILER:
                    self.done = not line
                else:
                    size = _chunk_size(line)
                    self._left, self._state = size, (_SIZE if size else _TRAILER)
        self._buf = buf[i:]
        self.clean = self.done and not self._buf
        return out[0] if len(out) == 1 else b"".join(out)

    def end(self) -> None:
        """The connection reached its end.

        Raises:
            UpstreamDropped: The body was not complete.
        """
        if not (self._to_eof or self.done):
            raise UpstreamDropped("connection closed before the answer ended")
        self.done, self.clean = True, False


_SIZE, _CRLF, _TRAILER = "size", "crlf", "trailer"
_MAX_LINE = 64 * 1024
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")


def _chunk_size(line: bytes) -> int:
    text = line.split(b";", 1)[0].rstrip(b" \t")
    if not _HEX.fullmatch(text):
        raise UpstreamDropped(f"broken HTTP from the upstream: chunk size line {line[:40]!r}")
    return int(text, 16)


class UpstreamResponse:
    """The head of an upstream answer; its body is read with :meth:`read_some`."""

    def __init__(
        self, pool: UpstreamPool, conn: _Conn, method: str, head: h11.Response, rest: bytes
    ) -> None:
        self._pool, self._conn = pool, conn
        self.status: int = head.status_code
        # raw_items(), not iteration: h11's Headers iterates item by item through __getitem__.
        self.headers = [(k.lower(), v) for k, v in head.headers.raw_items()]
        self._body = _Body(method, head)
        self._rest = rest  # body bytes that came with the head
        closing = any(k == b"connection" and b"close" in v.lower() for k, v in self.headers)
        self._keep_alive = head.http_version == b"1.1" and not closing

    def header(self, name: bytes) -> str:
        """The first value of header ``name`` (lower-case), or ""."""
        return next((v.decode("latin-1") for k, v in self.headers if k == name), "")

    async def read_some(self) -> bytes | None:
        """The body bytes that have arrived (waiting for some if none has); None at the end.

        Raises:
            UpstreamTimeout: Silence longer than the pool's ``timeout_s``.
            UpstreamDropped: The connection broke before the body was complete.
        """
        body = self._body
        while not body.done:
            if self._rest:
                data, self._rest = self._rest, b""
            else:
                data = await self._pool._read(self._conn)
            if not data:
                body.end()
            elif piece := body.feed(data):
                return piece
        return None

    async def aclose(self) -> None:
        """Give the connection back for reuse if the answer ended cleanly, else close it."""
        conn, self._conn = self._conn, None  # type: ignore[assignment]
        if conn is not None:
            self._pool._release(conn, reusable=self._keep_alive and self._body.clean)


class UpstreamPool:
    """Kept-alive HTTP/1.1 connections to one upstream origin.

    Args:
        upstream: ``http(s)://host[:port][/prefix]``.
        timeout_s: Longest silence while waiting for the answer's head or any body byte.
        connect_timeout_s: Longest wait to connect (TLS handshake included).
    """

    def __init__(self, upstream: str, *, timeout_s: float, connect_timeout_s: float) -> None:
        parts = urlsplit(upstream)
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._netloc = parts.netloc.rpartition("@")[2]  # the Host header
        self._prefix = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            import httpx2  # its trust store, as when httpx2 was the proxy's client

            self._ssl = httpx2.create_ssl_context(trust_env=False)
            self._ssl.set_alpn_protocols(["http/1.1"])
        self._idle: list[_Conn] = []

    async def request(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> UpstreamResponse:
        """Send one request and wait for the head of its answer.

        Args:
            method: The HTTP method.
            target: Path and query, appended to the upstream's path prefix.
            headers: Request headers (no Host or Content-Length: this sets those).
            body: The whole request body.

        Returns:
            The answer's head; read its body, then :meth:`UpstreamResponse.aclose` it.

        Raises:
            UpstreamTimeout: No connection or no answer in time.
            UpstreamUnreachable: The connection failed, or the request is not valid HTTP.
            UpstreamDropped: The upstream closed the connection before answering.
        """
        conn = await self._acquire()
        state = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD_BYTES)
        try:
            framing = (
                [("content-length", str(len(body)))] if body or method not in _BODILESS else []
            )
            try:
                head = h11.Request(
                    method=method,
                    target=self._prefix + target,
                    headers=[("host", self._netloc), *headers, *framing],
                )
                data = state.send(head) or b""
                if body:
                    data += state.send(h11.Data(data=body)) or b""
                data += state.send(h11.EndOfMessage()) or b""
            except h11.LocalProtocolError as exc:
                raise UpstreamUnreachable(f"request is not valid HTTP: {exc}") from exc
            try:
                conn.writer.write(data)
                await conn.writer.drain()
            except OSError as exc:
                raise UpstreamDropped(f"connection broke while sending: {exc!r}") from exc
            while True:
                try:
                    event = state.next_event()
                except h11.RemoteProtocolError as exc:
                    raise UpstreamDropped(f"broken HTTP from the upstream: {exc}") from exc
                if event is h11.NEED_DATA:
                    state.receive_data(await self._read(conn))  # b"": EOF, h11 then rejects
                elif type(event) is h11.Response:
                    return UpstreamResponse(self, conn, method, event, state.trailing_data[0])
                elif type(event) is not h11.InformationalResponse:  # ConnectionClosed
                    raise UpstreamDropped("connection closed before any answer")
        except BaseException:
            conn.close()
            raise

    async def aclose(self) -> None:
        """Close every idle connection (answers in flight close their own)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def _acquire(self) -> _Conn:
        now = asyncio.get_running_loop().time()
        while self._idle:
            conn = self._idle.pop()
            if conn.usable() and now - conn.idle_since < _KEEPALIVE_S:
                return conn
            conn.close()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                reader, writer = await asyncio.open_connection(
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl else None,
                    limit=_READ_BYTES,
                )
        except TimeoutError as exc:
            raise UpstreamTimeout(f"no connection within {self.connect_timeout_s}s") from exc
        except OSError as exc:  # refused, DNS, TLS (ssl.SSLError is an OSError)
            raise UpstreamUnreachable(f"cannot connect: {exc!r}") from exc
        return _Conn(reader, writer)

    async def _read(self, conn: _Conn) -> bytes:
        """What the upstream sent next (b"" at its end), waiting at most ``timeout_s``."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await conn.reader.read(_READ_BYTES)
        except TimeoutError as exc:
            raise UpstreamTimeout(f"no byte for {self.timeout_s}s") from exc
        except OSError as exc:
            raise UpstreamDropped(f"connection broke: {exc!r}") from exc

    def _release(self, conn: _Conn, *, reusable: bool) -> None:
        if reusable and len(self._idle) < _MAX_IDLE and conn.usable():
            conn.idle_since = asyncio.get_running_loop().time()
            self._idle.append(conn)
        else:
            conn.close()


_BODILESS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
