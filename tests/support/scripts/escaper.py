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
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
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
    raise ValueError(f"unknown attempt {what!r}")


def _checked(result: int, done: str) -> str:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return done


def emit(obj: dict[str, object]) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def main() -> None:
    emit({"type": "ready"})
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
