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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gym_harness.errors import ConfigError
from gym_harness.events import HarnessEvent, TurnResult
from gym_harness.model.action import InvalidAction, assistant_message
from gym_harness.outcome import Outcome
from gym_harness.trajectory import TurnRecord

if TYPE_CHECKING:
    from gym_harness.capture.proxy import ModelProxy
    from gym_harness.harnesses.base import Harness
    from gym_harness.model.endpoint import EndpointConfig, ModelEndpoint, PendingCall
    from gym_harness.trajectory import Trajectory
    from gym_harness.turn import TurnRunner

__all__ = ["Episode", "ModelTurns", "UserFn", "model_options"]

#: ``user_fn(trajectory) -> str | None``: the next user message once a turn ends, or
#: ``None`` to end the episode.
UserFn = Callable[["Trajectory"], "str | None"]


def model_options(
    mode: str, capture: bool, policy_timeout_s: float, model_calls: str
) -> EndpointConfig | None:
    """The endpoint settings of ``mode="model"`` (``None`` for ``"turns"``), checked.

    Raises:
        ConfigError: An unknown mode, ``capture`` with model mode (``upstream`` alone
            is fine: side calls go there), or a bad setting.
    """
    if mode == "turns":
        return None
    if mode != "model":
        raise ConfigError(f'mode must be "turns" or "model", got {mode!r}.')
    if capture:
        raise ConfigError(
            'mode="model" serves the harness\'s model calls itself (they are recorded in '
            "trajectory.calls): drop capture=True."
        )
    from gym_harness.model.endpoint import EndpointConfig

    return EndpointConfig(policy_timeout_s=policy_timeout_s, model_calls=model_calls)


@dataclass(frozen=True)
class Episode:
    """What a model-mode step needs of the env's episode (the env makes one per step).

    Args:
        runner: The episode's turns; ``None`` when the harness did not start.
        startup_error: ``(outcome, error)`` of a failed start (``Outcome.OK`` if none).
        trajectory: The episode's trajectory (``calls`` are added to it).
        deadline: When the episode's wall budget runs out (``time.monotonic()``), if set.
        finish: ``finish(turn, message, result, started_at, elapsed)`` records a turn that
            ended in the trajectory and scores it; it returns the turn's record.
    """

    runner: TurnRunner | None
    startup_error: tuple[Outcome, str]
    trajectory: Trajectory
    deadline: float | None
    finish: Callable[[int, str, TurnResult, float, float], TurnRecord]


@dataclass
class ModelTurns:
    """The model-mode state of one env: the call the policy holds, the last exchange.

    Args:
        endpoint: The env's model endpoint (started, its key given to this episode).
        user_fn: ``user_fn(trajectory) -> str | None`` at each turn's end, or ``None``.
    """

    endpoint: ModelEndpoint
    user_fn: UserFn | None = None
    #: The main model call the policy holds (the observation), if any.
    pending: PendingCall | None = None
    #: The messages of the last call answered, with its answer (the transcript so far).
    messages: list[dict[str, Any]] | None = None
    #: The user message of the turn under way.
    message: str = ""
    #: A turn that ended before its first model call (during ``reset``), for the next step.
    ended: TurnResult | None = None
    #: How many of the turn's events earlier steps reported.
    shown: int = 0

    @classmethod
    def serve(cls, harness: Harness, options: EndpointConfig, user_fn: UserFn | None) -> ModelTurns:
        """Start an endpoint whose side calls are the ones ``harness`` names."""
        from gym_harness.model.endpoint import ModelEndpoint

        endpoint = ModelEndpoint(harness.side_call, config=options)
        endpoint.start()
        return cls(endpoint, user_fn)

    def new_key(self, proxy: ModelProxy | None = None) -> str:
        """A new episode's key for the endpoint; calls of earlier episodes are refused.

        Args:
            proxy: The capture proxy side calls go through (``upstream=`` is set), if any,
                its token already rotated for the new episode.
        """
        if proxy is not None:
            from gym_harness.model._side import MARGIN_S, SideUpstream

            timeout_s = proxy.timeout_s + MARGIN_S  # the proxy's own 504 comes first
            self.endpoint.side_upstream = SideUpstream(proxy.base_url, proxy.token, timeout_s)
        return self.endpoint.rotate_token()

    def take_step(
        self, episode: Episode, action: str, turn: int, started_at: float, start: float
    ) -> tuple[str, TurnRecord]:
        """``env.step(action)`` in model mode: answer the pending call, run to the next.

        A turn that ends is recorded and scored (``episode.finish``); ``user_fn`` may then
        start the next, whose first call is this step's observation (with the ended
        turn's reward).

        Returns:
            The observation, and the step's record: the turn's own when it ended the
            episode, else one made for this step (kept out of ``trajectory.turns``).
        """
        runner, trajectory = episode.runner, episode.trajectory
        if episode.startup_error[0] or runner is None:
            outcome, error = episode.startup_error
            result: TurnResult | None = TurnResult(error_type=outcome, error=error)
        else:
            result = self.step(runner, action, episode.deadline)
        reward = 0.0
        while result is not None:  # a turn ended
            elapsed = time.monotonic() - start
            record = episode.finish(turn, self.message, result, started_at, elapsed)
            if not (record.terminated or record.truncated or runner is None):
                if (message := self.next_turn(trajectory)) is not None:
                    reward, turn = record.reward, turn + 1
                    result = self.run(runner, message, episode.deadline)
                    continue
                trajectory.turns[-1] = record = replace(record, terminated=True)
            return self.observation(), replace(record, events=self.new_events(record.events))
        assert runner is not None
        step = TurnResult(events=self.new_events(runner.paused_events))
        elapsed = time.monotonic() - start
        record = TurnRecord.of_turn(turn, self.message, step, started_at, elapsed, False, False)
        trajectory.calls.extend(self.endpoint.drain())
        return self.observation(), replace(record, reward=reward)

    def begin(
        self,
        runner: TurnRunner | None,
        message: str,
        events: Sequence[HarnessEvent],
        deadline: float | None,
    ) -> tuple[str, list[HarnessEvent]]:
        """Send the episode's first user message and run to the first model call.

        Args:
            runner: The episode's turns; ``None`` when the harness did not start (the
                observation is then the conversation so far: the user message alone).

        Returns:
            ``reset()``'s observation, and ``events`` (the startup's) with the turn's so far.
        """
        self.pending, self.messages, self.ended, self.shown = None, None, None, 0
        self.message = message
        if runner is None:
            self.messages = [{"role": "user", "content": message}]
            return self.observation(), list(events)
        self.ended = self.run(runner, message, deadline)
        return self.observation(), [*events, *self.new_events(runner.paused_events)]

    def end_episode(self, trajectory: Trajectory) -> None:
        """Cut the calls still waiting (the harness is stopped) and record every call."""
        self.endpoint.cut("the episode ended")
        trajectory.calls.extend(self.endpoint.drain())

    def step(self, runner: TurnRunner, action: str, deadline: float | None) -> TurnResult | None:
        """Answer the pending call with ``action`` and run to the next one (``None``) or
        to the turn's end (its result; ``invalid_action`` for an action that does not fit)."""
        if self.ended is not None or self.pending is None:
            ended, self.ended = self.ended, None
            return ended or TurnResult(error_type=Outcome.PROTOCOL_ERROR, error="no model call")
        try:
            self.answer(action)
        except InvalidAction as exc:
            return invalid_action(exc, runner.paused_events)
        return self.run(runner, None, deadline)

    def next_turn(self, trajectory: Trajectory) -> str | None:
        """After a turn's end: ``user_fn``'s next user message, or ``None`` to end."""
        message = None if self.user_fn is None else self.user_fn(trajectory)
        if message is not None:
            if not isinstance(message, str):
                raise TypeError(f"user_fn must return a str or None, got {type(message)!r}.")
            self.message, self.shown = message, 0
        return message

    def new_events(self, events: tuple[HarnessEvent, ...]) -> tuple[HarnessEvent, ...]:
        """The events of the turn that no earlier step reported."""
        fresh, self.shown = events[self.shown :], len(events)
        return fresh

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
