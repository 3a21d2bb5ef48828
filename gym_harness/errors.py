"""The exceptions gym_harness raises.

Every exception takes one positional message and keyword-only extras with
defaults, so it survives pickling (gymnasium's ``AsyncVectorEnv`` re-raises a
worker's exception in the parent as ``type(exc)(value)``)::

    HarnessError
    ├── ConfigError            bad configuration; raised at construction
    ├── HarnessStartError      the harness did not start or become ready
    ├── HarnessCrashed         the harness exited while it was needed
    ├── TurnTimeout            a turn ran past its deadline
    ├── ProtocolError          output the harness's dialect cannot parse
    ├── BridgeError            the MCP bridge could not start, serve or stop
    ├── ToolConflictError      env tools clash (reserved, duplicate, unresolvable)
    ├── CaptureError           the model proxy could not start or forward
    ├── CallbackError          the user's on_event callback raised (the turn was kept)
    └── WorkerLost             a rollout worker died mid-episode (its record says so)

Harness faults inside ``reset``/``step`` become outcomes (``info["error_type"]``),
not exceptions; these classes carry the same facts where an exception is the
right answer (``HarnessProcess.start``, direct use of the building blocks).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BridgeError",
    "CallbackError",
    "CaptureError",
    "EndpointError",
    "ConfigError",
    "HarnessCrashed",
    "HarnessError",
    "HarnessStartError",
    "ProtocolError",
    "ToolConflictError",
    "TurnTimeout",
    "WorkerLost",
]


class HarnessError(Exception):
    """Root of every gym_harness exception.

    Args:
        message: What was expected, what happened, and what to do.
        exit_code: The harness's exit code, if it had one (``None`` otherwise).
        stderr_tail: The last lines the harness wrote to stderr.
        pid: The harness's process id, if it had started.
    """

    def __init__(
        self,
        message: str = "",
        *,
        exit_code: int | None = None,
        stderr_tail: str = "",
        pid: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail
        self.pid = pid

    def _extras(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, "stderr_tail": self.stderr_tail, "pid": self.pid}

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self._extras()))

    def __str__(self) -> str:
        if not self.stderr_tail:
            return self.message
        return f"{self.message}\n--- harness stderr (tail) ---\n{self.stderr_tail}"


def _rebuild(cls: type[HarnessError], message: str, extras: dict[str, Any]) -> HarnessError:
    return cls(message, **extras)


class ConfigError(HarnessError, ValueError):
    """A configuration value is invalid; the message names the field and the fix."""


class HarnessStartError(HarnessError):
    """The harness failed to start or to become ready in time."""


class HarnessCrashed(HarnessError):
    """The harness exited while a turn needed it."""


class TurnTimeout(HarnessError):
    """A turn ran past its deadline."""


class ProtocolError(HarnessError):
    """The harness wrote output its dialect cannot parse."""


class BridgeError(HarnessError):
    """The MCP bridge could not start, serve or stop."""


class ToolConflictError(HarnessError):
    """Env tools clash: a reserved name, a duplicate, or an unresolvable rename."""


class CaptureError(HarnessError):
    """The model proxy could not start or forward."""


class EndpointError(HarnessError):
    """The model endpoint (``mode="model"``) could not start, or was used outside its lifecycle."""


class CallbackError(HarnessError):
    """The ``on_event`` callback raised; the turn it watched was finished and recorded."""


class WorkerLost(HarnessError):
    """A rollout worker died mid-episode (a Ray actor lost); the rollout records it and goes on."""
