"""Parent-death machinery: the spawner thread and the keeper process.

A harness tree must die with the Python process that owns it, even when that
process never calls ``stop()`` (SIGKILL, or a gymnasium ``AsyncVectorEnv`` worker
ended by SIGTERM through ``close(terminate=True)``). Two mechanisms, neither of
which makes the user's process a subreaper (it may be a Jupyter kernel):

1. ``PR_SET_PDEATHSIG=SIGKILL`` on every harness. The kernel sends it when the
   *thread* that forked the harness exits, so every harness is spawned from one
   long-lived daemon thread (``spawn``). It is set by exec'ing through
   util-linux's ``setpriv --pdeathsig KILL``, which keeps ``subprocess`` on its
   vfork path; a ``preexec_fn`` forces a full fork (measured here: 0.2 ms vs
   1.6 ms per spawn from a small process, 0.2 ms vs 56 ms with 2 GB resident).
   Where setpriv is missing a ``preexec_fn`` calls prctl through ctypes. The
   signal reaches the harness alone: the kernel clears it in forked children.
2. The keeper: this file run as a stdlib-only script (``python -I -S``, ~13 ms to
   start, in parallel with the harness), started lazily once per owning process
   and shared by all its harnesses. The owner sends it each harness's marker
   (``GYM_HARNESS_MARKER``) and pid over a pipe. EOF on that pipe while markers
   are registered means the owner died without stopping them: the keeper then
   SIGKILLs the harnesses' process groups and every process whose environment
   carries a registered marker (setsid grandchildren, double-forked daemons
   re-parented to PID 1), and exits.

Keeper lifetime: it lives while its owner has a live ``HarnessProcess`` or holds
it (``hold``/``release``: an env holds it from its first reset to ``close`` so
that a reset, which stops one harness and starts the next, does not restart
it). When the last harness stops and no hold is left, the owner closes the pipe
and reaps the keeper, so nothing of ours runs afterwards, which is what the autouse guard in
``tests/conftest.py`` checks after every test (the keeper is a child of the
pytest process). It runs in its own session (a terminal's Ctrl-C does not reach
it), carries no marker, and carries ``GYM_HARNESS_SESSION`` when set, so a keeper
that outlived its owner is visible to the same sweep.

Linux only (``/proc``, prctl). Forking the owner while harnesses run is not
supported: the child forgets the spawner and the keeper (``os.register_at_fork``).
"""

from __future__ import annotations

# The keeper process runs this file as a script: up to the ``__main__`` check below
# it imports only what it needs, to start in ~15 ms instead of ~40 ms.
import os
import signal
import sys
import time
from collections.abc import Collection, Mapping

MARKER_VAR = "GYM_HARNESS_MARKER"
SESSION_VAR = "GYM_HARNESS_SESSION"
_PR_SET_PDEATHSIG = 1
_SPAWN_TIMEOUT_S = 30.0
_KEEPER_EXIT_S = 0.5
_KILL_ROUNDS_S = 3.0


def marked_pids(markers: Collection[str]) -> list[int]:
    """Return the pids, other than ours, whose environment carries one of ``markers``."""
    needles = [f"\0{MARKER_VAR}={marker}\0".encode() for marker in markers]
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                data = b"\0" + f.read() + b"\0"
        except OSError:  # gone, or not ours to read
            continue
        if any(needle in data for needle in needles):
            found.append(int(name))
    return found


def _kill_everything(markers: Mapping[str, int]) -> None:
    """SIGKILL the harnesses' groups and every marked process until none is left."""
    deadline = time.monotonic() + _KILL_ROUNDS_S
    while True:
        for pgid in filter(None, markers.values()):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                continue
        # Only marked processes count as hits: a killed group lingers as zombies until
        # PID 1 reaps them, and those need no more signals.
        pids = marked_pids(markers)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        if not pids or time.monotonic() > deadline:
            return
        time.sleep(0.01)  # the killed may have forked; look again


def _keeper_main() -> None:
    """Read ``+ MARKER PID`` / ``- MARKER`` lines; on EOF kill what is still registered."""
    for name in ("SIGINT", "SIGHUP", "SIGTERM"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    markers: dict[str, int] = {}
    try:
        for line in sys.stdin.buffer:
            op, _, rest = line.decode("ascii", "replace").strip().partition(" ")
            marker, _, pid = rest.partition(" ")
            if op == "+" and marker:
                markers[marker] = int(pid) if pid.isdigit() and int(pid) > 1 else 0
            elif op == "-":
                markers.pop(marker, None)
    except (OSError, ValueError):
        pass  # a broken pipe is the owner's death too
    if markers:
        _kill_everything(markers)


if __name__ == "__main__":
    _keeper_main()
    sys.exit(0)

# Owner side: the keeper client and the spawner thread.
import contextlib  # noqa: E402
import queue  # noqa: E402
import select  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402


class _Keeper:
    """Owner side of the keeper process; every method is thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._markers: dict[str, int] = {}
        self._holds = 0

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    def add(self, marker: str, pid: int = 0) -> None:
        """Register (or update with its pid) a harness marker; start the keeper if needed.

        Raises:
            OSError: The keeper process could not be started.
        """
        with self._lock:
            self._markers[marker] = pid
            self._send(f"+ {marker} {pid}\n")

    def remove(self, marker: str) -> None:
        """Forget a marker whose tree is gone; stop the keeper when none is left. Never raises."""
        with self._lock:
            if self._markers.pop(marker, None) is None:
                return
            if self._markers or self._holds:
                with contextlib.suppress(OSError):  # a later add() starts a fresh keeper
                    self._send(f"- {marker}\n")
                return
            self._shutdown()

    def hold(self) -> None:
        """Keep the keeper running between harnesses until ``release``."""
        with self._lock:
            self._holds += 1

    def release(self) -> None:
        """Undo one ``hold``; stop the keeper when no hold and no harness is left. Never raises."""
        with self._lock:
            self._holds = max(0, self._holds - 1)
            if not self._holds and not self._markers:
                self._shutdown()

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's keeper without touching it."""
        proc, self._proc = self._proc, None
        self._lock = threading.Lock()
        self._markers.clear()
        self._holds = 0
        if proc is not None:
            proc.returncode = 0  # not our child: keep Popen.__del__ from waiting or warning
            if proc.stdin is not None:
                proc.stdin.close()  # our copy only: the parent's keeper still sees EOF

    def _send(self, text: str) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None and proc.stdin is not None:
            try:
                os.write(proc.stdin.fileno(), text.encode())
                return
            except OSError:
                pass  # the keeper died: start another that gets every marker
        self._launch()

    def _launch(self) -> None:
        self._shutdown()
        env = {SESSION_VAR: os.environ[SESSION_VAR]} if SESSION_VAR in os.environ else {}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self._proc = proc
        assert proc.stdin is not None
        lines = "".join(f"+ {m} {pid}\n" for m, pid in self._markers.items())
        os.write(proc.stdin.fileno(), lines.encode())

    def _shutdown(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # EOF with no marker left: the keeper just exits
            wait_exit(proc, _KEEPER_EXIT_S)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_KEEPER_EXIT_S)


class _Spawner:
    """One daemon thread that forks every harness, so PR_SET_PDEATHSIG outlives callers."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        thread = threading.Thread(target=self._serve, name="gym-harness-spawner", daemon=True)
        thread.start()

    def spawn(self, popen: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        request = _Request(popen)
        self._requests.put(request)
        if not request.done.wait(_SPAWN_TIMEOUT_S):
            with request.lock:
                request.abandoned = True
            if not request.done.is_set():
                raise TimeoutError(f"the spawner thread did not spawn within {_SPAWN_TIMEOUT_S} s")
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def _serve(self) -> None:
        while True:
            request = self._requests.get()
            try:
                result = request.popen()
            except BaseException as exc:  # handed to the caller's thread
                request.error = exc
                request.done.set()
                continue
            with request.lock:
                request.result = result
                request.done.set()
                if request.abandoned:  # the caller gave up: leave nothing running
                    result.kill()
                    result.communicate()


class _Request:
    def __init__(self, popen: Callable[[], subprocess.Popen[bytes]]) -> None:
        self.popen = popen
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.abandoned = False
        self.result: subprocess.Popen[bytes] | None = None
        self.error: BaseException | None = None


_SETPRIV = shutil.which("setpriv", path=os.defpath + ":/usr/sbin:/sbin")
_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()
keeper = _Keeper()


def spawn(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None, bufsize: int
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session, with pipes, dying by SIGKILL with this process.

    ``argv[0]`` must be an absolute path. The returned process's pid is the
    harness's own (setpriv execs into it).

    Raises:
        OSError: The process could not be started (also TimeoutError).
    """
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
        spawner = _spawner
    preexec: Callable[[], None] | None = None
    if _SETPRIV is not None:
        argv = [_SETPRIV, "--pdeathsig", "KILL", "--", *argv]
    else:
        preexec = _prctl_preexec(os.getpid())
    return spawner.spawn(
        lambda: subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            bufsize=bufsize,
            start_new_session=True,
            preexec_fn=preexec,  # only where setpriv is missing
        )
    )


def wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    """Reap ``proc``, waking the moment it exits (Popen.wait polls in steps up to 50 ms).

    Raises:
        subprocess.TimeoutExpired: It still runs after ``timeout_s``.
    """
    remaining = timeout_s
    if proc.returncode is None:
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError:  # already reaped, or a kernel without pidfd: Popen.wait copes
            pass
        else:
            try:
                poller = select.poll()
                poller.register(pidfd, select.POLLIN)
                if poller.poll(timeout_s * 1000):
                    remaining = 0.1  # it has exited: waitpid returns at once
            finally:
                os.close(pidfd)
    return proc.wait(timeout=remaining)


def _prctl_preexec(owner_pid: int) -> Callable[[], None]:
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != owner_pid:  # the owner died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def _forget_after_fork() -> None:
    global _spawner, _spawner_lock
    _spawner = None
    _spawner_lock = threading.Lock()
    keeper.forget_after_fork()


os.register_at_fork(after_in_child=_forget_after_fork)
