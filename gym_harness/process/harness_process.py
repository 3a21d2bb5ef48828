"""HarnessProcess: spawn one harness, read its lines, stop its whole tree.

The only place in gym_harness that starts processes. Every harness is forked by
a keeper process of ours, a child subreaper (and, where writable, into a cgroup
of its own), which ends the whole tree on ``stop()`` and when the owner dies;
the owner watches the keeper (``gym_harness.process.keeper``, ``keeper_client``). Each
harness runs in its own session with a scrubbed environment.

Memory bounds: a line longer than ``max_line_bytes`` is cut while it is read
(at most ``max_line_bytes`` of it is ever held). Stdout is read by the caller's
own thread inside ``read_line`` (one wake-up per burst of output, no hand-off
between threads: this is the step's hot path), at most one 64 KiB read ahead,
so unread output stays in the pipe and a harness that writes while nobody reads
blocks on its own write (backpressure, not deadlock: ``write_line`` reads stdout
while the harness's stdin is full, up to ``max(4 * max_line_bytes, 1 MiB)`` of
unread lines). A stderr reader thread drains stderr continuously and keeps only
its last ``stderr_tail_lines`` lines, each cut at 64 KiB.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import select
import shlex
import shutil
import threading
import time
import uuid
import weakref
from collections import deque
from types import TracebackType
from typing import IO

import psutil

from gym_harness.config import ProcessSpec
from gym_harness.errors import ConfigError, HarnessCrashed, HarnessStartError, TurnTimeout
from gym_harness.lifecycle import Lifecycle
from gym_harness.process import keeper_client as _keeper_client
from gym_harness.process import sandbox as _sandbox
from gym_harness.process import tree as _tree
from gym_harness.process.sandbox import Reach
from gym_harness.process.tree import ProcessUsage
from gym_harness.utils.interrupts import interrupts_held
from gym_harness.utils.lines import READ_CHUNK, LineSplitter, read_batches

__all__ = [
    "MARKER_VAR",
    "SESSION_VAR",
    "HarnessProcess",
    "ProcessUsage",
]

#: Unique per harness; its processes inherit it unless they clear their environment.
MARKER_VAR = _tree.MARKER_VAR
#: Sweep tag forwarded from our environment when set (the test guard finds strays by it).
SESSION_VAR = _keeper_client.SESSION_VAR

_STDERR_LINE_CAP = 64 * 1024
_MIN_QUEUE_BYTES = 1 << 20
_JOIN_S = 0.5


class HarnessProcess:
    """One harness subprocess: spawn, line I/O, and the end of its tree.

    Threads: the caller's thread owns the lifecycle (``start``/``stop``, also
    from another thread: ``stop`` is serialised by a lock), stdin
    (``write_line``) and stdout (``read_line`` reads, cuts and decodes lines
    itself; call the two from one thread at a time). The stderr reader thread
    owns the stderr pipe and the tail. Output on either stream updates
    ``last_activity``. The harness is forked by a keeper process of ours
    (``keeper_pid``), which ends its tree; the owner's watcher thread records
    its exit code and notices if the keeper dies (``keeper_lost``).

    Args:
        spec: How to start, feed and stop the harness (``HarnessConfig.process_spec()``).
        reach: What the harness may reach when confined (``spec.sandbox``); without one
            (a bare process, not an episode's harness) nothing is confined, and only the
            limits apply.

    Raises:
        ConfigError: ``spec.command`` is empty.

    Example:
        >>> with HarnessProcess(ProcessSpec(command=["cat"])) as proc:
        ...     proc.start()
        ...     proc.write_line("hi", timeout_s=5)
        ...     proc.read_line(timeout_s=5)
        'hi'
    """

    def __init__(self, spec: ProcessSpec, reach: Reach | None = None) -> None:
        if not spec.command:
            raise ConfigError("HarnessConfig.command is empty; give the argv to start.")
        self.spec = spec
        self.reach = reach
        self._marker = uuid.uuid4().hex
        self._state = Lifecycle.NEW
        self._lock = threading.Lock()
        self._stdin_lock = threading.Lock()
        self._popen: _keeper_client.Child | None = None
        self._keeper: _keeper_client.KeeperClient | None = None
        self._own_exit: int | None = None
        self._splitter = LineSplitter(spec.max_line_bytes)
        self._lines: deque[tuple[str, int]] = deque()  # read from stdout, not yet returned
        self._stdout_fd: int | None = None  # None once stdout hit EOF or was closed
        self._stdout_lock = threading.Lock()  # the reader of the moment holds it
        self._poller = select.poll()
        self._stderr: deque[str] = deque(maxlen=spec.stderr_tail_lines)
        self._stderr_lock = threading.Lock()
        self._readers: list[threading.Thread] = []
        self._last_activity = time.monotonic()

    def start(self) -> None:
        """Spawn the harness and return; its output waits for ``read_line``.

        Readiness is the turn runner's business (``TurnRunner.startup``; for a bare
        process, ``gym_harness.readiness.start_ready``).

        Raises:
            HarnessStartError: The command could not be started (nothing of it is
                left running), or ``start`` was called twice.
        """
        with self._lock:
            if self._state is not Lifecycle.NEW:
                raise HarnessStartError(
                    f"HarnessProcess.start() called on a {self._state.value} process; "
                    "create a new HarnessProcess for each run."
                )
            # Under the lock, so a stop() from another thread cannot slip in before the spawn;
            # whole, so Ctrl-C cannot leave a keeper that is busy with nothing recorded.
            with interrupts_held():
                self._spawn()

    def write_line(
        self, text: str, timeout_s: float | None = None, *, deadline: float | None = None
    ) -> None:
        """Write ``text`` and a newline to the harness's stdin (UTF-8), never blocking.

        Stdin is non-blocking: while the pipe is full this waits for room (reading
        stdout meanwhile), never past the deadline.

        Args:
            text: One line; it should not contain a newline.
            timeout_s: How long to wait while the pipe is full.
            deadline: A ``time.monotonic()`` value by which the whole line must be
                written (the turn's deadline); overrides ``timeout_s``. The caller
                gives one of the two: a process knows no turn.

        Raises:
            TypeError: Neither ``timeout_s`` nor ``deadline`` was given.
            HarnessCrashed: The harness is gone or closed its stdin (or was never started).
            TurnTimeout: The harness did not read its stdin in time.
        """
        data = memoryview((text + "\n").encode("utf-8", "replace"))
        if deadline is None:
            if timeout_s is None:
                raise TypeError(
                    "HarnessProcess.write_line() needs timeout_s or deadline: "
                    "how long it may wait while the harness does not read its stdin."
                )
            deadline = time.monotonic() + timeout_s
        with self._stdin_lock:
            popen = self._popen
            if self._state is not Lifecycle.RUNNING or popen is None or popen.stdin is None:
                raise self._crashed(f"cannot write to a {self._state.value} harness")
            fd = popen.stdin.fileno()
            while data:
                try:
                    data = data[os.write(fd, data) :]
                except BlockingIOError:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TurnTimeout(
                            f"Harness `{self._describe()}` did not read its stdin in time "
                            f"({len(data)} bytes of a line still unwritten); it may be stuck.",
                            pid=popen.pid,
                        ) from None
                    self._wait_writable(fd, remaining)
                except (OSError, ValueError) as exc:
                    raise self._crashed(f"its stdin is closed ({exc})") from exc

    def read_line(self, timeout_s: float, wake_fd: int | None = None) -> str | None:
        """Return the next stdout line without its line ending, or ``None``.

        ``None`` means no line came within ``timeout_s``, or ``eof`` (then at
        once), or ``wake_fd`` became readable. After ``stop()`` unread lines are
        dropped and ``eof`` is true.

        Args:
            timeout_s: Longest wait for a line, in seconds.
            wake_fd: A file descriptor waited on with stdout (a model-call endpoint's
                wake-up pipe, say): once it is readable, or at its EOF, this returns
                ``None`` at once without reading it. Lines already read come first.
        """
        if not self._lines:
            deadline = time.monotonic() + timeout_s
            while not self._lines and self._stdout_fd is not None:
                if not self._pull(deadline - time.monotonic(), wake_fd):
                    break  # timed out, or woken
        return self._lines.popleft()[0] if self._lines else None

    @property
    def eof(self) -> bool:
        """True once stdout is closed and every line of it was read (or after ``stop``)."""
        return self._stdout_fd is None and not self._lines

    @property
    def last_activity(self) -> float:
        """``time.monotonic()`` of the last output on stdout or stderr (else of the spawn)."""
        return self._last_activity

    @property
    def busy(self) -> bool:
        """Always False (``Liveness``): only the env's side can keep a harness waiting."""
        return False

    @property
    def pid(self) -> int | None:
        """The harness's process id; ``None`` before ``start``."""
        return self._popen.pid if self._popen is not None else None

    @property
    def keeper_pid(self) -> int | None:
        """The pid of the keeper process that parents this harness; ``None`` before ``start``."""
        return self._keeper.pid if self._keeper is not None else None

    @property
    def keeper_lost(self) -> bool:
        """True if the keeper died while the harness ran (the owner then ended the tree,
        logged a warning on ``gym_harness.process.keeper_client``, and says so in
        ``stderr_tail()``)."""
        return self._popen is not None and self._popen.keeper_lost

    @property
    def limit(self) -> str:
        """Which limit the keeper ended the tree for (``memory_limit_mb=...``), else ""."""
        return self._popen.limit if self._popen is not None else ""

    @property
    def returncode(self) -> int | None:
        """The exit code (``-N`` for signal N); ``None`` while running or before ``start``."""
        return self._popen.poll() if self._popen is not None else None

    @property
    def exit_code(self) -> int | None:
        """The harness's own exit status: its return code if it exited before ``stop``
        (by itself, or killed by someone else); ``None`` while it runs, and when
        ``stop`` ended it (a signal we sent is not the harness's exit code)."""
        if self._own_exit is not None or self._state is Lifecycle.STOPPED:
            return self._own_exit
        return self.returncode

    def is_alive(self) -> bool:
        """Return True while the harness's own process runs."""
        return self._popen is not None and self._popen.poll() is None

    def exit_report(self) -> tuple[int, str]:
        """The harness's own exit code (0 while it runs, or when ``stop`` ended it) and
        ``stderr_tail()``: what a step's info says of the process."""
        code = self.exit_code
        return 0 if code is None else int(code), self.stderr_tail()

    def stderr_tail(self) -> str:
        """Return the last ``stderr_tail_lines`` lines of stderr, joined by newlines."""
        with self._stderr_lock:
            tail = "\n".join(self._stderr)
        if self.keeper_lost:
            note = "[gym_harness] the keeper process died mid-episode; the harness tree was ended"
            tail = f"{tail}\n{note}" if tail else note
        return tail

    def usage(self) -> ProcessUsage:
        """Return the summed memory and CPU of every live process of the tree."""
        if self._state is not Lifecycle.RUNNING:
            return ProcessUsage(rss_bytes=0, cpu_seconds=0.0, num_processes=0)
        rss, cpu, count = _tree.usage(self._popen)
        return ProcessUsage(rss_bytes=rss, cpu_seconds=cpu, num_processes=count)

    def stop(self) -> None:
        """End the whole tree: SIGTERM, ``stop_grace_s``, SIGKILL, reap, close.

        Reaches every descendant of the harness's keeper (orphans re-parent to
        it, whatever their session, group, name or environment) and, where
        used, its cgroup. Idempotent, never raises, and returns within about
        ``stop_grace_s`` + 1 s (a tree that keeps forking: a little longer).
        """
        with self._lock, interrupts_held():  # whole: Ctrl-C waits for the tree's end
            if self._state is Lifecycle.STOPPED:
                return
            self._state = Lifecycle.STOPPED
            try:
                self._end_tree()
            finally:
                _live.discard(self)
                if self._keeper is not None:
                    _keeper_client.release(self._keeper)

    def _end_tree(self) -> None:
        popen = self._popen
        if popen is None:
            return
        self._own_exit = popen.poll()  # before our signals: what it did by itself
        # stop() never raises; whatever survives an error dies with the keeper.
        with contextlib.suppress(psutil.Error, OSError):
            _tree.end(popen, self.spec.stop_grace_s)
        deadline = time.monotonic() + _JOIN_S
        for thread in self._readers:
            thread.join(max(0.0, deadline - time.monotonic()))
        # The tree is dead, so a reader in another thread sees EOF and lets go.
        if self._stdout_lock.acquire(timeout=_JOIN_S):
            try:
                self._close_stdout()
                self._lines.clear()  # unread lines are dropped after stop()
            finally:
                self._stdout_lock.release()
        if self._stdin_lock.acquire(timeout=_JOIN_S):  # a writer gets EPIPE by now
            try:
                with contextlib.suppress(OSError):
                    popen.stdin.close()
            finally:
                self._stdin_lock.release()

    def __enter__(self) -> HarnessProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<HarnessProcess {self._describe()!r} pid={self.pid} {self._state.value}>"

    # -- start -------------------------------------------------------------

    def _spawn(self) -> None:
        env = {name: os.environ[name] for name in self.spec.inherit_env if name in os.environ}
        env.update(self.spec.env)
        if SESSION_VAR in os.environ:
            env[SESSION_VAR] = os.environ[SESSION_VAR]
        env[MARKER_VAR] = self._marker
        reach, spec = self.reach if self.spec.sandbox != "off" else None, self.spec
        if reach is not None:  # a private tmp, and home unless the config names one
            env["TMPDIR"] = reach.tmp
            env["HOME"] = spec.env.get("HOME", reach.home)
        self._state = Lifecycle.STOPPED  # until the spawn succeeds
        argv = self._resolve(env)
        keeper = None
        try:
            keeper = _keeper_client.acquire()
            cwd = os.path.abspath(spec.cwd or os.getcwd())
            policy = _sandbox.policy(spec, reach, argv, env, cwd)
            netns = reach.netns_fd if reach is not None else -1
            popen = keeper.spawn(argv, env, cwd, spec.cgroup, self._marker, policy, netns)
        except OSError as exc:
            if keeper is not None:
                _keeper_client.release(keeper)
            raise HarnessStartError(
                f"Could not start harness `{self._describe()}`: {exc}. "
                "Check the command, its cwd and its permissions."
            ) from exc
        self._keeper = keeper
        self._popen = popen
        self._state = Lifecycle.RUNNING
        _live.add(self)
        os.set_blocking(popen.stdin.fileno(), False)
        assert popen.stdout is not None
        self._stdout_fd = popen.stdout.fileno()
        os.set_blocking(self._stdout_fd, False)
        self._poller.register(self._stdout_fd, select.POLLIN)
        self._last_activity = time.monotonic()
        reader = threading.Thread(
            target=self._pump_stderr, args=(popen.stderr,), name="gym-harness-stderr", daemon=True
        )
        reader.start()
        self._readers = [reader]

    def _resolve(self, env: dict[str, str]) -> list[str]:
        exe, *args = self.spec.command
        if os.sep in exe:
            full = os.path.join(self.spec.cwd or os.getcwd(), exe)
            found = full if os.access(full, os.X_OK) else None
        else:
            found = shutil.which(exe, path=env.get("PATH", os.defpath))
        if found is None:
            raise HarnessStartError(
                f"Cannot start harness `{self._describe()}`: `{exe}` is not an executable "
                f"on the harness's PATH ({env.get('PATH', os.defpath)}) or relative to its cwd. "
                "Install it, give its absolute path, or pass PATH via inherit_env/env."
            )
        return [os.path.abspath(found), *args]

    # -- readers -----------------------------------------------------------

    def _pull(self, timeout_s: float, wake_fd: int | None = None) -> bool:
        """Wait up to ``timeout_s`` for stdout (or ``wake_fd``), then read one chunk of
        stdout into lines.

        Returns False on a timeout, or when ``wake_fd`` is readable (stdout's ready
        output is read first). Reaching EOF (or a closed pipe) closes stdout.
        """
        with self._stdout_lock:
            fd = self._stdout_fd
            if fd is None:
                return True
            wait_ms = max(0, math.ceil(timeout_s * 1000))
            if wake_fd is None:  # the hot path: stdout alone, registered once
                events = self._poller.poll(wait_ms)
            else:
                self._poller.register(wake_fd, select.POLLIN)
                try:
                    events = self._poller.poll(wait_ms)
                finally:
                    self._poller.unregister(wake_fd)
            if not events:
                return False
            woken = wake_fd is not None and any(ready == wake_fd for ready, _ in events)
            if woken and not any(ready == fd for ready, _ in events):
                return False
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                return not woken  # a spurious wake-up
            except OSError:
                data = b""
            if not data:
                self._lines.extend(self._splitter.finish())
                self._close_stdout()
                return not woken
            self._last_activity = time.monotonic()
            self._lines.extend(self._splitter.feed(data))
            return not woken

    def _wait_writable(self, fd: int, timeout_s: float) -> None:
        """Wait for room in stdin, reading stdout meanwhile: a harness blocked writing
        its output never reads its input, so not reading would deadlock us both."""
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        out = self._stdout_fd
        budget = max(4 * self.spec.max_line_bytes, _MIN_QUEUE_BYTES)
        if out is not None and sum(size for _, size in self._lines) < budget:
            poller.register(out, select.POLLIN)
        for ready_fd, _ in poller.poll(math.ceil(timeout_s * 1000)):
            if ready_fd == out:
                self._pull(0)

    def _close_stdout(self) -> None:
        """Close stdout (the caller of ``_pull`` or ``stop`` holds the stdout lock)."""
        fd, self._stdout_fd = self._stdout_fd, None
        popen = self._popen
        if fd is not None and popen is not None and popen.stdout is not None:
            with contextlib.suppress(OSError, ValueError):
                self._poller.unregister(fd)
            with contextlib.suppress(OSError):
                popen.stdout.close()

    def _pump_stderr(self, stream: IO[bytes]) -> None:
        for batch in read_batches(stream, min(self.spec.max_line_bytes, _STDERR_LINE_CAP)):
            self._last_activity = time.monotonic()
            with self._stderr_lock:
                self._stderr.extend(text for text, _ in batch)

    # -- stop --------------------------------------------------------------

    def _crashed(self, what: str) -> HarnessCrashed:
        return HarnessCrashed(
            f"Harness `{self._describe()}` {what}; it has exited or is exiting. "
            "Start a new HarnessProcess.",
            exit_code=self.returncode,
            stderr_tail=self.stderr_tail(),
            pid=self.pid,
        )

    def _describe(self) -> str:
        text = shlex.join(self.spec.command)
        return text if len(text) <= 120 else text[:117] + "..."


_live: weakref.WeakSet[HarnessProcess] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    for proc in list(_live):
        proc.stop()
