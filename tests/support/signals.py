"""Ctrl-C in the processes the tests start, however the test run itself was started.

A process started with SIGINT ignored (``nohup``, ``cmd &`` in a non-interactive shell,
some CI runners) passes the ignored disposition on through fork and exec, and Python keeps
it: ``KeyboardInterrupt`` never comes. A test that sends SIGINT to a process it starts
restores the default in that process first (``default_sigint`` as ``preexec_fn``, or
called in a forked child before exec) and asserts it took (``ignores_sigint``).
"""

from __future__ import annotations

import signal
from pathlib import Path

__all__ = ["default_sigint", "ignores_sigint"]


def default_sigint() -> None:
    """Restore SIGINT's default disposition in this process (run in the child before exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ignores_sigint(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGINT (its ``SigIgn`` mask in ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGINT - 1) & 1)
    raise AssertionError(f"/proc/{pid}/status has no SigIgn line")
