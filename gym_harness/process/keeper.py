"""The keeper: a small process of ours that parents one harness tree and ends it.

A harness is untrusted: it may fork daemons that call ``setsid``, change their
process group, name and argv, clear their environment, ignore SIGTERM, fork
without pause, or kill our helper processes. Nothing it can change is trusted
to find its processes. Instead the keeper, this file run as a stdlib-only script
(``python -I -S keeper.py FD``, started by ``gym_harness.process.keeper_client``):

* marks itself a child subreaper (``PR_SET_CHILD_SUBREAPER``) and forks the
  harness, so every process of the tree, orphans included, stays a descendant
  of the keeper: the tree is "every descendant of the keeper", found by parent
  links in ``/proc``, and the keeper hosts one harness at a time;
* where a cgroup v2 hierarchy is writable, also forks each harness straight
  into a fresh cgroup of its own (``clone3`` with ``CLONE_INTO_CGROUP``) and
  ends it with ``cgroup.kill`` (atomic, even against a process that forks
  without pause);
* gives the harness ``PR_SET_PDEATHSIG=SIGKILL`` relative to itself, so a harness
  that kills its keeper dies with it: set in the forked child
  (``gym_harness.process.forkexec``, which also enters the env's network namespace
  and applies the confinement of ``gym_harness.process.confine``), or, for a bare
  spawn with no cgroup and no confinement, through util-linux's ``setpriv`` after a
  ``posix_spawn``;
* ends the tree, and says which limit, when it goes past the spawn's memory, process or
  disk limit (the cgroup's own ``memory.max``/``pids.max`` where those controllers are
  delegated; its own watch, every ``LIMIT_POLL_S``, always: resident memory plus the
  shared memory the tree holds in memory files and its private ``/dev/shm``; the disk
  its workspace, home and tmp hold, walked at most every ``DISK_POLL_S``);
* ends the tree when the owner asks (SIGTERM, a grace, then SIGKILL until no
  descendant is left), and, when the owner dies (EOF on the socket with no
  ``quit`` before it), kills the tree, deletes the workspace directories the
  owner registered, and exits;
* makes itself non-dumpable, so a harness of the same user cannot ptrace it or
  take its file descriptors, and keeps its socket to the owner from every harness
  (not inheritable); it ignores SIGINT, SIGHUP and SIGTERM.

The owner talks to it over a UNIX stream socket (fd ``FD``): frames of a 4-byte
length and a ``marshal``-encoded tuple; a ``spawn`` carries the harness's stdin,
stdout and stderr as SCM_RIGHTS file descriptors. Owner -> keeper:
``("spawn", argv, env, cwd, cgroup, policy)`` (``policy``: ``sandbox.policy``; with
``"netns"`` a fourth descriptor, the namespace, follows the pipes), ``("end",
grace_s)``, ``("own", path)``, ``("disown", path)``, ``("quit",)``. Keeper -> owner:
``("spawned", pid, cgroup_dir)``, ``("error", errno, text)``, ``("limit", pid, text)``
(the tree is ended for that limit; its exit follows), ``("exit", pid, code)`` (the
harness's own exit, as a Popen returncode), ``("ended", code)``.

Linux only (``/proc``, prctl, posix_spawn, pidfds in the owner).
"""

from __future__ import annotations

# Run as a script: only small built-in modules, to start in ~15 ms (so no
# contextlib either: try/except/pass below is deliberate, noqa SIM105).
import _socket
import marshal
import os
import select
import signal
import sys
import time
from array import array

TYPE_CHECKING = False  # no typing import at run time
if TYPE_CHECKING:
    from typing import Any

_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_MAX_FRAME = 64 << 20  # argv + environment are far below this
_MAX_FDS = 8
KILL_ROUNDS_S = 3.0
CGROUP_RMDIR_S = 1.0
#: How often the keeper looks at a tree that has a memory or process limit.
LIMIT_POLL_S = 0.05
#: How often, at most, it walks the directories of a tree with a disk limit (and at
#: most a twentieth of the time: a walk of a large tree spaces the next one out).
DISK_POLL_S = 0.25
#: Dispositions the keeper changes, restored to default in the harness.
_RESET_SIGNALS = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGCHLD,
)


def encode(message: tuple[object, ...]) -> bytes:
    """One frame: a 4-byte little-endian length, then ``message`` marshalled."""
    body = marshal.dumps(message)  # type: ignore[arg-type]  # strs, ints, lists, dicts
    return len(body).to_bytes(4, "little") + body


class FrameReader:
    """Splits a byte stream into messages (bounded: a frame over 64 MiB is an error)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[tuple[object, ...]]:
        """Return the messages ``data`` completes.

        Raises:
            ValueError: A frame is oversized or does not decode to a tuple.
        """
        self._buffer += data
        messages = []
        while len(self._buffer) >= 4:
            size = int.from_bytes(self._buffer[:4], "little")
            if size > _MAX_FRAME:
                raise ValueError(f"frame of {size} bytes")
            if len(self._buffer) < 4 + size:
                break
            message = marshal.loads(self._buffer[4 : 4 + size])
            self._buffer = self._buffer[4 + size :]
            if not isinstance(message, tuple) or not message:
                raise ValueError("a frame is not a tuple")
            messages.append(message)
        return messages


class _Keeper:
    def __init__(self, sock: _socket.socket, setpriv: str) -> None:
        self.sock = sock
        self.setpriv = setpriv
        self.me = os.getpid()
        self.root = 0  # the harness's pid while it is unreaped
        self.code: int | None = None
        self.cgroup = ""
        self.cgroup_home: str | None = None
        self.cgroups_probed = False
        self.serial = 0
        self.paths: set[str] = set()
        self.fds: list[int] = []
        #: The tree's (memory MiB, processes) limits, each None for none; when checked last.
        self.limits: tuple[int | None, int | None] = (None, None)
        self.checked = 0.0
        #: The tree's disk limit (bytes, or None), the directories it covers, when the
        #: next walk of them is due; whether it has a view (a private /dev/shm).
        self.disk: tuple[int | None, list[str]] = (None, [])
        self.disk_due = 0.0
        self.view = False
        self.reader = FrameReader()
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    # -- the loop ----------------------------------------------------------

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            watching = self.root and (self.limits != (None, None) or self.disk[0] is not None)
            events = poller.poll(int(LIMIT_POLL_S * 1000) if watching else None)
            if watching and time.monotonic() - self.checked >= LIMIT_POLL_S:
                self._check_limits()
            for fd, _ in events:
                if fd == self.wake_r:
                    self._drain_wake()
                    self._reap()
                    continue
                try:
                    data, ancillary, _flags, _addr = self.sock.recvmsg(
                        1 << 16, _socket.CMSG_SPACE(_MAX_FDS * 4), _socket.MSG_CMSG_CLOEXEC
                    )
                except OSError:
                    data, ancillary = b"", []
                for level, kind, payload in ancillary:
                    if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                        fds = array("i")
                        fds.frombytes(payload[: len(payload) - len(payload) % 4])
                        self.fds.extend(fds)
                if not data:
                    self._owner_died()
                    return
                try:
                    messages = self.reader.feed(data)
                except (ValueError, EOFError, TypeError):
                    self._owner_died()
                    return
                for message in messages:
                    if message[0] == "quit":
                        self._end(0.0)
                        return
                    self._handle(message)

    def _handle(self, message: tuple[object, ...]) -> None:
        op = message[0]
        if op == "spawn":
            argv, env, cwd, cgroup = message[1:5]
            policy = message[5] if len(message) > 5 and isinstance(message[5], dict) else {}
            self._spawn(argv, env, cwd, bool(cgroup), policy)  # type: ignore[arg-type]
        elif op == "end":
            self._end(float(message[1]))  # type: ignore[arg-type]
            self._send(("ended", self.code))
        elif op == "own":
            self.paths.add(str(message[1]))
        elif op == "disown":
            self.paths.discard(str(message[1]))

    def _send(self, message: tuple[object, ...]) -> None:
        try:  # noqa: SIM105
            self.sock.sendall(encode(message))
        except OSError:
            pass  # the owner is gone: its EOF ends us next

    def _owner_died(self) -> None:
        self._end(0.0)
        for path in sorted(self.paths):
            try:
                _fs.remove_tree(path)
            except OSError:
                continue

    # -- spawn -------------------------------------------------------------

    def _spawn(
        self, argv: list[str], env: dict[str, str], cwd: str, cgroup: bool, policy: dict
    ) -> None:
        netns = bool(policy.get("netns"))
        want = 4 if netns else 3
        fds, self.fds = self.fds[:want], self.fds[want:]
        prepared = None
        try:
            if len(fds) != want:
                raise OSError(0, "the spawn request carried no pipes")
            if self._reap():
                self._end(0.0)  # one tree per keeper; the owner ended the last one
            self.code, self.cgroup = None, ""
            self.limits = (policy.get("memory_mb"), policy.get("processes"))
            self.disk = (policy.get("disk_bytes"), list(policy.get("disk_paths") or ()))
            self.view = bool((policy.get("confine") or {}).get("view"))
            if cgroup:
                self.cgroup = self._new_cgroup()
                self._limit_cgroup()
            os.chdir(cwd)
            if policy.get("confine") is not None:
                prepared = _module("confine").prepare(policy["confine"])
            pid = self._fork_exec(argv, env, fds, prepared)
        except OSError as exc:
            self._drop_cgroup()
            self._send(("error", exc.errno or 0, _describe(exc)))
            return
        finally:
            if prepared is not None:
                prepared.close()
            for fd in fds:
                os.close(fd)
            try:  # noqa: SIM105
                os.chdir("/")
            except OSError:
                pass
        self.root = pid
        self.checked = self.disk_due = time.monotonic()
        self._send(("spawned", pid, self.cgroup))

    def _fork_exec(
        self, argv: list[str], env: dict[str, str], fds: list[int], prepared: object
    ) -> int:
        """Start the harness: forked with setup code (forkexec) where a cgroup, a
        namespace or confinement needs it, else by posix_spawn (no code between
        fork and exec; ``setpriv`` sets the parent-death signal)."""
        special = prepared is not None or len(fds) == 4
        if self.cgroup or special:
            forkexec = _module("forkexec")
            options = {
                "reset_signals": _RESET_SIGNALS,
                "netns_fd": fds[3] if len(fds) == 4 else -1,
                "confine": None if prepared is None else lambda: _module("confine").apply(prepared),
            }
            if self.cgroup:  # forked inside its cgroup: no fork of the harness escapes it
                try:
                    return int(
                        forkexec.fork_exec(argv, env, fds[:3], cgroup=self.cgroup, **options)
                    )
                except forkexec.CloneFailed:  # clone3 refused (a seccomp filter?)
                    self._drop_cgroup()
                    self.cgroup_home = None
            if special:
                return int(forkexec.fork_exec(argv, env, fds[:3], **options))
        if self.setpriv:
            argv = [self.setpriv, "--pdeathsig", "KILL", "--", *argv]
        return os.posix_spawn(
            argv[0],
            argv,
            env,
            file_actions=[(os.POSIX_SPAWN_DUP2, fd, n) for n, fd in enumerate(fds)],
            setsid=True,
            setsigdef=_RESET_SIGNALS,
            setsigmask=(),
        )

    def _new_cgroup(self) -> str:
        if not self.cgroups_probed:
            self.cgroups_probed = True
            known = os.uname().machine in ("x86_64", "aarch64")  # where clone3 is 435
            self.cgroup_home = _fs.cgroup_base() if known else None
        if self.cgroup_home is None:
            return ""
        self.serial += 1
        path = f"{self.cgroup_home}/gym_harness-{self.me}-{self.serial}"
        try:
            os.mkdir(path)
            if not os.path.exists(f"{path}/cgroup.kill"):  # before Linux 5.14
                os.rmdir(path)
                self.cgroup_home = None
                return ""
        except OSError:
            self.cgroup_home = None  # not ours to write after all: subreaper alone
            return ""
        return path

    def _drop_cgroup(self) -> None:
        path, self.cgroup = self.cgroup, ""
        if not path:
            return
        deadline = time.monotonic() + CGROUP_RMDIR_S
        while True:
            try:
                os.rmdir(path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.005)  # the last processes are still leaving it

    # -- limits ------------------------------------------------------------

    def _limit_cgroup(self) -> None:
        """Have the kernel enforce the limits where the cgroup has the controllers."""
        memory_mb, processes = self.limits
        for name, value in (("memory.max", memory_mb and memory_mb << 20), ("pids.max", processes)):
            if value and os.path.exists(f"{self.cgroup}/{name}"):
                try:  # noqa: SIM105
                    _fs.write_file(f"{self.cgroup}/{name}", str(value))
                except OSError:
                    pass  # the watch below still holds the limit

    def _check_limits(self) -> None:
        """End the tree if it went past a limit, telling the owner which first.

        The kernel's own counts come first (a cgroup's ``pids.events`` and
        ``memory.events``, where the controllers are there); the watch, every
        ``LIMIT_POLL_S``, counts the tree's processes and sums their resident memory and
        the shared memory they hold; at most every ``DISK_POLL_S`` it walks the tree's
        directories and sums the disk their files hold.
        """
        now = self.checked = time.monotonic()
        memory_mb, processes = self.limits
        disk_bytes, disk_paths = self.disk
        pids = self._members()
        breach = ""
        if processes is not None and (
            len(pids) > processes or _fs.cgroup_event(self.cgroup, "pids", "max")
        ):
            breach = f"max_processes={processes}: the tree reached {len(pids)} processes"
        elif memory_mb is not None:
            resident = sum(_fs.resident_bytes(pid) for pid in pids)
            shared = _fs.shared_bytes(pids, self.view)
            held = resident + shared
            if held > memory_mb << 20 or _fs.cgroup_event(self.cgroup, "memory", "oom_kill"):
                breach = (f"memory_limit_mb={memory_mb}: the tree held {held >> 20} MiB "
                          f"({resident >> 20} MiB resident, {shared >> 20} MiB in shared "
                          "memory files)")  # fmt: skip
        if not breach and disk_bytes is not None and now >= self.disk_due:
            used = _fs.disk_bytes(disk_paths, disk_bytes)
            after = time.monotonic()
            self.disk_due = after + max(DISK_POLL_S, 20 * (after - now))
            if used > disk_bytes:
                breach = (f"max_workspace_bytes={disk_bytes}: the workspace, home and tmp "
                          f"held more than {used} bytes")  # fmt: skip
        if breach:
            self._send(("limit", self.root, breach))
            self.limits, self.disk = (None, None), (None, [])
            self._end(0.0)

    def _members(self) -> list[int]:
        if self.cgroup:
            try:
                with open(f"{self.cgroup}/cgroup.procs") as f:
                    return [int(line) for line in f if line.strip()]
            except (OSError, ValueError):
                pass
        return _fs.descendants(self.me)

    # -- end ---------------------------------------------------------------

    def _end(self, grace_s: float) -> None:
        """SIGTERM every descendant, wait ``grace_s``, then SIGKILL until none is left."""
        if grace_s > 0 and self._reap():
            self._signal_all(signal.SIGTERM)
            self._wait_empty(time.monotonic() + grace_s)
        if self.cgroup:
            try:  # noqa: SIM105
                _fs.write_file(f"{self.cgroup}/cgroup.kill", "1")
            except OSError:
                pass
        deadline = time.monotonic() + KILL_ROUNDS_S
        while self._reap() and time.monotonic() < deadline:
            self._signal_all(signal.SIGKILL)  # the killed may have forked: look again
            self._wait_empty(time.monotonic() + 0.01)
        self._drop_cgroup()

    def _signal_all(self, sig: int) -> None:
        for pid in _fs.descendants(self.me):
            try:
                os.kill(pid, sig)
            except OSError:
                continue

    def _wait_empty(self, deadline: float) -> None:
        poller = select.poll()
        poller.register(self.wake_r, select.POLLIN)
        while self._reap() and (remaining := deadline - time.monotonic()) > 0:
            poller.poll(max(1, int(remaining * 1000)))
            self._drain_wake()

    def _reap(self) -> bool:
        """Reap every exited child; return whether any child (hence descendant) is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.root:
                self.root, self.code = 0, os.waitstatus_to_exitcode(status)
                self._send(("exit", pid, self.code))

    def _drain_wake(self) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except OSError:
            pass


_MODULES: dict[str, object] = {}
#: ``gym_harness.process.procfs``, loaded by ``main`` (the keeper's own process only).
_fs: Any = None


def _module(name: str) -> Any:
    """A sibling stdlib-only module (``forkexec``, ``confine``), loaded by its path once."""
    if name not in _MODULES:
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
        spec = importlib.util.spec_from_file_location(f"_gym_harness_{name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _MODULES[name] = module
    return _MODULES[name]


def _describe(exc: OSError) -> str:
    text = exc.strerror or str(exc)
    return f"{text}: {exc.filename!r}" if exc.filename else text


def _prctl(*args: int) -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(*args, 0, 0, 0)


def main(argv: list[str]) -> None:
    """Entry point of the keeper process: ``keeper.py SOCKET_FD [SETPRIV]``."""
    global _fs
    _fs = _module("procfs")
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _prctl(_PR_SET_DUMPABLE, 0)  # no ptrace, no pidfd_getfd of our socket by the harness
    os.set_inheritable(int(argv[1]), False)  # pass_fds made it inheritable: no harness gets it
    sock = _socket.socket(fileno=int(argv[1]))
    keeper = _Keeper(sock, argv[2] if len(argv) > 2 else "")
    try:
        keeper.run()
    finally:
        sock.close()


if __name__ == "__main__":
    main(sys.argv)
    # Everything is ended and closed: skip the interpreter's finalization (milliseconds
    # the owner's close() would wait for; nothing is buffered, stdio is /dev/null).
    os._exit(0)
