"""``gym-harness`` on a real terminal (a pseudo-terminal): turns stream, and Ctrl-C.

Each test starts the command with ``pty.fork()``, so its stdout is a terminal and ^C typed
on the terminal is a real SIGINT from the line discipline, as when a user presses Ctrl-C.
Every read waits for a given text with a bounded deadline; nothing is timed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest
from support import LINE_AGENT
from support.signals import default_sigint, ignores_sigint

#: A line-protocol harness whose turn makes a tool call, then waits for a file to appear.
GATED_AGENT = """
import json, os, sys, time
release = sys.argv[1]
def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\\n")
    sys.stdout.flush()
emit({"type": "ready"})
for line in sys.stdin:
    emit({"type": "tool_call", "name": "probe", "arguments": {"n": 1}})
    emit({"type": "tool_result", "name": "probe", "content": "probed", "is_error": False})
    deadline = time.monotonic() + 60
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.02)
    emit({"type": "turn_complete", "response": "released", "done": True})
"""


#: Each test takes seconds; the bounds leave room for a machine shared with other runs.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


class Terminal:
    """A command on a pseudo-terminal: read what it shows, type to it, wait for it."""

    def __init__(self, argv: Sequence[str], cwd: Path, columns: int = 80) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: the terminal is its stdin, stdout, stderr and controlling tty
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
                default_sigint()  # Ctrl-C interrupts it even if this run ignores SIGINT
                os.chdir(cwd)
                os.execv(argv[0], list(argv))
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.seen = ""
        self.status: int | None = None

    def read_until(self, pattern: str, timeout: float = 180.0) -> str:
        """Everything shown until ``pattern`` (a regex) appears; fails at EOF or the deadline."""
        deadline = time.monotonic() + timeout
        start = len(self.seen)
        while not re.search(pattern, self.seen[start:]):
            left = deadline - time.monotonic()
            assert left > 0, f"{pattern!r} not shown within {timeout} s:\n{self.seen}"
            ready, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: the command exited and closed the terminal
                chunk = b""
            assert chunk, f"the command ended before showing {pattern!r}:\n{self.seen}"
            self.seen += chunk.decode("utf-8", "replace")
        return self.seen[start:]

    def type(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait(self, timeout: float = 180.0) -> int:
        """The command's exit status (``-N`` for signal N), reading its output meanwhile."""
        deadline = time.monotonic() + timeout
        while self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                break
            assert time.monotonic() < deadline, f"still running after {timeout} s:\n{self.seen}"
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                with contextlib.suppress(OSError):  # EIO once the command has exited
                    self.seen += os.read(self.fd, 65536).decode("utf-8", "replace")
        return self.status

    def interrupt(self, said: str, *, once: str | None = None) -> str:
        """Type Ctrl-C (once ``once`` is shown, if given); return what is shown up to
        ``said``, after the command has exited with 130. Closes the terminal."""
        try:
            if once is not None:
                self.read_until(once)
            assert not ignores_sigint(self.pid)
            self.type(b"\x03")  # Ctrl-C, through the terminal's line discipline
            text = self.read_until(said)
            assert self.wait() == 130
        finally:
            self.close()
        return text

    def close(self) -> None:
        if self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.wait(10)
        os.close(self.fd)


def gym_harness(*args: str) -> list[str]:
    return [sys.executable, "-m", "gym_harness", *args]


def screen(shown: str) -> list[str]:
    """The lines a terminal shows for ``shown``: ``\\r`` returns, ``ESC[K`` clears to the end."""
    lines: list[str] = []
    line: list[str] = []
    column = 0
    for part in re.split(r"(\x1b\[K|\r|\n)", shown):
        if part == "\x1b[K":
            del line[column:]
        elif part == "\r":
            column = 0
        elif part == "\n":
            lines.append("".join(line))
            line, column = [], 0
        else:
            line[column : column + len(part)] = part
            column += len(part)
    return [*lines, "".join(line)]


def test_run_streams_each_turn_as_it_happens_with_a_status_line(tmp_path: Path) -> None:
    agent = tmp_path / "gated_agent.py"
    agent.write_text(GATED_AGENT)
    release = tmp_path / "release"
    command = json.dumps([sys.executable, str(agent), str(release)])
    argv = gym_harness("run", "--env", "gym_harness/Command-v0", "--set", f"command={command}")
    term = Terminal([*argv, "--message", "go"], tmp_path)
    try:
        shown = term.read_until(r"tool result probe: probed")
        # The tool call is on the screen while the turn still runs: no reply yet.
        assert "user: go" in shown and "harness:" not in shown
        assert shown.index("user: go") < shown.index("tool call probe {'n': 1}")
        # On a terminal the status line says what runs, and for how long.
        term.read_until(r"turn 1 running, \d+\.\d s")
        release.touch()
        rest = term.read_until(r"outcome: done")
        assert term.wait() == 0
    finally:
        term.close()
    assert "harness: released" in rest
    # The status line was erased before the reply: the reply starts a clean line.
    assert re.search(r"\x1b\[Kharness: released", term.seen)


def test_ctrl_c_mid_turn_says_what_it_interrupted_and_how_to_start_again(tmp_path: Path) -> None:
    command = json.dumps([sys.executable, str(LINE_AGENT)])
    args = ["run", "--env", "gym_harness/Command-v0", "--set", f"command={command}"]
    term = Terminal(gym_harness(*args, "--message", "hi", "--message", "stall"), tmp_path)
    try:
        term.read_until(r"harness: echo: hi")
        term.read_until(r"turn 2 running, \d+\.\d s")  # the harness is silent now
        harnesses = [
            p.pid
            for p in psutil.Process(term.pid).children(recursive=True)
            if str(LINE_AGENT) in " ".join(p.cmdline())
        ]
    except BaseException:
        term.close()
        raise
    said = term.interrupt(r"to start it again: gym-harness run .*\n")
    assert re.search(r"gym-harness: interrupted \(Ctrl-C\) in turn 2, \d+\.\d s in;", said)
    assert "the harness was stopped and its workspace removed (1 turn finished" in said
    assert f"gym-harness run --env gym_harness/Command-v0 --set 'command={command}'" in said
    assert "Traceback" not in term.seen
    assert harnesses and not [pid for pid in harnesses if psutil.pid_exists(pid)]


def test_ctrl_c_while_the_harness_starts_says_so(tmp_path: Path) -> None:
    command = json.dumps([sys.executable, str(LINE_AGENT), "never_ready"])
    argv = gym_harness("run", "--env", "gym_harness/Command-v0", "--set", f"command={command}")
    said = Terminal(argv, tmp_path).interrupt(
        r"to start it again: .*\n", once=r"starting the harness, \d+\.\d s"
    )
    assert "interrupted (Ctrl-C) while the harness started, " in said
    assert "workspace removed, before any turn finished." in " ".join(said.split())
    assert "shown above" not in said


def test_ctrl_c_mid_rollout_says_what_was_kept(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "fast", "prompt": "/done one"}\n{"id": "slow", "prompt": "stall"}\n')
    command = json.dumps([sys.executable, str(LINE_AGENT)])
    args = ["rollout", str(tasks), "--env", "gym_harness/Command-v0", "--set", f"command={command}"]
    term = Terminal(gym_harness(*args, "--out", str(tmp_path / "out.jsonl")), tmp_path)
    said = term.interrupt(r"--resume", once=r"1/2")
    partial = tmp_path / "out.jsonl.partial"
    words = " ".join(said.split())
    assert "interrupted (Ctrl-C) with 1 of 2 records written;" in words
    assert f"1 whole record kept in {partial}" in words
    assert not (tmp_path / "out.jsonl").exists()
    assert [json.loads(line)["task_id"] for line in partial.read_text().splitlines()] == ["fast"]


@pytest.mark.parametrize("columns", [80, 160, 40])
def test_rollout_shows_the_start_up_status_then_a_bar_that_leaves_no_residue(
    tmp_path: Path, columns: int
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(f'{{"id": "t{i}", "prompt": "/done {i}"}}\n' for i in range(3)))
    command = json.dumps([sys.executable, str(LINE_AGENT)])
    args = ["rollout", str(tasks), "--env", "gym_harness/Command-v0", "--set", f"command={command}"]
    term = Terminal(gym_harness(*args, "--out", str(tmp_path / "out.jsonl")), tmp_path, columns)
    try:
        assert term.wait() == 0
    finally:
        term.close()
    assert re.search(r"starting the harness, \d+\.\d s", term.seen), term.seen
    lines = [line for line in screen(term.seen) if line]
    # The status and every bar were drawn over: the last bar is all that is left of them.
    assert re.fullmatch(r"\[#+\] 3/3 \d+\.\d\d ep/s \(max_turns\)", lines[0]), lines
    assert lines[1:] == [f"wrote 3 episodes to {tmp_path / 'out.jsonl'}"], lines
    # No status or bar reaches the last column (where a terminal may wrap).
    drawn = re.split(r"\r|\n|\x1b\[K", term.seen)
    assert max(len(d) for d in drawn if "ep/s" in d or "starting" in d) < columns
