"""A bare HTTP/1.1 upstream on 127.0.0.1 answering with scripted bytes (capture tests)."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Callable, Iterable

__all__ = ["Answer", "RawUpstream"]

#: The pieces of an answer, and whether the connection closes after it; or a function of
#: the request's head and body that returns them.
Answer = tuple[Iterable[bytes], bool] | Callable[[bytes, bytes], tuple[Iterable[bytes], bool]]


class RawUpstream:
    """A bare HTTP/1.1 upstream on 127.0.0.1 that answers each request with scripted bytes.

    Each answer is a list of pieces, each sent with its own ``sendall`` (so framing lands
    split across reads), then the connection is closed if the answer says so. An answer
    may also be a function of the request's head and body (to echo them, say). It counts the
    connections it accepted and keeps each request's head, to check framing and keep-alive.
    """

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.answers: list[Answer] = []
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.connections = 0
        self._conns: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed by stop()
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.connections += 1
            self._conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with contextlib.suppress(OSError):
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                size = int(length.group(1)) if length else 0
                while len(buf) < size:
                    buf += conn.recv(65536)
                self.bodies.append(buf[:size])
                buf = buf[size:]
                self.heads.append(head)
                answer = self.answers.pop(0)
                pieces, close = answer(head, self.bodies[-1]) if callable(answer) else answer
                for piece in pieces:
                    conn.sendall(piece)
                if close:
                    conn.shutdown(socket.SHUT_RDWR)
                    return

    def stop(self) -> None:
        with contextlib.suppress(OSError):  # wakes the blocked accept() (Linux)
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        for thread in self._threads:
            thread.join(5)
