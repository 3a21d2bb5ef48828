"""What the keeper runs between fork and exec: the harness's process, set up and confined.

Loaded by the keeper (``gym_harness.process.keeper``, a stdlib-only script) by its file
path, so it imports only built-in modules. The keeper is single-threaded, so the forked
child may run Python until it execs, as after ``os.fork``. In the child, in order:

1. the pipes become stdin, stdout and stderr; a new session; default signal dispositions;
2. ``PR_SET_PDEATHSIG`` = SIGKILL relative to the keeper (a harness that kills its keeper
   dies with it), checked against a keeper that died before the call;
3. with a network namespace (``sandbox="strict"``), ``setns`` into it, while the child
   still has the capability to;
4. the confinement (``gym_harness.process.confine``: no-new-privs, capabilities dropped,
   Landlock, seccomp), last, so nothing after it needs a right it takes away;
5. ``execve``. A failure in any step is reported to the keeper through a close-on-exec
   pipe (EOF on it means the exec worked) and the child exits 127.

With a cgroup the fork is ``clone3(CLONE_INTO_CGROUP)``: the child starts inside its
cgroup (a move between cgroups waits for an RCU grace period, ~16 ms on a loaded machine;
a clone into it does not). Without one it is a plain ``os.fork``.
"""

from __future__ import annotations

import ctypes
import os
import signal

TYPE_CHECKING = False  # no typing import: the keeper starts in milliseconds
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["CloneFailed", "fork_exec"]

_SYS_CLONE3 = 435  # the same number on x86_64 and aarch64 (the generic syscall table)
_SYS_SETNS = {"x86_64": 308, "aarch64": 268}
_CLONE_INTO_CGROUP = 0x200000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1

_libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held across the clone
_libc.syscall.restype = ctypes.c_long


class CloneFailed(OSError):
    """clone3 itself failed (nothing was started)."""


def fork_exec(
    argv: Sequence[str],
    env: dict[str, str],
    fds: Sequence[int],
    *,
    reset_signals: Sequence[int],
    cgroup: str = "",
    netns_fd: int = -1,
    confine: Callable[[], None] | None = None,
) -> int:
    """Start ``argv`` with ``fds`` as its stdio, set up as the module docstring says.

    Args:
        argv: The command, an absolute path first.
        env: Its whole environment.
        fds: Its stdin, stdout and stderr.
        reset_signals: Signals whose disposition the keeper changed (set to default).
        cgroup: A cgroup v2 directory to start it in, if any.
        netns_fd: A network namespace to enter, if any (-1: none).
        confine: Called last in the child (``confine.apply`` of a prepared policy).

    Returns:
        The child's pid (the exec succeeded).

    Raises:
        CloneFailed: clone3 was refused (a seccomp filter of the caller's, an old kernel).
        OSError: A step in the child or the exec failed; ``errno`` and text say which.
    """
    keeper = os.getpid()
    err_r, err_w = os.pipe()  # both close-on-exec
    dirfd = -1
    try:
        if cgroup:
            dirfd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
            args = (ctypes.c_uint64 * 11)()  # struct clone_args, CLONE_ARGS_SIZE_VER2
            args[0], args[4], args[10] = _CLONE_INTO_CGROUP, signal.SIGCHLD, dirfd
            pid = _libc.syscall(_SYS_CLONE3, ctypes.byref(args), ctypes.sizeof(args))
            if pid < 0:
                code = ctypes.get_errno()
                raise CloneFailed(code, f"clone3 into {cgroup}: {os.strerror(code)}")
        else:
            pid = os.fork()
        if pid == 0:
            _child(argv, env, fds, reset_signals, keeper, netns_fd, confine, err_w)
        os.close(err_w)
        err_w = -1
        report = b""
        while chunk := os.read(err_r, 4096):
            report += chunk
        if report:
            os.waitpid(pid, 0)
            number, _, text = report.decode(errors="replace").partition(" ")
            raise OSError(int(number), text or os.strerror(int(number)))
        return int(pid)
    finally:
        for fd in (dirfd, err_r, err_w):
            if fd >= 0:
                os.close(fd)


def _child(
    argv: Sequence[str],
    env: dict[str, str],
    fds: Sequence[int],
    reset_signals: Sequence[int],
    keeper: int,
    netns_fd: int,
    confine: Callable[[], None] | None,
    err_w: int,
) -> None:
    step = "setting up the harness's stdio"
    try:
        for n, fd in enumerate(fds):
            os.dup2(fd, n)
        os.setsid()
        for sig in reset_signals:
            signal.signal(sig, signal.SIG_DFL)
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != keeper:
            os._exit(127)  # the keeper died before the call: so do we
        if netns_fd >= 0:
            step = "entering the env's network namespace"
            number = _SYS_SETNS.get(os.uname().machine, -1)
            if _libc.syscall(number, netns_fd, _CLONE_NEWNET) != 0:
                code = ctypes.get_errno()
                raise OSError(code, os.strerror(code))
        if confine is not None:
            step = "confining the harness"
            confine()
        step = f"executing {argv[0]}"
        os.execve(argv[0], list(argv), env)
    except BaseException as exc:
        code = exc.errno if isinstance(exc, OSError) and exc.errno else 1
        text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        try:  # noqa: SIM105
            os.write(err_w, f"{code} {step}: {text}".encode(errors="replace"))
        except OSError:
            pass
    finally:
        os._exit(127)
