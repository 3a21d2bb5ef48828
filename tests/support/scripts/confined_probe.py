"""Confine this process with ``gym_harness/process/confine.py``, then try things.

Usage: ``python confined_probe.py`` with a JSON job on stdin::

    {"module": "<path of confine.py>", "policy": {...} or null, "uid": 65534 or null,
     "ops": [["<key>", "<op>", arg, ...], ...]}

The module is loaded by file path, as the keeper loads it. ``prepare`` runs first (as
the keeper does, before its fork), then the switch to ``uid`` if one is given, then
``apply`` (skipped when the policy is null: the unconfined baseline). Each op then
runs and its outcome is printed as one JSON object ``{key: outcome}`` on stdout: "ok",
a value, or the errno's name (``"EACCES"``). Ops:

    read PATH / write PATH / listdir PATH   open for reading / create and write / list
    symlink TARGET LINK            create LINK -> TARGET, then read through it
    link TARGET LINK               hard-link TARGET as LINK
    rename FROM TO / truncate PATH  rename / truncate(2) by path
    exec ARGV...                   run it; its exit code
    connect PORT / bind PORT       TCP on 127.0.0.1
    fastopen PORT                  TCP Fast Open: sendto(MSG_FASTOPEN) to 127.0.0.1
    socket FAMILY TYPE PROTO       socket(2) with those numbers
    abstract NAME                  connect to the abstract unix socket NAME
    ptrace PID                     PTRACE_ATTACH, then detach
    kill PID                       kill(PID, 0)
    mount TARGET                   mount a tmpfs on TARGET
    unshare FLAGS / clone FLAGS    in a child: unshare(FLAGS) / raw clone(FLAGS | SIGCHLD)
    clone3                         clone3(NULL, 0): ENOSYS when filtered, else EINVAL
    syscall NR                     syscall(NR) (an x32 number, say); its result
    int80                          a child calls getpid through the i386 entry (int 0x80)
    thread                         a Python thread runs
    node_worker                    node starts a worker thread, which answers 42
    caps                           the Cap* lines of an exec'ed cat's /proc/self/status
    loopback                       in a child in a fresh network namespace: lo's state
                                   before and after bring_loopback_up, then a TCP echo
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import importlib.util
import json
import mmap
import os
import socket
import struct
import subprocess
import sys
import threading

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
_PTRACE_ATTACH, _PTRACE_DETACH, _SIGCHLD, _WALL = 16, 17, 17, 0x40000000
_SYS_CLONE, _SYS_CLONE3 = {"x86_64": (56, 435), "aarch64": (220, 435)}[os.uname().machine]
_NODE_WORKER = (
    "const {Worker} = require('worker_threads');"
    "const w = new Worker(\"require('worker_threads').parentPort.postMessage(6 * 7)\","
    " {eval: true});"
    "w.on('message', (m) => { console.log(m); process.exit(0); });"
)


def _errno_name(code: int) -> str:
    return errno.errorcode.get(code, str(code))


def _checked(result: int) -> str:
    return "ok" if result >= 0 else _errno_name(ctypes.get_errno())


def _in_child(body: object) -> str:
    """Run ``body()`` (returns 0 or an errno) in a forked child; its outcome."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(body())  # type: ignore[operator]
        finally:
            os._exit(255)
    status = os.waitpid(pid, 0)[1]
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    code = os.waitstatus_to_exitcode(status)
    return "ok" if code == 0 else _errno_name(code)


def _raw_clone(flags: int) -> str:
    words = [ctypes.c_long(w) for w in (_SYS_CLONE, flags | _SIGCHLD, 0, 0, 0, 0)]
    pid = libc.syscall(*words)  # stack 0: the child runs on a copy of ours, like fork
    if pid == 0:
        os._exit(0)  # the child of a raw clone leaves at once
    if pid < 0:
        return _errno_name(ctypes.get_errno())
    os.waitpid(pid, 0)
    return "ok"


def _int80() -> str:
    # mov eax, 20 (getpid in the i386 table); int 0x80; ret
    code = bytes.fromhex("b814000000cd80c3")
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    address = ctypes.addressof(ctypes.c_char.from_buffer(page))
    getpid = ctypes.CFUNCTYPE(ctypes.c_int)(address)
    return _in_child(lambda: 0 if getpid() == os.getpid() else 1)


def _loopback(confine: object) -> dict[str, object]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        report: dict[str, object] = {}
        try:
            if libc.unshare(0x40000000) != 0:
                raise OSError(ctypes.get_errno(), "unshare")
            report["before"] = _lo_up()
            confine.bring_loopback_up()  # type: ignore[attr-defined]
            report["after"] = _lo_up()
            server = socket.create_server(("127.0.0.1", 0))
            with server, socket.create_connection(server.getsockname(), timeout=5) as client:
                peer = server.accept()[0]
                client.sendall(b"ping")
                report["echo"] = peer.recv(4).decode()
                peer.close()
        except OSError as exc:
            report["error"] = f"{_errno_name(exc.errno or 0)} {exc}"
        os.write(write, json.dumps(report).encode())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 4096):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(data)


def _caps_after_exec() -> dict[str, str]:
    """The Cap* lines of /proc/self/status as an exec'ed program sees them."""
    cat = ["/usr/bin/cat", "/proc/self/status"]
    status = subprocess.run(cat, capture_output=True, text=True, timeout=30, check=True).stdout
    fields = (line.split(":", 1) for line in status.splitlines())
    return {name: value.strip() for name, value in fields if name.startswith("Cap")}


def _lo_up() -> bool:
    """Whether lo is up in this network namespace (sysfs shows the one it was mounted in)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        return bool(struct.unpack("16sH22x", fcntl.ioctl(sock, 0x8913, request))[1] & 1)


def run(op: str, args: list[object], confine: object) -> object:
    """One op's outcome; OSError becomes its errno's name."""
    try:
        if op == "read":
            with open(str(args[0]), "rb") as f:
                f.read(1)
        elif op == "write":
            with open(str(args[0]), "w") as f:
                f.write("written")
        elif op == "listdir":
            os.listdir(str(args[0]))
        elif op == "symlink":  # make LINK point at TARGET, then read through it
            os.symlink(str(args[0]), str(args[1]))
            with open(str(args[1]), "rb") as f:
                f.read(1)
        elif op == "link":  # hard-link TARGET as LINK
            os.link(str(args[0]), str(args[1]))
        elif op == "rename":
            os.rename(str(args[0]), str(args[1]))
        elif op == "truncate":  # by path, no open
            os.truncate(str(args[0]), 0)
        elif op == "exec":
            argv = [str(a) for a in args]
            return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode
        elif op in ("connect", "bind"):
            with socket.socket() as sock:
                if op == "connect":
                    sock.settimeout(5)
                    sock.connect(("127.0.0.1", int(args[0])))  # type: ignore[call-overload]
                else:
                    sock.bind(("127.0.0.1", int(args[0])))  # type: ignore[call-overload]
        elif op == "fastopen":
            with socket.socket() as sock:
                sock.sendto(b"x", socket.MSG_FASTOPEN, ("127.0.0.1", int(args[0])))  # type: ignore[call-overload]
        elif op == "socket":
            socket.socket(*(int(a) for a in args)).close()  # type: ignore[call-overload]
        elif op == "abstract":
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect("\0" + str(args[0]))
        elif op == "ptrace":
            pid = int(args[0])  # type: ignore[call-overload]
            if libc.ptrace(_PTRACE_ATTACH, pid, None, None) != 0:
                return _errno_name(ctypes.get_errno())
            os.waitpid(pid, _WALL)  # the stop the attach causes
            libc.ptrace(_PTRACE_DETACH, pid, None, None)
        elif op == "kill":
            os.kill(int(args[0]), 0)  # type: ignore[call-overload]
        elif op == "mount":
            return _checked(libc.mount(b"none", str(args[0]).encode(), b"tmpfs", 0, None))
        elif op == "unshare":
            flags = int(args[0])  # type: ignore[call-overload]
            return _in_child(lambda: 0 if libc.unshare(flags) == 0 else ctypes.get_errno())
        elif op == "clone":
            return _raw_clone(int(args[0]))  # type: ignore[call-overload]
        elif op == "clone3":
            return _checked(libc.syscall(ctypes.c_long(_SYS_CLONE3), None, ctypes.c_long(0)))
        elif op == "syscall":
            result = libc.syscall(ctypes.c_long(int(args[0])))  # type: ignore[call-overload]
            return result if result >= 0 else _errno_name(ctypes.get_errno())
        elif op == "int80":
            return _int80()
        elif op == "thread":
            seen: list[str] = []
            worker = threading.Thread(target=lambda: seen.append("ok"))
            worker.start()
            worker.join(10)
            return seen[0] if seen else "no result"
        elif op == "node_worker":
            node = ["/usr/bin/node", "-e", _NODE_WORKER]
            done = subprocess.run(node, capture_output=True, text=True, timeout=60, check=False)
            return done.stdout.strip() or f"exit {done.returncode}: {done.stderr[-300:]}"
        elif op == "caps":
            return _caps_after_exec()
        elif op == "loopback":
            return _loopback(confine)
        else:
            return f"unknown op {op}"
    except OSError as exc:
        return _errno_name(exc.errno or 0)
    return "ok"


def main() -> None:
    job = json.load(sys.stdin)
    spec = importlib.util.spec_from_file_location("confine_under_test", job["module"])
    assert spec is not None and spec.loader is not None
    confine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(confine)
    prepared = confine.prepare(job["policy"]) if job["policy"] is not None else None
    if job.get("uid") is not None:
        os.setgroups([])
        os.setgid(job["uid"])
        os.setuid(job["uid"])
    if prepared is not None:
        confine.apply(prepared)
    results = {key: run(op, args, confine) for key, op, *args in job["ops"]}
    sys.stdout.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
