"""What the command prints while it runs: ``run``'s turns as they happen, ``rollout``'s progress.

The episode's header once the harness is up; then, per turn, the user message before the
turn starts, each tool call and tool result the moment the harness makes it (the env's
``on_event``), and the reply with the turn's time and reward when it ends. On a terminal a
status line under the last line shows what runs and for how long (``⠙ turn 2 running,
12.3 s``), so a slow harness is never silent; elsewhere (a pipe, a log file) only the
lines are written, each flushed. ``Progress`` is the rollout's bar, after the same
start-up status as ``run``'s (a line per episode off a terminal, with no control
characters). A line drawn over another clears it first and is cut to the terminal's
width, so nothing of a longer line is left and nothing wraps.

Threads: the caller's thread writes every line (``on_event`` runs in it, inside
``step``). A status thread, only on a terminal, redraws the status line every
``STATUS_INTERVAL_S`` while something runs; one lock orders the two writers, and
``close()`` stops the thread within a bounded join.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TextIO

from gym_harness.records.events import HarnessEvent
from gym_harness.records.trajectory import Trajectory, TurnRecord, event_line

__all__ = ["STATUS_INTERVAL_S", "Console", "Progress"]

#: How often the status line is redrawn on a terminal.
STATUS_INTERVAL_S = 0.1
_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_CLEAR_LINE = "\r\x1b[K"


def _labelled(label: str, text: str) -> str:
    """``label`` then ``text``, its continuation lines indented under its first:
    a prompt's second line never reads as a line of output of its own."""
    return label + text.replace("\n", "\n" + " " * len(label))


def _columns(stream: TextIO) -> int:
    """The width of the terminal ``stream`` writes to (80 when it has none)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (OSError, ValueError):  # no file descriptor, or not a terminal
        return 80


class Console:
    """Streams an episode to ``out``; a status line while something runs, on a terminal.

    Args:
        out: Where the lines go (the command's stdout).
        status: Draw the status line; ``None`` draws it when ``out`` is a terminal.

    Example:
        >>> import io
        >>> console = Console(io.StringIO())
        >>> console.busy("turn 1 running", "in turn 1")
        >>> console.line("user: hi")
        >>> console.close()
    """

    def __init__(self, out: TextIO, *, status: bool | None = None) -> None:
        self.out = out
        self.status = out.isatty() if status is None else status
        self._lock = threading.Lock()
        self._label = ""  # what runs now; "" when nothing does
        self._where = ""
        self._since = 0.0
        self._drawn = False  # a status line is on the screen
        self._frame = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- the episode

    def header(self, trajectory: Trajectory, *, with_task: bool = True) -> None:
        """The episode's first line: its id, harness and task id (``with_task=False``: none).

        The task's prompt is not repeated here: it is the first turn's user message.
        """
        line = f"episode {trajectory.episode_id} ({trajectory.harness})"
        if with_task and trajectory.task is not None:
            line += f", task {trajectory.task.get('id')}"
        self.line(line)

    def turn_start(self, turn: int, message: str) -> None:
        """A turn begins: its number and the user message, then the status line."""
        self.line(f"--- turn {turn}")
        self.line(_labelled("user: ", message))
        self.busy(f"turn {turn} running", f"in turn {turn}")

    def event(self, event: HarnessEvent) -> None:
        """The env's ``on_event``: a tool call or tool result gets its line at once."""
        text = event_line(event)
        if text is not None:
            self.line(text)

    def turn_end(self, record: TurnRecord) -> None:
        """A turn ended: the reply, its error if any, then its time and reward."""
        self.idle()
        self.line(_labelled("harness: ", record.response or "(an empty reply)"))
        if record.error_type:
            self.line(f"[{record.error_type}] {record.error}")
        self.line(f"(turn {record.turn}: {record.elapsed_s:.3f}s, reward {record.reward:g})")

    # ---------------------------------------------------------------- the screen

    def line(self, text: str) -> None:
        """Write ``text`` as one line (above the status line, which is redrawn)."""
        with self._lock:
            self._erase()
            self.out.write(text + "\n")
            self._draw()
            self.out.flush()

    def busy(self, label: str, where: str) -> None:
        """Show ``label`` and the time since now on the status line, until ``idle()``.

        Args:
            label: What runs, for the status line (``"turn 2 running"``).
            where: The same, for a sentence (``"in turn 2"``); ``idle()`` returns it.
        """
        with self._lock:
            self._label, self._where, self._since = label, where, time.monotonic()
            self._draw()
            self.out.flush()
        if self.status and self._thread is None:
            thread = threading.Thread(target=self._redraw, name="gym-harness-status", daemon=True)
            thread.start()
            self._thread = thread  # once started: close() joins only a started thread

    def idle(self) -> str:
        """Remove the status line; return where it was and for how long (``""`` if none):
        ``"in turn 2, 3.1 s in"``."""
        with self._lock:
            shown = ""
            if self._label:
                shown = f"{self._where}, {time.monotonic() - self._since:.1f} s in"
            self._label = ""
            self._erase()
            self.out.flush()
        return shown

    def close(self) -> None:
        """Remove the status line and stop its thread (bounded). Idempotent.

        A thread whose ``start()`` was interrupted (Ctrl-C) is not joined: it sees the stop
        at its next tick and ends by itself.
        """
        self._stop.set()
        self.idle()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _redraw(self) -> None:
        while not self._stop.wait(STATUS_INTERVAL_S):
            with self._lock:
                if self._label:
                    self._frame += 1
                    self._draw()
                    self.out.flush()

    def _draw(self) -> None:
        """Draw the status line (under the lock)."""
        if not (self.status and self._label):
            return
        spinner = _SPINNER[self._frame % len(_SPINNER)]
        elapsed = time.monotonic() - self._since
        status = f"{spinner} {self._label}, {elapsed:.1f} s"
        self.out.write(_CLEAR_LINE + status[: _columns(self.out) - 1])
        self._drawn = True

    def _erase(self) -> None:
        """Erase the status line if one is drawn (under the lock)."""
        if self._drawn:
            self.out.write(_CLEAR_LINE)
            self._drawn = False


class Progress:
    """``gym-harness rollout``'s progress: one bar on a terminal, a line per episode elsewhere.

    Until the first episode ends, a terminal shows ``run``'s start-up status
    (``⠙ starting the harness, 2.1 s``).

    Args:
        total: How many episodes the rollout runs.
        stream: Where it goes (the command's stderr).
    """

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total, self.stream = total, stream
        self.started = time.monotonic()
        self.tty = stream.isatty()
        self.closed = False
        self._drawn = False  # a bar is on the terminal's last line
        self._startup: Console | None = Console(stream, status=self.tty)
        self._startup.busy("starting the harness", "while the harness started")

    def update(self, done: int, outcome: str) -> None:
        """``done`` episodes are written; the last one ended as ``outcome``."""
        self._end_startup()
        rate = done / max(time.monotonic() - self.started, 1e-9)
        tail = f" {done}/{self.total} {rate:.2f} ep/s ({outcome})"
        if not self.tty:
            self.stream.write(f"[{'#' * (30 * done // self.total):.<30}]{tail}\n")
            self.stream.flush()
            return
        columns = _columns(self.stream) - 1  # the last column would wrap on some terminals
        width = max(min(30, columns - len(tail) - 2), 5)
        filled = width * done // self.total
        line = f"[{'#' * filled}{'.' * (width - filled)}]{tail}"
        self.stream.write(_CLEAR_LINE + line[:columns])
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """End the bar's line on a terminal (or the start-up status). Idempotent."""
        self._end_startup()
        if self._drawn and not self.closed:
            self.stream.write("\n")
            self.stream.flush()
        self.closed = True

    def _end_startup(self) -> None:
        if self._startup is not None:
            self._startup.close()
            self._startup = None
