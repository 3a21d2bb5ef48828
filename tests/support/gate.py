"""A tool body that blocks until the test releases it, and its fixture."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

__all__ = ["Gate", "gate"]


class Gate:
    """A tool body that blocks until the test releases it (bounded either way)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def hang(self) -> str:
        """Wait for the gate."""
        self.event.wait(30)
        return "released"


@pytest.fixture
def gate() -> Iterator[Gate]:
    """A gate, released at teardown so no tool thread outlives the test."""
    g = Gate()
    yield g
    g.event.set()
