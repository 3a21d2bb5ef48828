"""A line-protocol v1 harness that tries to escape its confinement (tests/process/test_sandbox.py).

Each message is a JSON object ``{"try": NAME, ...arguments}``; the harness attempts
that escape and answers with a JSON text ``{"ok": bool, "detail": str}``: ``ok`` is
True when the attempt *succeeded* (the sandbox did not stop it).

    read PATH          open and read a file
    write PATH         create a file and write to it
    connect PORT [host]  TCP connect (host 127.0.0.1 by default)
    udp PORT           send a UDP datagram to 127.0.0.1:PORT
    raw                open a raw IPv4 socket
    signal PID         os.kill(PID, 0)
    environ PID        read /proc/PID/environ
    ptrace PID         attach to PID (seize, interrupt, detach)
    mount              mount a tmpfs on the workspace's ``m`` (in a mount namespace of
                       its own where it may make one, so nothing of it outlives it)
    netns PID          setns into PID's network namespace
    alloc MB           allocate MB of memory, touching every page, then hold it
    forkbomb N         fork N children that sleep
    env NAME           the value of an environment variable (always "ok")
    unix PATH          connect to the pathname unix socket PATH
    unix_scan [SUFFIX] connect to every pathname unix socket ``/proc/*/net/unix`` lists
                       outside the working directory, or to those whose path ends with
                       SUFFIX (ok: one answered; detail: which)
    own_unix           bind, listen and connect to a unix socket in the working directory
    tty PATH           open the terminal PATH, write to it and type into it (TIOCSTI)
    own_pty            open a pseudo-terminal of its own and write through it
    tiocsti            type a character into a pseudo-terminal of its own (TIOCSTI)
    list_dev           the names in /dev (always "ok")
    posix_shm          create, write and read back a POSIX shared memory file
    memfd MB           hold MB in a memory file (written, never mapped), then sleep
    shm MB             hold MB in a file in /dev/shm, then sleep
    fill MB            write MB to a file in the working directory, then sleep
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import pty
import socket
import sys
import termios
import time

libc = ctypes.CDLL(None, use_errno=True)


def attempt(cmd: dict[str, object]) -> str:
    what = cmd["try"]
    arg = cmd.get("arg")
    if what == "read":
        with open(str(arg), "rb") as f:
            return f.read(200).decode(errors="replace")
    if what == "write":
        with open(str(arg), "w") as f:
            f.write("planted")
        return "written"
    if what == "connect":
        with socket.create_connection((str(cmd.get("host", "127.0.0.1")), int(arg)), 5):
            return "connected"
    if what == "udp":
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"x", ("127.0.0.1", int(arg)))
        return "sent"
    if what == "raw":
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
        return "opened"
    if what == "signal":
        os.kill(int(arg), 0)
        return "signalled"
    if what == "environ":
        with open(f"/proc/{int(arg)}/environ", "rb") as f:
            return f"{len(f.read())} bytes"
    if what == "ptrace":  # seize, stop, and let go at once: the env goes on
        pid = int(arg)
        _checked(libc.ptrace(0x4206, pid, None, None), "seized")  # PTRACE_SEIZE
        libc.ptrace(0x4207, pid, None, None)  # PTRACE_INTERRUPT
        os.waitpid(pid, 0x40000000)  # __WALL: its stop
        return _checked(libc.ptrace(17, pid, None, None), "attached")  # PTRACE_DETACH
    if what == "mount":  # in a mount namespace of its own where it may make one
        os.makedirs("m", exist_ok=True)
        private = libc.unshare(0x00020000) == 0  # CLONE_NEWNS
        if private:  # and not a mount of the host's, where a leaked mount would stay
            _checked(libc.mount(b"none", b"/", None, 0x40000 | 0x4000, None), "private")
        return _checked(libc.mount(b"none", b"m", b"tmpfs", 0, None), "mounted")
    if what == "netns":  # the env's (the host's) network namespace, by its pid
        fd = os.open(f"/proc/{int(arg)}/ns/net", os.O_RDONLY)
        return _checked(libc.setns(fd, 0x40000000), "joined")
    if what == "alloc":
        held = [bytearray(1 << 20) for _ in range(int(arg))]  # zero-filled: touched
        time.sleep(30)
        return f"held {len(held)} MiB"
    if what == "forkbomb":
        for _ in range(int(arg)):
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
        time.sleep(30)
        return "forked"
    if what == "env":
        return os.environ.get(str(arg), "")
    if what == "unix":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(arg))
        return "connected"
    if what == "unix_scan":
        return _unix_scan(str(arg or ""))
    if what == "own_unix":
        with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
            server.bind("own.sock")
            server.listen()
            client.connect("own.sock")
            os.unlink("own.sock")
        return "connected"
    if what == "tty":
        fd = os.open(str(arg), os.O_RDWR | os.O_NOCTTY)
        try:
            os.write(fd, b"from the harness\n")
            fcntl.ioctl(fd, termios.TIOCSTI, b"x")
        finally:
            os.close(fd)
        return "typed"
    if what == "own_pty":
        leader, follower = pty.openpty()
        os.write(follower, b"mine\n")
        got = os.read(leader, 64)
        os.close(leader)
        os.close(follower)
        return got.decode()
    if what == "tiocsti":
        leader, follower = pty.openpty()
        try:
            fcntl.ioctl(follower, termios.TIOCSTI, b"x")
        finally:
            os.close(leader)
            os.close(follower)
        return "typed"
    if what == "list_dev":
        return " ".join(sorted(os.listdir("/dev")))
    if what == "posix_shm":
        path = f"/dev/shm/escaper-{os.getpid()}"
        with open(path, "w") as f:
            f.write("shared")
        with open(path) as f:
            text = f.read()
        os.unlink(path)
        return text
    if what in ("memfd", "shm", "fill"):
        if what == "memfd":
            fd = os.memfd_create("held")
        else:
            where = "/dev/shm/held" if what == "shm" else "filler"
            fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        block = b"x" * (1 << 20)
        for _ in range(int(arg)):  # type: ignore[call-overload]
            try:
                os.write(fd, block)
            except OSError:
                break  # full: hold what it has
        time.sleep(30)
        return "held"
    raise ValueError(f"unknown attempt {what!r}")


def _unix_scan(suffix: str) -> str:
    """Connect to every pathname unix socket any readable ``/proc/*/net/unix`` lists
    whose path ends with ``suffix``."""
    paths: set[str] = set()
    for table in ["/proc/net/unix", *(f"/proc/{pid}/net/unix" for pid in os.listdir("/proc"))]:
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) >= 8 and fields[7].startswith("/"):
                paths.add(fields[7])
    here = os.getcwd()
    reached = []
    for path in sorted(paths):
        if path.startswith(here + "/") or not path.endswith(suffix):
            continue
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(2)
            try:
                sock.connect(path)
            except OSError:
                continue
            reached.append(path)
    if not reached:
        raise PermissionError(f"none of {len(paths)} listed sockets answered")
    return " ".join(reached)


def _checked(result: int, done: str) -> str:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return done


def emit(obj: dict[str, object]) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def main() -> None:
    emit({"type": "ready", "fork": True})  # its state is all in its workspace and home
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("type") != "message":
            continue
        try:
            result = {"ok": True, "detail": attempt(json.loads(str(msg["content"])))}
        except Exception as exc:  # the denial is the answer
            result = {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}
        emit({"type": "turn_complete", "response": json.dumps(result), "done": False})


if __name__ == "__main__":
    main()
