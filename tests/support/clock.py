"""A monotonic clock the test moves forward: a timeout rule proved without waiting.

``time.monotonic`` is what every deadline of the package reads (the turn runner's turn
and idle limits, the endpoint's policy timeout). ``advance(s)`` makes it read ``s``
seconds later in every thread of the test process at once, as if they had slept ``s``
seconds; deadlines computed before then are that much nearer, as after a real sleep. The
harness subprocesses keep the real clock: a rule about what a harness does with time
(its own HTTP timeout) still needs its own check.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

__all__ = ["Clock", "clock"]


class Clock:
    """``time.monotonic`` plus an offset that only grows; safe to read from any thread."""

    def __init__(self) -> None:
        self._real = time.monotonic
        self._offset = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self._real() + self._offset

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward, for every reader at once."""
        if seconds < 0:
            raise ValueError(f"a monotonic clock only moves forward, not by {seconds} s")
        with self._lock:
            self._offset += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    """``time.monotonic`` replaced by a :class:`Clock` for the test (restored after it)."""
    fake = Clock()
    monkeypatch.setattr(time, "monotonic", fake)
    yield fake
