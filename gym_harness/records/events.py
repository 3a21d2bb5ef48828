"""What a harness does during a turn, as plain values.

Adapters turn each harness's output into ``HarnessEvent``s; a turn's outcome is
a ``TurnResult``. Both are frozen dataclasses with ``to_dict`` / ``from_dict``
so they can be written as JSON lines and read back unchanged.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["EventType", "HarnessEvent", "TurnResult"]


class EventType(enum.StrEnum):
    """The kinds of event a turn can contain; ``OTHER`` keeps unknown ones."""

    TEXT = "text"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    LLM_REQUEST = "llm_request"
    LLM_RESPONSE = "llm_response"
    LLM_USAGE = "llm_usage"
    ERROR = "error"
    TURN_COMPLETE = "turn_complete"
    OTHER = "other"

    @classmethod
    def parse(cls, value: str) -> EventType:
        """Return the member named ``value``, or ``OTHER`` for an unknown name."""
        return _BY_VALUE.get(value, cls.OTHER)


_BY_VALUE: dict[str, EventType] = {member.value: member for member in EventType}


@dataclass(frozen=True)
class HarnessEvent:
    """One thing the harness did.

    Args:
        type: The kind of event.
        data: The event's JSON-ready payload (for ``OTHER``, the original object).
        timestamp: Wall-clock seconds since the epoch when it was seen.
    """

    type: EventType
    data: Mapping[str, Any] = field(default_factory=dict)
    timestamp: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"type", "timestamp", "data"}`` ready for ``json.dumps``."""
        # _value_, not .value: the enum property costs microseconds on this hot path.
        return {"type": self.type._value_, "timestamp": self.timestamp, "data": dict(self.data)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HarnessEvent:
        """Inverse of ``to_dict``; an unknown type becomes ``OTHER``."""
        return cls(
            type=EventType.parse(str(data["type"])),
            data=dict(data.get("data", {})),
            timestamp=float(data.get("timestamp", 0.0)),
        )


@dataclass(frozen=True)
class TurnResult:
    """The outcome of one turn.

    Args:
        response: The harness's reply text for the turn.
        events: Every event of the turn, in order.
        done: The harness said the task is finished.
        error_type: ``""`` for a clean turn, else one of the outcome names
            (``harness_crashed``, ``protocol_error``, ``turn_timeout`` ...).
        error: A human-readable account of the error (``""`` for none).
    """

    response: str = ""
    events: tuple[HarnessEvent, ...] = ()
    done: bool = False
    error_type: str = ""
    error: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", tuple(self.events))

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "response": self.response,
            "events": [event.to_dict() for event in self.events],
            "done": self.done,
            "error_type": self.error_type,
            "error": self.error,
        }

    def with_events(self, extra: Iterable[HarnessEvent]) -> TurnResult:
        """This result with ``extra`` merged into its events in time order."""
        extra = tuple(extra)
        if not extra:
            return self
        events = sorted((*self.events, *extra), key=lambda e: e.timestamp)
        return replace(self, events=tuple(events))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TurnResult:
        """Inverse of ``to_dict``."""
        return cls(
            response=str(data.get("response", "")),
            events=tuple(HarnessEvent.from_dict(e) for e in data.get("events", ())),
            done=bool(data.get("done", False)),
            error_type=str(data.get("error_type", "")),
            error=str(data.get("error", "")),
        )
