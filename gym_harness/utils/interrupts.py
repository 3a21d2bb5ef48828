"""Holding Ctrl-C over a block that must run whole (a spawn, a stop, a close).

A ``KeyboardInterrupt`` can land between any two bytecodes. Where that would leave a
keeper busy, a harness running or a workspace behind (half a stop, a spawn whose keeper
is not yet recorded), the block runs under :func:`interrupts_held`: SIGINT is noted, the
block finishes, and the interrupt is raised as it ends. Every such block is bounded (a
stop takes ``stop_grace_s`` and a few seconds at most), so Ctrl-C is late, never lost.

Only the main thread receives signals; elsewhere the block runs as it is.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["interrupts_held"]


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Run the block whole: a SIGINT that arrives meanwhile is raised once it ends.

    The previous handler is restored and called with the held signal, so the user's
    own handler (Jupyter's, or Python's default that raises ``KeyboardInterrupt``)
    decides what the interrupt does. Nested blocks hold for the outermost one.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # ignored, or the OS default: nothing to hold
        yield
        return
    held: list[tuple[int, FrameType | None]] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if not held:
            held.append((signum, frame))

    try:
        signal.signal(signal.SIGINT, hold)  # in the try: the old handler always comes back
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            previous(*held[0])
