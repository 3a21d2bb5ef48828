"""A fake harness for the process and containment tests; the first argument picks its behaviour.

echo          print {"type":"ready"}, then echo each stdin line; "err:X" goes to stderr as X
never_ready   print chatter but never the ready line
exit_early    write a message to stderr and exit 3 during startup
crash         ready; on the first line print part of a reply and exit 3
ignore_term   ready, ignore SIGTERM, echo
family        ready; fork a child, a setsid grandchild and a double-forked daemon; print
              {"pids": [harness, child, grandchild, daemon]} (in that order)
flood         ready; on a line, write 50 MB to stdout and to stderr at once, then "done"
bad_utf8      ready; invalid UTF-8 lines on stdout and stderr, then "after"
long_line     ready; one 20 MB line, then "after"
close_stdout  ready; on a line, close stdout and keep running
env           ready; print {"env": environment, "cwd": working directory}

Hostile modes take a second argument, PIDFILE: every process of the tree appends its
pid to it, and the harness prints {"type":"ready"} once the whole tree is in place.
All of them ignore SIGTERM.

env_cleared   a double-forked, setsid daemon that execs with an empty environment
disguised     a child in a new process group, and a grandchild in a new session
              with a changed name (comm) and argv, exec'd with an empty environment
keeper_killer a setsid grandchild, a double-forked daemon and 10 children; on its
              first stdin line it SIGKILLs its parent (the keeper)
fork_storm    a setsid child that forks a new child every 10 ms for 2 s
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

MB = 1024 * 1024
out = sys.stdout.buffer


def say(data: bytes) -> None:
    out.write(data + b"\n")
    out.flush()


def ready() -> None:
    say(b'{"type":"ready"}')


def linger() -> None:
    time.sleep(120)  # bounded: the tests stop us long before this
    os._exit(0)


def echo() -> None:
    for line in sys.stdin:
        if line.startswith("err:"):
            sys.stderr.write(line[4:])
            sys.stderr.flush()
        else:
            out.write(line.encode())
            out.flush()


def family() -> None:
    # Each member reports "role pid" on one pipe; they arrive in whatever order the
    # scheduler runs them, so the pids are put in family order by role, not by arrival.
    roles = ("child", "grandchild", "daemon")
    read_end, write_end = os.pipe()

    def report(role: str) -> None:
        os.write(write_end, f"{role} {os.getpid()}\n".encode())

    if os.fork() == 0:  # child, same process group
        if os.fork() == 0:  # grandchild in its own session
            os.setsid()
            report("grandchild")
            linger()
        if os.fork() == 0:  # double fork: the daemon is re-parented (to the keeper)
            os.setsid()
            if os.fork() == 0:
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                report("daemon")
                linger()
            os._exit(0)
        report("child")
        linger()
    with os.fdopen(read_end) as reader:
        found = dict(reader.readline().split() for _ in roles)
    ready()
    say(json.dumps({"pids": [os.getpid(), *(int(found[role]) for role in roles)]}).encode())
    linger()


#: The program of a hostile exec'd process: PIDFILE [NAME]; ignores SIGTERM, renames itself.
SLEEPER = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if len(sys.argv) > 2:
    with open("/proc/self/comm", "w") as f:
        f.write(sys.argv[2])
with open(sys.argv[1], "a") as f:
    f.write(f"{os.getpid()}\\n")
time.sleep(120)
"""


def record(pidfile: str) -> None:
    with open(pidfile, "a") as f:
        f.write(f"{os.getpid()}\n")


def await_records(pidfile: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(pidfile) as f:
            if len(f.read().split()) >= count:
                return
        time.sleep(0.01)
    sys.exit("the hostile tree did not come up")


def daemonize() -> bool:
    """Double fork; True in the daemon (its parent is gone), False in the caller."""
    if os.fork() != 0:
        return False
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    return True


def exec_sleeper(pidfile: str, *name: str, argv0: str = sys.executable) -> None:
    os.execve(sys.executable, [argv0, "-c", SLEEPER, pidfile, *name], {})


def hostile(mode: str, pidfile: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited, and kept across exec
    record(pidfile)
    count = 1
    if mode == "env_cleared":
        if daemonize():
            exec_sleeper(pidfile)
        count = 2
    elif mode == "disguised":
        if os.fork() == 0:
            os.setpgid(0, 0)
            with open("/proc/self/comm", "w") as f:
                f.write("sshd")
            record(pidfile)
            if os.fork() == 0:
                os.setsid()
                exec_sleeper(pidfile, "kworker/0:1", argv0="[kworker/0:1]")
            linger()
        count = 3
    elif mode == "keeper_killer":
        if os.fork() == 0:
            os.setsid()
            record(pidfile)
            linger()
        if daemonize():
            record(pidfile)
            linger()
        for _ in range(10):
            if os.fork() == 0:
                record(pidfile)
                linger()
        count = 13
    elif mode == "fork_storm":
        if os.fork() == 0:
            os.setsid()
            record(pidfile)
            end = time.monotonic() + 2
            while time.monotonic() < end:
                if os.fork() == 0:
                    record(pidfile)
                    linger()
                time.sleep(0.01)
            linger()
        count = 10
    await_records(pidfile, count)
    ready()
    if mode == "keeper_killer":
        sys.stdin.readline()
        os.kill(os.getppid(), signal.SIGKILL)
    echo()
    linger()


def flood() -> None:
    sys.stdin.readline()
    chunk = b"x" * 1023 + b"\n"
    err = threading.Thread(target=lambda: [os.write(2, chunk * 64) for _ in range(50 * 16)])
    err.start()
    for _ in range(50 * MB // len(chunk)):
        out.write(chunk)
    out.flush()
    err.join()
    say(b"done")
    echo()


def main() -> None:
    mode = sys.argv[1]
    if mode == "never_ready":
        say(b"starting...")
        linger()
    if mode == "exit_early":
        sys.stderr.write("fatal: ANTHROPIC_API_KEY is not set\n")
        sys.exit(3)
    if mode == "family":
        family()
    if mode in ("env_cleared", "disguised", "keeper_killer", "fork_storm"):
        hostile(mode, sys.argv[2])
    if mode == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready()
    if mode == "crash":
        sys.stdin.readline()
        say(b'{"type":"text","text":"half a rep')
        os._exit(3)
    elif mode == "flood":
        flood()
    elif mode == "bad_utf8":
        say(b"bad \xff\xfe here \xc3(")
        os.write(2, b"err \xff\xfe\n")
        say(b"after")
        echo()
    elif mode == "long_line":
        for _ in range(20):
            out.write(b"y" * MB)
        say(b"")
        say(b"after")
        echo()
    elif mode == "close_stdout":
        sys.stdin.readline()
        os.close(1)
        linger()
    elif mode == "env":
        say(json.dumps({"env": dict(os.environ), "cwd": os.getcwd()}).encode())
        echo()
    else:
        echo()


if __name__ == "__main__":
    main()
