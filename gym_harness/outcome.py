"""Outcome: how a step ended, the one vocabulary of ``info["error_type"]``.

Every value is the plain string that appears in ``info["error_type"]`` (``""`` for a
clean turn); ``Outcome`` is a ``StrEnum``, so ``info["error_type"] == Outcome.TURN_TIMEOUT``
holds and the info dict keeps plain ``str`` values that vector envs can stack. The
README's outcome table is the complete list: add an outcome there and here together.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Outcome"]


class Outcome(StrEnum):
    """How a step ended (the README's outcome table).

    ``terminates`` and ``truncates`` say which gymnasium flag an outcome sets; a clean
    turn (``OK``) sets neither by itself (the harness's own ``done`` decides).
    """

    OK = ""
    HARNESS_CRASHED = "harness_crashed"
    PROTOCOL_ERROR = "protocol_error"
    HARNESS_ERROR = "harness_error"
    STARTUP_FAILED = "startup_failed"
    BRIDGE_FAILED = "bridge_failed"
    REWARD_ERROR = "reward_error"
    USER_FN_ERROR = "user_fn_error"
    INVALID_ACTION = "invalid_action"
    WORKER_LOST = "worker_lost"
    ENV_ERROR = "env_error"
    RESOURCE_LIMIT = "resource_limit"
    TURN_TIMEOUT = "turn_timeout"
    IDLE_TIMEOUT = "idle_timeout"
    EPISODE_TIMEOUT = "episode_timeout"
    REWARD_TIMEOUT = "reward_timeout"
    POLICY_TIMEOUT = "policy_timeout"
    POLICY_ERROR = "policy_error"

    @property
    def truncates(self) -> bool:
        """Whether this outcome truncates the episode (a deadline ran out)."""
        return self in _TRUNCATING

    @property
    def terminates(self) -> bool:
        """Whether this outcome terminates the episode (a fault of the harness or its reward)."""
        return self is not Outcome.OK and not self.truncates


_TRUNCATING = frozenset(
    {
        Outcome.TURN_TIMEOUT,
        Outcome.IDLE_TIMEOUT,
        Outcome.EPISODE_TIMEOUT,
        Outcome.REWARD_TIMEOUT,
        Outcome.POLICY_TIMEOUT,
        Outcome.POLICY_ERROR,
    }
)
