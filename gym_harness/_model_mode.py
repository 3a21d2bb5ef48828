"""Model mode (``mode="model"``): each step answers one model call of the harness.

The env serves the harness's model API itself (:class:`~gym_harness.model.ModelEndpoint`).
A user turn runs through ``TurnRunner.run_until_call``, which pauses as soon as a main
model call waits for the policy: that call is the observation. ``step(action)`` answers
it and runs the turn on to the next call or to the turn's end. At a turn's end
``user_fn(trajectory)`` may send the next user message; otherwise the episode ends.

Threads: the caller's thread only; the endpoint serves the harness from its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gym_harness.events import TurnResult
from gym_harness.model.action import Completion, InvalidAction
from gym_harness.outcome import Outcome

if TYPE_CHECKING:
    from gym_harness.model.endpoint import ModelEndpoint, PendingCall
    from gym_harness.trajectory import Trajectory
    from gym_harness.turn import TurnRunner

__all__ = ["ModelTurns", "UserFn", "assistant_message"]

#: ``user_fn(trajectory) -> str | None``: the next user message once a turn ends, or
#: ``None`` to end the episode.
UserFn = Callable[["Trajectory"], "str | None"]


def assistant_message(completion: Completion) -> dict[str, Any]:
    """``completion`` as an assistant message in the chat form of the observations."""
    message: dict[str, Any] = {"role": "assistant", "content": completion.content}
    if completion.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json},
            }
            for call in completion.tool_calls
        ]
    return message


@dataclass
class ModelTurns:
    """The model-mode state of one env: the call the policy holds, the last exchange.

    Args:
        endpoint: The env's model endpoint (started, its key given to this episode).
    """

    endpoint: ModelEndpoint
    pending: PendingCall | None = None
    #: The messages of the last call answered, with its answer (the transcript so far).
    messages: list[dict[str, Any]] | None = None

    def reset(self) -> None:
        """Forget the last episode (its calls were cut with it)."""
        self.pending, self.messages = None, None

    def run(
        self, runner: TurnRunner, message: str | None, deadline: float | None
    ) -> TurnResult | None:
        """Run the turn (sending ``message`` first, if any) to the next main model call.

        Returns:
            The turn's result when it ended, else ``None`` with the call in ``pending``.
        """
        while True:
            result = runner.run_until_call(message, deadline, self.endpoint)
            if result is not None:
                return result
            self.pending = self.endpoint.next_request()
            if self.pending is not None:
                return None
            message = None  # the call ended before it was claimed (cut, timed out): go on

    def answer(self, action: str) -> None:
        """Deliver ``action`` as the answer to the pending call.

        Raises:
            InvalidAction: ``action`` is no valid completion of that call; the call is
                failed (an API error to the harness), and the episode must end.
        """
        call = self.pending
        assert call is not None  # the env steps only while a call is pending
        self.pending = None
        try:
            completion = call.parse(action)
        except InvalidAction as exc:
            self.endpoint.fail(call.request_id, f"invalid action: {exc}")
            raise
        self.messages = [*call.observation["messages"], assistant_message(completion)]
        self.endpoint.deliver(call.request_id, completion)

    def observation(self) -> str:
        """The pending call's observation; after the last one, the final transcript."""
        if self.pending is not None:
            return json.dumps(self.pending.observation, ensure_ascii=False)
        return json.dumps(
            {
                "request_id": "",
                "api": "",
                "model": "",
                "messages": self.messages or [],
                "tools": [],
                "sampling": {},
                "stream": False,
            },
            ensure_ascii=False,
        )


def invalid_action(exc: InvalidAction, events: tuple[Any, ...]) -> TurnResult:
    """The result of a step whose action failed validation (``invalid_action``)."""
    return TurnResult(
        events=events,
        error_type=Outcome.INVALID_ACTION,
        error=f"the action is no valid answer to the model call: {exc}",
    )
