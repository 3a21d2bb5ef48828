"""Running the user's code on a turn: ``reward_fn``, ``user_fn`` and ``on_event``.

All run in the env's process, after (``reward_fn``, model mode's ``user_fn``) or while
(``on_event``) a turn runs, and none may corrupt it. The env records the turn before
any result is used, so what the user's code does never loses or shifts a turn:

* ``RewardRunner`` calls ``reward_fn``. An exception becomes the outcome
  ``reward_error`` (reward 0.0, a one-line summary for ``info["error"]``, the
  full traceback logged once); with ``reward_timeout_s`` the call runs in a
  worker thread and one that overruns becomes ``reward_timeout``. A thread
  cannot be killed, so a reward still running from an earlier turn makes the
  next call ``reward_timeout`` at once: at most one such thread per env.
* ``UserFnRunner`` calls ``user_fn`` (model mode) once a turn ended and was scored. An
  exception, or a value that is no ``str`` or ``None``, becomes the outcome
  ``user_fn_error``: the episode ends, the turn keeps its reward, ``info["error"]``
  has a one-line summary and the traceback is logged once.
* ``CallbackGuard`` calls ``on_event``. The first exception is kept (the
  callback is not called again during that turn) and raised once the turn is
  finished and recorded, as a ``CallbackError`` that names the callback.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gym_harness.errors import CallbackError, ConfigError
from gym_harness.outcome import Outcome
from gym_harness.records.events import HarnessEvent
from gym_harness.records.trajectory import RewardContext, RewardFn, Trajectory, TurnRecord
from gym_harness.utils.imports import import_attr

__all__ = [
    "CallbackGuard",
    "RewardRunner",
    "TurnScorer",
    "UserFnRunner",
    "describe",
    "summary",
    "user_callable",
]

_log = logging.getLogger("gym_harness")


def describe(fn: object) -> str:
    """A callable as a message names it: ``module.qualname``."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module else str(name)


def summary(exc: BaseException) -> str:
    """``Type: message (at file:line in function)``: one line of a traceback."""
    text = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {last.filename}:{last.lineno} in {last.name})"
    return text


class TurnScorer:
    """Scores turns with the env's current ``reward_fn`` (a new one gets a new runner).

    Args:
        timeout_s: ``HarnessConfig.reward_timeout_s``.
    """

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self.runner: RewardRunner | None = None

    def score(
        self,
        reward_fn: RewardFn,
        record: TurnRecord,
        dirs: tuple[Path, Path],
        task: Mapping[str, Any] | None,
    ) -> TurnRecord:
        """``record`` scored by ``reward_fn`` (its faults become the record's outcome).

        Args:
            dirs: The episode's workspace and its directory of hidden task files.
            task: The episode's task as a dict, if any.
        """
        if self.runner is None or self.runner.reward_fn is not reward_fn:
            self.runner = RewardRunner(reward_fn, self.timeout_s)
        return record.scored(*self.runner(record.reward_context(*dirs, task)))


class RewardRunner:
    """Calls ``reward_fn`` and turns its faults into outcomes.

    Threads: called from the env's caller thread; with a timeout, each call runs
    in a daemon worker thread that owns nothing but the call's result slot.

    Args:
        reward_fn: The user's ``reward_fn(ctx) -> float``.
        timeout_s: Longest a call may take (``None``: no bound, and no thread).
    """

    def __init__(self, reward_fn: RewardFn, timeout_s: float | None) -> None:
        self.reward_fn = reward_fn
        self.timeout_s = timeout_s
        self._busy: threading.Thread | None = None

    def __call__(self, ctx: RewardContext) -> tuple[float, Outcome, str]:
        """Score one turn.

        Returns:
            ``(reward, Outcome.OK, "")``, or ``(0.0, outcome, why)`` with outcome
            ``REWARD_ERROR`` or ``REWARD_TIMEOUT``.
        """
        name = describe(self.reward_fn)
        if self.timeout_s is None:
            try:
                return float(self.reward_fn(ctx)), Outcome.OK, ""
            except Exception as exc:
                return self._failed(name, exc)
        if self._busy is not None and self._busy.is_alive():
            return (
                0.0,
                Outcome.REWARD_TIMEOUT,
                (
                    f"reward_fn {name} is still running from an earlier turn (it overran "
                    f"reward_timeout_s={self.timeout_s}); it was not called again. Make it return "
                    "in time, or raise reward_timeout_s."
                ),
            )
        slot: list[Any] = []

        def call() -> None:
            try:
                slot.append(float(self.reward_fn(ctx)))
            except BaseException as exc:  # handed to the caller's thread
                slot.append(exc)

        thread = threading.Thread(target=call, name="gym-harness-reward", daemon=True)
        self._busy = thread
        thread.start()
        thread.join(self.timeout_s)
        if not slot:
            return (
                0.0,
                Outcome.REWARD_TIMEOUT,
                (
                    f"reward_fn {name} ran past reward_timeout_s={self.timeout_s}; reward 0.0. "
                    "Make it faster, or raise reward_timeout_s."
                ),
            )
        value = slot[0]
        if isinstance(value, Exception):
            return self._failed(name, value)
        if isinstance(value, BaseException):
            raise value
        return value, Outcome.OK, ""

    @staticmethod
    def _failed(name: str, exc: Exception) -> tuple[float, Outcome, str]:
        _log.error("reward_fn %s raised; the turn ends as reward_error", name, exc_info=exc)
        why = (
            f"reward_fn {name} raised {summary(exc)}; reward 0.0. "
            "The full traceback is in the 'gym_harness' log."
        )
        return 0.0, Outcome.REWARD_ERROR, why


class UserFnRunner:
    """Calls model mode's ``user_fn`` and turns its faults into ``user_fn_error``.

    Threads: the env's caller thread only.

    Args:
        user_fn: The user's ``user_fn(trajectory) -> str | None``.
    """

    def __init__(self, user_fn: Callable[[Trajectory], str | None]) -> None:
        self.user_fn = user_fn

    def __call__(self, trajectory: Trajectory) -> tuple[str | None, Outcome, str]:
        """The next user message after a turn.

        Returns:
            ``(message or None, Outcome.OK, "")``, or ``(None, Outcome.USER_FN_ERROR,
            why)`` when ``user_fn`` raised or returned something that is no ``str``.
        """
        name = describe(self.user_fn)
        try:
            message = self.user_fn(trajectory)
        except Exception as exc:
            _log.error("user_fn %s raised; the episode ends as user_fn_error", name, exc_info=exc)
            why = (
                f"user_fn {name} raised {summary(exc)}; the episode ends (the turn is kept and "
                "scored). The full traceback is in the 'gym_harness' log."
            )
            return None, Outcome.USER_FN_ERROR, why
        if message is None or isinstance(message, str):
            return message, Outcome.OK, ""
        shown = repr(message)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        why = (
            f"user_fn {name} returned {type(message).__name__} {shown}; it must return the "
            "next user message as a str, or None to end the episode. The episode ends (the "
            "turn is kept and scored)."
        )
        return None, Outcome.USER_FN_ERROR, why


class CallbackGuard:
    """Calls ``on_event`` for each event; keeps its first exception for later.

    The callback is passed at each call (``env.on_event`` may be changed between
    turns); after it raised once, it is not called again until ``raise_pending``.
    """

    def __init__(self) -> None:
        self._error: tuple[object, Exception] | None = None

    def __call__(
        self, on_event: Callable[[HarnessEvent], None] | None, event: HarnessEvent
    ) -> None:
        if on_event is None or self._error is not None:
            return
        try:
            on_event(event)
        except Exception as exc:
            self._error = (on_event, exc)

    def raise_pending(self, where: str) -> None:
        """Raise the kept exception (once) as a ``CallbackError``; else do nothing.

        Args:
            where: What the callback watched ("turn 3"), for the message.
        """
        kept, self._error = self._error, None
        if kept is None:
            return
        callback, exc = kept
        raise CallbackError(
            f"The on_event callback {describe(callback)} raised {summary(exc)} during "
            f"{where}. That ran to its end and is recorded in env.unwrapped.trajectory "
            "(the call's return values are lost); the callback was not called again for it. "
            "Fix the callback; the episode can go on."
        ) from exc


def user_callable(value: Any, what: str) -> Callable[..., Any] | None:
    """``value`` (a callable, an import string ``"pkg.module:attr"``, or ``None``) as a
    callable or ``None``.

    Raises:
        ConfigError: The import fails or ``value`` is not callable.
    """
    if isinstance(value, str):
        value = import_attr(value, what)
    if value is not None and not callable(value):
        raise ConfigError(f"{what} must be a callable or an import string, got {value!r}.")
    return value
