"""The one bridge fixture of the tests: a started :class:`MCPBridge`, stopped after the test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gym_harness.bridge.server import MCPBridge
from support import sample_tools

__all__ = ["bridge", "bridge_args"]


@pytest.fixture
def bridge_args() -> tuple[Any, dict[str, Any]]:
    """The ``bridge`` fixture's ``MCPBridge`` arguments, ``(tools, options)``; a test
    module overrides it."""
    return [sample_tools.add], {}


@pytest.fixture
def bridge(bridge_args: tuple[Any, dict[str, Any]]) -> Iterator[MCPBridge]:
    """A started bridge serving ``bridge_args``; stopped after the test."""
    tools, options = bridge_args
    with MCPBridge(tools, **options) as served:
        yield served
