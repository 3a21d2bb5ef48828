"""The short way for one small, plain HTTP/1.1 request: answered without h11 or ASGI.

A loopback server's app may offer a :class:`QuickPath`. A connection then reads each
request that arrives between responses with :func:`read_head` first: a plain
``POST`` with a ``Content-Length`` body and nothing unusual (no chunked body, no
``Expect``, no ``Connection: close`` or upgrade, ASCII headers, one request, not
pipelined). Its app sees the headers (:meth:`QuickPath.quick_head`), then the body
(:meth:`QuickPath.quick_call`), and either answers, in one write, or declines. Every
request it declines, at either step, and every request that is not plain goes to
uvicorn's h11 protocol with all its bytes, as if the short way did not exist: the
answers to anything unusual, malformed or hostile stay h11's and the app's own.

Threads: the server loop.
"""

from __future__ import annotations

from collections.abc import Awaitable
from http import HTTPStatus
from typing import Any, Protocol

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_HEAD_BYTES",
    "NEED_DATA",
    "QuickPath",
    "read_head",
    "response_bytes",
]

#: Headers longer than this go to h11 (whose own limit answers them).
MAX_HEAD_BYTES = 16 * 1024
#: Bodies longer than this go to h11 (a plain call is small; h11 streams large ones).
MAX_BODY_BYTES = 64 * 1024
#: :func:`read_head`: the head is not complete yet.
NEED_DATA = "need data"
_NAME_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-")
_REFUSED = frozenset({b"transfer-encoding", b"expect", b"upgrade", b"te", b"trailer"})
_PRINTABLE = bytes(range(32, 127)) + b"\t"
_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}

#: ``(target, headers with lower-case names, body start, body length)``.
Head = tuple[bytes, list[tuple[bytes, bytes]], int, int]


class QuickPath(Protocol):
    """What an app offers its connections for the requests it can answer the short way."""

    def quick_head(self, conn: Any, target: bytes, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether the app may answer this request itself once its body is in.

        Returning True also means the request authenticated (the app set ``conn.owner``).
        """
        ...

    def quick_call(
        self, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Awaitable[tuple[int, bytes, bytes]] | None:
        """The answer ``(status, content type, body)`` to come, or ``None`` to decline."""
        ...


def read_head(data: bytes) -> Head | str | None:
    """The head of the plain ``POST`` at the start of ``data``.

    Returns:
        The head; :data:`NEED_DATA` while it is incomplete (and short); ``None`` for
        anything else, which h11 must read instead.
    """
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return NEED_DATA if len(data) < MAX_HEAD_BYTES and b"POST /".startswith(data[:6]) else None
    if end > MAX_HEAD_BYTES or not data.startswith(b"POST /"):
        return None
    lines = data[:end].split(b"\r\n")
    request_line = lines[0].split(b" ")
    if len(request_line) != 3 or request_line[2] != b"HTTP/1.1" or not _plain(lines[0]):
        return None
    target = request_line[1]
    headers = []
    length = -1
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        name = name.lower()
        value = value.strip(b" \t")
        if not colon or not name or not _NAME_BYTES.issuperset(name) or not _plain(value):
            return None
        if name == b"content-length":
            if length >= 0 or not value.isdigit() or len(value) > 12:
                return None
            length = int(value)
        elif name in _REFUSED or (name == b"connection" and value.lower() != b"keep-alive"):
            return None
        headers.append((name, value))
    if not 0 <= length <= MAX_BODY_BYTES:
        return None
    return target, headers, end + 4, length


def response_bytes(status: int, content_type: bytes, body: bytes) -> bytes:
    """One whole response, as uvicorn's h11 protocol writes the app's answer."""
    line = _STATUS_LINES.get(status) or f"HTTP/1.1 {status} \r\n".encode()
    return b"%scontent-length: %d\r\ncontent-type: %s\r\n\r\n%s" % (
        line,
        len(body),
        content_type,
        body,
    )


def _plain(value: bytes) -> bool:
    """Printable ASCII (and tabs) only: anything else is h11's to judge."""
    return not value.translate(None, _PRINTABLE)
