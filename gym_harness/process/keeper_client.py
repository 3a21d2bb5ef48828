"""Owner side of the keepers: start them, ask them to spawn and end harnesses, watch them.

One keeper process (``gym_harness.process.keeper``) parents one running harness; a
pool keeps idle keepers for the owners that hold one (an env holds one from its
first reset to ``close()``, so a reset does not start a new keeper). The user's
process is never made a subreaper: the keeper is.

One daemon thread per owning process, the watcher, reads every keeper's messages
(spawn replies, the harness's exit code) and polls a pidfd of each keeper, so it
notices at once (well within a second) when a keeper dies. A keeper that dies
while we did not ask it to (a harness killed it) is *lost*: the watcher logs a
warning on the ``gym_harness.process`` logger, marks the harness ``keeper_lost``,
ends what is left of its tree from here (``gym_harness.process.tree.end_lost``), and, if
workspaces are registered, starts a new keeper that owns them.

Paths registered with ``own`` (episode workspaces) are sent to every keeper;
a keeper deletes them when it sees its owner die (EOF on its socket without a
``quit``), after it has killed its tree.

Forking the owner while harnesses run is not supported: the child forgets every
keeper (``os.register_at_fork``); the parent's keepers and harnesses are untouched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
from array import array
from collections.abc import Mapping, Sequence

from gym_harness.process import keeper as _keeper
from gym_harness.process.child import Child

__all__ = ["Child", "KeeperClient", "KeeperLost", "acquire", "disown", "hold", "own", "release"]

logger = logging.getLogger("gym_harness.process")

SESSION_VAR = "GYM_HARNESS_SESSION"
_SETPRIV = shutil.which("setpriv", path=os.defpath + ":/usr/sbin:/sbin")
_REPLY_TIMEOUT_S = 30.0
_KEEPER_EXIT_S = 1.0
#: Beyond the grace: the keeper's SIGKILL rounds, its cgroup removal, and slack.
_END_MARGIN_S = _keeper.KILL_ROUNDS_S + _keeper.CGROUP_RMDIR_S + 1.0
#: The exit code reported for a harness whose keeper died (the kernel SIGKILLs it then).
LOST_CODE = -signal.SIGKILL


class KeeperLost(OSError):
    """The keeper died, or stopped answering, before it replied."""


class KeeperClient:
    """One keeper process. Requests come from any thread; the watcher thread reads replies."""

    def __init__(self, paths: Sequence[str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [sys.executable, "-I", "-S", os.path.abspath(_keeper.__file__)]
        argv += [str(theirs.fileno()), *([_SETPRIV] if _SETPRIV else [])]
        env = {SESSION_VAR: os.environ[SESSION_VAR]} if SESSION_VAR in os.environ else {}
        try:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # a terminal's Ctrl-C does not reach it
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.pid = self.popen.pid
        self.sock = ours
        self.pidfd = os.pidfd_open(self.pid)
        self.child: Child | None = None
        self.closing = False  # we asked it to quit
        self.dead = False
        self.gone = threading.Event()  # set by the watcher once it is reaped
        self._send_lock = threading.Lock()
        self._request_lock = threading.Lock()
        self._replies: queue.SimpleQueue[tuple[object, ...] | None] = queue.SimpleQueue()
        self._exits: dict[int, int] = {}
        self.reader = _keeper.FrameReader()
        for path in paths:
            self.send(("own", path))

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        cgroup: bool,
        marker: str,
        policy: Mapping[str, object] | None = None,
        netns_fd: int = -1,
    ) -> Child:
        """Have the keeper start ``argv`` (an absolute path first) in a new session.

        ``policy`` (``sandbox.policy``) confines and limits it; ``netns_fd`` is a network
        namespace it starts in (sent with the pipes), if not -1.

        Raises:
            OSError: The keeper could not start it (``errno`` set), or the keeper is lost.
        """
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        ours = (stdin_w, stdout_r, stderr_r)
        try:
            message = ("spawn", list(argv), dict(env), cwd, cgroup, dict(policy or {}))
            fds = (stdin_r, stdout_w, stderr_w, *([netns_fd] if netns_fd >= 0 else []))
            reply = self._request(message, fds, _REPLY_TIMEOUT_S)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, stdout_w, stderr_w):
                os.close(fd)
        if reply[0] != "spawned":
            for fd in ours:
                os.close(fd)
            errno, text = reply[1:3]
            raise OSError(errno or None, str(text))
        pid = int(reply[1])  # type: ignore[call-overload]
        child = Child(pid, ours, str(reply[2]), marker, self)
        with self._send_lock:
            self.child = child
            code = self._exits.pop(pid, None)
        if code is not None:  # it exited before we got here
            child.set_exit(code)
        return child

    def end(self, grace_s: float) -> bool:
        """End the harness's tree (SIGTERM, ``grace_s``, SIGKILL); False if the keeper is lost."""
        try:
            self._request(("end", grace_s), (), grace_s + _END_MARGIN_S)
        except KeeperLost:
            return False
        return True

    def send(self, message: tuple[object, ...], fds: Sequence[int] = ()) -> None:
        """Send one frame (with ``fds`` as SCM_RIGHTS).

        Raises:
            KeeperLost: The keeper is gone.
        """
        data = _keeper.encode(message)
        with self._send_lock:
            if self.dead:
                raise KeeperLost(f"the keeper (pid {self.pid}) is gone")
            try:
                sent = 0
                if fds:
                    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))]
                    sent = self.sock.sendmsg([data], ancillary)
                self.sock.sendall(data[sent:])
            except OSError as exc:
                raise KeeperLost(f"the keeper (pid {self.pid}) is gone: {exc}") from exc

    def close(self) -> None:
        """Ask the keeper to end what it runs and exit; reap it. Never raises."""
        self.closing = True
        with contextlib.suppress(KeeperLost):
            self.send(("quit",))
        if not self.gone.wait(_KEEPER_EXIT_S):
            with contextlib.suppress(OSError):
                self.popen.kill()
            self.gone.wait(_KEEPER_EXIT_S)

    def deliver(self, message: tuple[object, ...]) -> None:
        """Route one message from the keeper (the watcher thread calls this)."""
        if message[0] == "limit":  # before the exit it causes
            with self._send_lock:
                child = self.child
            if child is not None and child.pid == message[1]:
                child.limit = str(message[2])
        elif message[0] == "exit":
            pid, code = int(message[1]), int(message[2])  # type: ignore[call-overload]
            with self._send_lock:
                child = self.child
                if child is None or child.pid != pid:
                    self._exits = {pid: code}  # the reply naming it is on its way
                    return
            child.set_exit(code)
        else:
            self._replies.put(message)

    def _request(
        self, message: tuple[object, ...], fds: Sequence[int], timeout_s: float
    ) -> tuple[object, ...]:
        with self._request_lock:
            self.send(message, fds)
            try:
                reply = self._replies.get(timeout=timeout_s)
            except queue.Empty:
                # Stuck (SIGSTOPped by the harness?): make it lost, which ends the tree from here.
                with contextlib.suppress(OSError):
                    self.popen.kill()
                raise KeeperLost(
                    f"the keeper (pid {self.pid}) did not answer within {timeout_s} s"
                ) from None
            if reply is None:
                raise KeeperLost(f"the keeper (pid {self.pid}) died")
            return reply


class _Watcher:
    """The thread that reads every keeper's messages and notices when one dies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keepers: list[KeeperClient] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        thread = threading.Thread(target=self._run, name="gym-harness-keepers", daemon=True)
        thread.start()

    def close_fds(self) -> None:
        """In a forked child: close the wake-up pipe (the thread is gone)."""
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def add(self, keeper: KeeperClient) -> None:
        with self._lock:
            self._keepers.append(keeper)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"\0")

    def _run(self) -> None:
        while True:
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            by_fd: dict[int, tuple[KeeperClient, bool]] = {}
            with self._lock:
                for keeper in self._keepers:
                    if not keeper.dead:
                        poller.register(keeper.sock.fileno(), select.POLLIN)
                        by_fd[keeper.sock.fileno()] = (keeper, True)
                    poller.register(keeper.pidfd, select.POLLIN)
                    by_fd[keeper.pidfd] = (keeper, False)
            for fd, _ in poller.poll():
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    continue
                keeper, is_socket = by_fd[fd]
                try:
                    if is_socket and not keeper.dead:
                        self._read(keeper)
                    elif not is_socket:
                        self._reaped(keeper)
                except Exception:  # never let one keeper stop the watching of the others
                    logger.exception("gym_harness: watching keeper pid %d failed", keeper.pid)
                    with contextlib.suppress(OSError):
                        keeper.popen.kill()

    def _read(self, keeper: KeeperClient) -> None:
        try:
            data = keeper.sock.recv(1 << 16)
        except OSError:
            data = b""
        messages = keeper.reader.feed(data) if data else []
        for message in messages:
            keeper.deliver(message)
        if not data:  # EOF: it is exiting; its pidfd tells when it is gone
            with keeper._send_lock:
                keeper.dead = True
            keeper._replies.put(None)

    def _reaped(self, keeper: KeeperClient) -> None:
        if not keeper.dead:  # what it sent before it died (an exit code) comes first
            keeper.sock.setblocking(False)
            with contextlib.suppress(OSError, ValueError):
                while data := keeper.sock.recv(1 << 16):
                    for message in keeper.reader.feed(data):
                        keeper.deliver(message)
        with keeper._send_lock:
            keeper.dead = True
        keeper._replies.put(None)
        with contextlib.suppress(subprocess.TimeoutExpired):
            keeper.popen.wait(timeout=_KEEPER_EXIT_S)
        with self._lock:
            self._keepers.remove(keeper)
        keeper.sock.close()
        os.close(keeper.pidfd)
        try:
            if not keeper.closing:
                _pool.lost(keeper)
        finally:
            keeper.gone.set()


class _Pool:
    """Idle keepers kept for holders, the owned paths, and the accounting of both."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[KeeperClient] = []
        self.busy: set[KeeperClient] = set()
        self.holds = 0
        self.paths: dict[str, None] = {}  # insertion-ordered set
        self.watcher: _Watcher | None = None

    def launch(self) -> KeeperClient:
        """Start a keeper (the pool lock is held)."""
        keeper = KeeperClient(list(self.paths))
        if self.watcher is None:
            self.watcher = _Watcher()
        self.watcher.add(keeper)
        return keeper

    def acquire(self) -> KeeperClient:
        with self.lock:
            while self.idle:
                keeper = self.idle.pop()
                if not keeper.dead:
                    break
            else:
                keeper = self.launch()
            self.busy.add(keeper)
            return keeper

    def release(self, keeper: KeeperClient) -> None:
        with self.lock:
            self.busy.discard(keeper)
            if not keeper.dead and len(self.idle) < self._want_idle():
                keeper.child = None
                self.idle.append(keeper)
                return
        keeper.close()

    def trim(self) -> None:
        with self.lock:
            extra = len(self.idle) - self._want_idle()
            closing = self.idle[:extra] if extra > 0 else []
            del self.idle[: len(closing)]
        for keeper in closing:
            keeper.close()

    def ensure_one(self) -> None:
        """Keep one keeper alive while paths are owned (the pool lock is held)."""
        live = [k for k in (*self.idle, *self.busy) if not k.dead]
        if self.paths and not live:
            self.idle.append(self.launch())

    def broadcast(self, message: tuple[object, ...]) -> None:
        for keeper in (*self.idle, *self.busy):
            with contextlib.suppress(KeeperLost):
                keeper.send(message)

    def lost(self, keeper: KeeperClient) -> None:
        """A keeper died unasked (the watcher thread calls this)."""
        child = keeper.child
        if child is not None and child.returncode is None:
            logger.warning(
                "gym_harness: the keeper (pid %d) of harness pid %d died while the harness "
                "ran (did the harness kill it?); ending the harness's tree from the owner",
                keeper.pid,
                child.pid,
            )
            from gym_harness.process import (
                tree as _tree,  # psutil-free, but keep the keeper path light
            )

            try:
                _tree.end_lost(child.pid, child.marker, child.cgroup)
            finally:
                child.keeper_lost = True  # once handled: then nothing of the tree is left
                child.set_exit(LOST_CODE)
        with self.lock:
            if keeper in self.idle:
                self.idle.remove(keeper)
            self.ensure_one()

    def _want_idle(self) -> int:
        want = max(0, self.holds - len(self.busy))
        if self.paths and not self.busy:
            want = max(want, 1)
        return want

    def forget_after_fork(self) -> None:
        for keeper in (*self.idle, *self.busy):
            keeper.popen.returncode = 0  # not our child: keep Popen.__del__ quiet
            with contextlib.suppress(OSError):
                keeper.sock.close()  # our copy only: the parent's keeper still sees EOF later
            with contextlib.suppress(OSError):
                os.close(keeper.pidfd)
        if self.watcher is not None:  # its thread did not survive the fork
            self.watcher.close_fds()
        self._reset()


_pool = _Pool()


def acquire() -> KeeperClient:
    """A keeper for one harness: an idle one, or a new one.

    Raises:
        OSError: A keeper could not be started.
    """
    return _pool.acquire()


def release(keeper: KeeperClient) -> None:
    """Give back a keeper whose harness has ended; it is kept idle or closed. Never raises."""
    _pool.release(keeper)


def hold() -> None:
    """Keep one more idle keeper between harnesses (until ``unhold``)."""
    with _pool.lock:
        _pool.holds += 1


def unhold() -> None:
    """Undo one ``hold``; idle keepers beyond need are closed. Never raises."""
    with _pool.lock:
        _pool.holds = max(0, _pool.holds - 1)
    _pool.trim()


def own(path: str) -> None:
    """Have the keepers delete ``path`` if this process dies before ``disown(path)``.

    Raises:
        OSError: No keeper could be started to own it.
    """
    with _pool.lock:
        _pool.paths[path] = None
        _pool.broadcast(("own", path))
        _pool.ensure_one()


def disown(path: str) -> None:
    """Forget ``path`` (it was deleted, or is to be kept). Never raises."""
    with _pool.lock:
        if _pool.paths.pop(path, 0) is None:
            _pool.broadcast(("disown", path))
    _pool.trim()


os.register_at_fork(after_in_child=_pool.forget_after_fork)
