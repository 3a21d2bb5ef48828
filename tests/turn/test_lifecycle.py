"""One Lifecycle enum and one Liveness protocol, read by the turn runner's idle deadline."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest
from support.process import is_ready, spec

from gym_harness import Lifecycle, Liveness, TurnLimits
from gym_harness.bridge.server import MCPBridge
from gym_harness.capture.proxy import ModelProxy
from gym_harness.harnesses.base import Feed, HarnessSession
from gym_harness.outcome import Outcome
from gym_harness.process.harness_process import HarnessProcess
from gym_harness.readiness import start_ready
from gym_harness.turn import TurnRunner


def echo(text: str) -> str:
    """Echo ``text``."""
    return text


def test_the_process_bridge_and_proxy_are_liveness_sources() -> None:
    proc = HarnessProcess(spec("echo"))
    bridge = MCPBridge([echo])
    proxy = ModelProxy("http://127.0.0.1:9")
    for source in (proc, bridge, proxy):
        assert isinstance(source, Liveness)
        assert isinstance(source.last_activity, float) and source.busy is False
    assert bridge.state is Lifecycle.NEW and proxy.state is Lifecycle.NEW


def test_each_part_ends_stopped_and_says_so() -> None:
    proc = HarnessProcess(spec("echo"))
    start_ready(proc, is_ready)
    assert "running" in repr(proc)
    proc.stop()
    assert "stopped" in repr(proc)
    with MCPBridge([echo]) as bridge:
        assert bridge.state is Lifecycle.RUNNING
    assert bridge.state is Lifecycle.STOPPED
    with ModelProxy("http://127.0.0.1:9") as proxy:
        assert proxy.state is Lifecycle.RUNNING
    assert proxy.state is Lifecycle.STOPPED


class _Silent(HarnessSession):
    """Sends each message as a line and never ends a turn: only a deadline does."""

    def message_lines(self, text: str) -> list[str]:
        return [text]

    def feed(self, line: str) -> Feed:
        return Feed()


@dataclass
class _Source:
    """A sign-of-life source of the caller's own (any object with the two attributes)."""

    busy: bool
    last_activity: float = field(default_factory=time.monotonic)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("busy", "outcome"), [(False, Outcome.IDLE_TIMEOUT), (True, Outcome.TURN_TIMEOUT)]
)
def test_a_busy_source_holds_the_idle_deadline(busy: bool, outcome: Outcome) -> None:
    limits = TurnLimits(turn_timeout_s=3.0, idle_timeout_s=0.3, interrupt_grace_s=0.1)
    with HarnessProcess(spec("echo")) as proc:
        start_ready(proc, is_ready)
        runner = TurnRunner(_Silent(), proc, limits, None, lambda event: None, [_Source(busy)])
        result = runner.run("hello")
    assert result.error_type is outcome
    assert [e.data["error_type"] for e in result.events if e.data.get("error_type")] == [
        outcome.value
    ]
