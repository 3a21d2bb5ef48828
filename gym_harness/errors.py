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
    ├── ForkError              ``HarnessEnv.fork`` made no child; the parent goes on
    │   ├── ForkUnsupported    the harness (or this episode) has no way to fork; nothing started
    │   ├── ForkDiverged       a replayed fork's harness asked otherwise than the parent's had
    │   └── ForkFailed         the copy of a turn-mode episode's workspace and home failed
    ├── PolicyError            a model-mode policy could not answer (its model server failed)
    └── WorkerLost             a vector worker or Ray actor died (``index`` names the sub-env)

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
    "ConfigError",
    "EndpointError",
    "ForkDiverged",
    "ForkError",
    "ForkFailed",
    "ForkUnsupported",
    "HarnessCrashed",
    "HarnessError",
    "HarnessStartError",
    "PolicyError",
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


class PolicyError(HarnessError):
    """A model-mode policy could not answer a model call: its model server was unreachable,
    failed, answered too late, or answered what is no completion.

    A rollout (``run_episode``, ``local_rollout``, ``ray_rollout``, ``gym-harness rollout``)
    ends that episode as ``policy_error`` (truncated, scored as cut) and goes on with the
    next; a caller driving ``step()`` itself passes the message to
    ``HarnessEnv.truncate(policy_error=...)``.
    """


class ForkError(HarnessError):
    """``HarnessEnv.fork`` made no child (the subclass says why); the parent episode goes
    on as it was. A grouped rollout records each as a ``fork_failed`` record."""


class ForkUnsupported(ForkError):
    """``HarnessEnv.fork`` cannot fork this episode: the message names the harness and what it
    lacks (a way to resume a copy of its session, a record, room under ``max_fork_bytes``)."""


class ForkDiverged(ForkError):
    """With ``fork(strict=True)``, a replayed model request differed from the parent's (the
    message says which call and what differed); the child was closed."""


class ForkFailed(ForkError):
    """A turn-mode fork could not copy the parent's workspace and home, which its harness
    may change meanwhile; the child was closed. The message names the entry and the cause:
    the tree grew past ``max_fork_bytes`` during the copy (the child never held more), an
    entry vanished or became a link (no link is ever followed), the disk is full, or the
    tree is nested too deep."""


class WorkerLost(HarnessError):
    """A sub-env's worker process (a vector env's worker, a Ray actor) died.

    A step reports such a death as an outcome (``info["error_type"] == "worker_lost"``)
    and the worker is replaced; this is raised where no step can report it: a reset
    whose worker died twice, a ``call``/``get_attr``/``set_attr`` whose worker died,
    a rollout episode whose actor died (the rollout records it and goes on).

    Args:
        message: Which sub-env, which worker, how it ended.
        index: The sub-env's index in its vector env (``None`` outside one).
        exit_code: The worker's exit status (``-N`` for signal N), if known.
        pid: The worker's process id, if known.
    """

    def __init__(
        self,
        message: str = "",
        *,
        index: int | None = None,
        exit_code: int | None = None,
        stderr_tail: str = "",
        pid: int | None = None,
    ) -> None:
        super().__init__(message, exit_code=exit_code, stderr_tail=stderr_tail, pid=pid)
        self.index = index

    def _extras(self) -> dict[str, Any]:
        return {**super()._extras(), "index": self.index}
