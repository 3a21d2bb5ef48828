"""The fault boundary's mapping table (``gym_harness/turn.py``), rule by rule.

Each kind of fault is raised inside a call site of a real ``TurnRunner`` over a real
fake-harness process: first at the boundary itself (``TurnRunner._faults``), then from
the adapter during ``run()``, which must return the outcome, never raise, and give the
flags of the outcome table (DESIGN.md, the README's "Outcomes").
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.process import is_ready, spec

from gym_harness import TurnLimits
from gym_harness.errors import (
    BridgeError,
    ConfigError,
    HarnessCrashed,
    ProtocolError,
    TurnTimeout,
)
from gym_harness.harnesses.base import Feed, HarnessSession
from gym_harness.outcome import Outcome
from gym_harness.process.harness_process import HarnessProcess
from gym_harness.readiness import start_ready
from gym_harness.records.events import TurnResult
from gym_harness.turn import TurnEnded, TurnRunner, end_flags

LIMITS = TurnLimits(turn_timeout_s=30.0, idle_timeout_s=30.0, interrupt_grace_s=0.1)

#: (what the call raised, the call site's own outcome, the outcome the boundary gives).
TABLE = [
    (HarnessCrashed("gone"), Outcome.PROTOCOL_ERROR, Outcome.HARNESS_CRASHED),
    (BrokenPipeError(32, "Broken pipe"), Outcome.PROTOCOL_ERROR, Outcome.HARNESS_CRASHED),
    (OSError(5, "I/O error"), Outcome.BRIDGE_FAILED, Outcome.HARNESS_CRASHED),
    (TurnTimeout("stdin unread"), Outcome.HARNESS_CRASHED, Outcome.TURN_TIMEOUT),
    (ProtocolError("bad line"), Outcome.HARNESS_CRASHED, Outcome.PROTOCOL_ERROR),
    (BridgeError("bridge died"), Outcome.PROTOCOL_ERROR, Outcome.BRIDGE_FAILED),
    # Any other exception: the call site's own outcome.
    (ValueError("adapter bug"), Outcome.PROTOCOL_ERROR, Outcome.PROTOCOL_ERROR),
    (KeyError("field"), Outcome.HARNESS_CRASHED, Outcome.HARNESS_CRASHED),
    (ConfigError("not a fault rule"), Outcome.BRIDGE_FAILED, Outcome.BRIDGE_FAILED),
]


def _id(row: tuple[Exception, Outcome, Outcome]) -> str:
    exc, other, _ = row
    return f"{type(exc).__name__}-at-{other.value}"


class _Raising(HarnessSession):
    """Sends each message as a line, unless ``fault`` is set: then raises it instead."""

    def __init__(self, fault: BaseException | None = None) -> None:
        self.fault = fault

    def message_lines(self, text: str) -> list[str]:
        if self.fault is not None:
            raise self.fault
        return [text]

    def feed(self, line: str) -> Feed:
        return Feed(turn_complete=True, response=line)


@pytest.fixture
def proc() -> Iterator[HarnessProcess]:
    """A started, ready fake harness (``echo``), stopped after the test."""
    with HarnessProcess(spec("echo")) as started:
        start_ready(started, is_ready)
        yield started


def _runner(proc: HarnessProcess, fault: BaseException | None = None) -> TurnRunner:
    return TurnRunner(_Raising(fault), proc, LIMITS, None, lambda event: None)


@pytest.mark.parametrize(("exc", "other", "outcome"), TABLE, ids=[_id(r) for r in TABLE])
def test_the_boundary_maps_each_fault_to_its_outcome(
    proc: HarnessProcess, exc: Exception, other: Outcome, outcome: Outcome
) -> None:
    runner = _runner(proc)
    with pytest.raises(TurnEnded) as ended, runner._faults(other, "the test's call"):
        raise exc
    assert ended.value.outcome is outcome
    assert ended.value.__cause__ is exc
    assert ended.value.message


def test_messages_say_which_call_and_which_limit(proc: HarnessProcess) -> None:
    runner = _runner(proc)
    messages = {}
    for exc in (ValueError("adapter bug"), TurnTimeout("stdin unread"), HarnessCrashed("x")):
        with pytest.raises(TurnEnded) as ended, runner._faults(Outcome.PROTOCOL_ERROR, "the call"):
            raise exc
        messages[type(exc)] = ended.value.message
    assert messages[ValueError] == "the call raised ValueError: adapter bug"
    assert "turn_timeout_s=30.0" in messages[TurnTimeout]
    assert messages[HarnessCrashed].startswith("the harness was gone while we were the call")


def test_an_outcome_the_turn_already_decided_passes_unchanged(proc: HarnessProcess) -> None:
    decided = TurnEnded(Outcome.IDLE_TIMEOUT, "decided inside")
    with pytest.raises(TurnEnded) as ended, _runner(proc)._faults(Outcome.PROTOCOL_ERROR, "x"):
        raise decided
    assert ended.value is decided


def test_a_base_exception_passes_through_the_boundary_and_run(proc: HarnessProcess) -> None:
    with pytest.raises(KeyboardInterrupt), _runner(proc)._faults(Outcome.PROTOCOL_ERROR, "x"):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        _runner(proc, KeyboardInterrupt()).run("hello")


#: A fault the adapter's message_lines() raises during run(): the turn's outcome and flags.
RUN_TABLE = [
    (HarnessCrashed("gone"), Outcome.HARNESS_CRASHED, (True, False)),
    (BrokenPipeError(32, "Broken pipe"), Outcome.HARNESS_CRASHED, (True, False)),
    (TurnTimeout("stdin unread"), Outcome.TURN_TIMEOUT, (False, True)),
    (ProtocolError("bad line"), Outcome.PROTOCOL_ERROR, (True, False)),
    (BridgeError("bridge died"), Outcome.BRIDGE_FAILED, (True, False)),
    (ValueError("adapter bug"), Outcome.PROTOCOL_ERROR, (True, False)),
]


@pytest.mark.parametrize(
    ("exc", "outcome", "flags"), RUN_TABLE, ids=[type(r[0]).__name__ for r in RUN_TABLE]
)
def test_run_returns_the_outcome_and_the_tables_flags(
    proc: HarnessProcess, exc: Exception, outcome: Outcome, flags: tuple[bool, bool]
) -> None:
    result = _runner(proc, exc).run("hello")
    assert isinstance(result, TurnResult)
    assert (result.error_type, end_flags(result)) == (outcome, flags), result.error


def test_a_clean_turn_after_the_table_still_runs(proc: HarnessProcess) -> None:
    """The boundary keeps nothing: the same process answers a clean turn."""
    result = _runner(proc).run("hello")
    assert (result.error_type, end_flags(result)) == (Outcome.OK, (False, False)), result.error
