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
* gives the harness ``PR_SET_PDEATHSIG=SIGKILL`` relative to itself (through
  util-linux's ``setpriv``, so the spawn needs no code between fork and exec),
  so a harness that kills its keeper dies with it;
* ends the tree when the owner asks (SIGTERM, a grace, then SIGKILL until no
  descendant is left), and, when the owner dies (EOF on the socket with no
  ``quit`` before it), kills the tree, deletes the workspace directories the
  owner registered, and exits;
* makes itself non-dumpable, so a harness of the same user cannot ptrace it or
  take its file descriptors; it ignores SIGINT, SIGHUP and SIGTERM.

The owner talks to it over a UNIX stream socket (fd ``FD``): frames of a 4-byte
length and a ``marshal``-encoded tuple; a ``spawn`` carries the harness's stdin,
stdout and stderr as SCM_RIGHTS file descriptors. Owner -> keeper:
``("spawn", argv, env, cwd, cgroup)``, ``("end", grace_s)``, ``("own", path)``,
``("disown", path)``, ``("quit",)``. Keeper -> owner: ``("spawned", pid,
cgroup_dir)``, ``("error", errno, text)``, ``("exit", pid, code)`` (the harness's
own exit, as a Popen returncode), ``("ended", code)``.

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

_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_MAX_FRAME = 64 << 20  # argv + environment are far below this
_MAX_FDS = 8
KILL_ROUNDS_S = 3.0
_SYS_CLONE3 = 435  # the same number on x86_64 and aarch64 (the generic syscall table)
_CLONE_INTO_CGROUP = 0x200000000
CGROUP_RMDIR_S = 1.0
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


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root``, parents before children, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
            try:
                stat = os.read(fd, 1024)
            finally:
                os.close(fd)
        except OSError:
            continue  # gone
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split(b" ", 2)
        if len(fields) >= 2 and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    found, queue = [], [root]
    while queue:
        for pid in children.get(queue.pop(), ()):
            found.append(pid)
            queue.append(pid)
    return found


def cgroup_base() -> str | None:
    """The directory of this process's cgroup v2 when we may create cgroups in it."""
    try:
        with open("/proc/self/cgroup") as f:
            own = next((line[3:].strip() for line in f if line.startswith("0::")), None)
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    if own is None:
        return None
    for fields in mounts:
        sep = fields.index("-") if "-" in fields else -1
        if sep < 0 or fields[sep + 1] != "cgroup2":
            continue
        root, point = fields[3], fields[4]
        rel = own if root == "/" else own[len(root) :] if own.startswith(root) else None
        if rel is None:
            continue
        base = point + rel.rstrip("/")
        if os.access(base, os.W_OK) and os.access(f"{base}/cgroup.procs", os.W_OK):
            return base
    return None


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def remove_tree(path: str) -> None:
    """Delete ``path`` and everything in it, restoring permissions a harness removed."""
    import shutil  # only at the end of the keeper's life, or in the owner

    def fix(_func: object, failed: str, _exc: object) -> None:
        try:
            os.chmod(os.path.dirname(failed), 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)
        except OSError:
            pass

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=fix)


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
            for fd, _ in poller.poll():
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
            self._spawn(argv, env, cwd, bool(cgroup))  # type: ignore[arg-type]
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
                remove_tree(path)
            except OSError:
                continue

    # -- spawn -------------------------------------------------------------

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: str, cgroup: bool) -> None:
        fds, self.fds = self.fds[:3], self.fds[3:]
        try:
            if len(fds) != 3:
                raise OSError(0, "the spawn request carried no pipes")
            if self._reap():
                self._end(0.0)  # one tree per keeper; the owner ended the last one
            self.code, self.cgroup = None, ""
            if cgroup:
                self.cgroup = self._new_cgroup()
            os.chdir(cwd)
            if self.setpriv:
                argv = [self.setpriv, "--pdeathsig", "KILL", "--", *argv]
            pid = 0
            if self.cgroup:  # forked inside its cgroup: no fork of the harness escapes it
                try:
                    pid = _spawn_into_cgroup(self.cgroup, argv, env, fds)
                except _CloneFailed:  # clone3 refused (a seccomp filter?): subreaper alone
                    self._drop_cgroup()
                    self.cgroup_home = None
            if not pid:
                pid = os.posix_spawn(
                    argv[0],
                    argv,
                    env,
                    file_actions=[(os.POSIX_SPAWN_DUP2, fd, n) for n, fd in enumerate(fds)],
                    setsid=True,
                    setsigdef=_RESET_SIGNALS,
                    setsigmask=(),
                )
        except OSError as exc:
            self._drop_cgroup()
            self._send(("error", exc.errno or 0, _describe(exc)))
            return
        finally:
            for fd in fds:
                os.close(fd)
            try:  # noqa: SIM105
                os.chdir("/")
            except OSError:
                pass
        self.root = pid
        self._send(("spawned", pid, self.cgroup))

    def _new_cgroup(self) -> str:
        if not self.cgroups_probed:
            self.cgroups_probed = True
            known = os.uname().machine in ("x86_64", "aarch64")  # where clone3 is 435
            self.cgroup_home = cgroup_base() if known else None
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

    # -- end ---------------------------------------------------------------

    def _end(self, grace_s: float) -> None:
        """SIGTERM every descendant, wait ``grace_s``, then SIGKILL until none is left."""
        if grace_s > 0 and self._reap():
            self._signal_all(signal.SIGTERM)
            self._wait_empty(time.monotonic() + grace_s)
        if self.cgroup:
            try:  # noqa: SIM105
                _write(f"{self.cgroup}/cgroup.kill", "1")
            except OSError:
                pass
        deadline = time.monotonic() + KILL_ROUNDS_S
        while self._reap() and time.monotonic() < deadline:
            self._signal_all(signal.SIGKILL)  # the killed may have forked: look again
            self._wait_empty(time.monotonic() + 0.01)
        self._drop_cgroup()

    def _signal_all(self, sig: int) -> None:
        for pid in descendants(self.me):
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


class _CloneFailed(OSError):
    """clone3 itself failed (nothing was started)."""


def _spawn_into_cgroup(cgroup: str, argv: list[str], env: dict[str, str], fds: list[int]) -> int:
    """Fork straight into ``cgroup`` (clone3 with CLONE_INTO_CGROUP) and exec ``argv``.

    Moving a process between cgroups waits for an RCU grace period (measured here:
    ~16 ms on a loaded machine); a clone into the cgroup does not. Python has no
    clone3, so it is called through ctypes; the keeper is single-threaded, so the
    child is as safe as after ``os.fork`` and only dup2s, resets signals and execs.

    Raises:
        OSError: The clone or the exec failed (the exec's errno is reported back).
    """
    import ctypes

    libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held across the clone
    libc.syscall.restype = ctypes.c_long
    args = (ctypes.c_uint64 * 11)()  # struct clone_args, CLONE_ARGS_SIZE_VER2
    dirfd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    err_r, err_w = os.pipe()  # both close-on-exec: EOF on err_r means the exec worked
    args[0], args[4], args[10] = _CLONE_INTO_CGROUP, signal.SIGCHLD, dirfd
    try:
        pid = libc.syscall(_SYS_CLONE3, ctypes.byref(args), ctypes.sizeof(args))
        if pid == 0:  # the child
            try:
                for n, fd in enumerate(fds):
                    os.dup2(fd, n)
                os.setsid()
                for sig in _RESET_SIGNALS:
                    signal.signal(sig, signal.SIG_DFL)
                os.execve(argv[0], argv, env)
            except BaseException as exc:
                code = exc.errno if isinstance(exc, OSError) and exc.errno else 1
                os.write(err_w, str(code).encode())
            finally:
                os._exit(127)
        if pid < 0:
            code = ctypes.get_errno()
            raise _CloneFailed(code, f"clone3 into {cgroup}: {os.strerror(code)}")
        os.close(err_w)
        err_w = -1
        report = b""
        while chunk := os.read(err_r, 64):
            report += chunk
        if report:
            os.waitpid(pid, 0)
            code = int(report)
            raise OSError(code, os.strerror(code), argv[0])
        return int(pid)
    finally:
        for fd in (dirfd, err_r, err_w):
            if fd >= 0:
                os.close(fd)


def _describe(exc: OSError) -> str:
    text = exc.strerror or str(exc)
    return f"{text}: {exc.filename!r}" if exc.filename else text


def _prctl(*args: int) -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(*args, 0, 0, 0)


def main(argv: list[str]) -> None:
    """Entry point of the keeper process: ``keeper.py SOCKET_FD [SETPRIV]``."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _prctl(_PR_SET_DUMPABLE, 0)  # no ptrace, no pidfd_getfd of our socket by the harness
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
