"""An env's own network namespace (``sandbox="strict"``): only loopback, only our endpoints.

The namespace is made once per env, in a short-lived thread of ours that unshares its
network namespace (which moves that thread alone), opens ``/proc/thread-self/ns/net``
(the file descriptor keeps the namespace alive with no process in it) and brings ``lo``
up. The env's servers listen on sockets made the same way, in a thread that enters the
namespace: a socket stays in the namespace it was made in, while the server threads and
the env's tools stay in ours (they may reach the network; the harness may not). The
keeper's child enters the namespace before it execs the harness, so the harness's
``127.0.0.1`` is the namespace's own loopback, where only those sockets listen: no
other host port, no other interface, no UDP or DNS to anywhere.

Needs ``CAP_SYS_ADMIN`` (root): an unprivileged owner could only make one inside a new
user namespace, which a multithreaded process cannot enter. ``close`` releases the
namespace; it is gone once the harness and the sockets in it are.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from collections.abc import Callable
from typing import TypeVar

from gym_harness.process.confine import bring_loopback_up, probe

__all__ = ["NetworkNamespace", "unavailable"]

T = TypeVar("T")

_CLONE_NEWNET = 0x40000000
_THREAD_S = 5.0
_BACKLOG = 1024
_libc = ctypes.CDLL(None, use_errno=True)


def unavailable() -> str:
    """Why this process cannot make a network namespace ("" if it can)."""
    if os.geteuid() != 0:
        return (
            "sandbox='strict' gives each env a network namespace, which needs root "
            "(CAP_SYS_ADMIN); run as root, or use sandbox='auto'"
        )
    return str(probe().get("netns") or "")


class NetworkNamespace:
    """One network namespace with ``lo`` up, held by a file descriptor (``fd``).

    Raises:
        OSError: The namespace could not be made (``unavailable`` says why beforehand).
    """

    def __init__(self) -> None:
        self.fd = _in_thread(_create)

    def listener(self) -> socket.socket:
        """A TCP socket bound to the namespace's ``127.0.0.1:<free port>``, listening."""
        return _in_thread(lambda: _bound_in(self.fd))

    def close(self) -> None:
        """Let the namespace go (once the harness and the sockets in it are gone)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def _create() -> int:
    if _libc.unshare(_CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare(CLONE_NEWNET): {os.strerror(code)}")
    fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        bring_loopback_up()
    except BaseException:
        os.close(fd)
        raise
    return fd


def _bound_in(fd: int) -> socket.socket:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns into the env's network namespace: {os.strerror(code)}")
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _in_thread(work: Callable[[], T]) -> T:
    """Run ``work`` in a fresh thread (its namespace changes die with it); bounded."""
    box: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            box.append(work())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="gym-harness-netns", daemon=True)
    thread.start()
    thread.join(_THREAD_S)
    if errors:
        raise errors[0]
    if not box:
        raise OSError(0, f"the network namespace thread did not finish in {_THREAD_S} s")
    return box[0]
