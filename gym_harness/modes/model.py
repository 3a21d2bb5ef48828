"""Model mode (``mode="model"``): each step answers one model call of the harness.

The env serves the harness's model API itself (:class:`~gym_harness.model.ModelEndpoint`).
A user turn runs through ``TurnRunner.run_until_call``, which pauses as soon as a main
model call waits for the policy: that call is the observation. ``step(action)`` answers
it and runs the turn on to the next call or to the turn's end, which goes to the
:class:`~gym_harness.modes.base.Recorder`. At a turn's end ``user_fn(trajectory)`` may
send the next user message; otherwise the episode ends.

An answer that did not reach the harness is never shown or scored as delivered. One
that comes after ``policy_timeout_s`` (the harness got the endpoint's 504 instead) ends
the episode at once as ``policy_timeout``, and the conversation stays what the harness
really got. So does a turn that ends "cleanly" (or with the harness's own error) while
a call of it timed out and no later answer was delivered (the endpoint's ``lapses``):
some harnesses, Gemini CLI among them, end their turn as if done after API errors.

Threads: the caller's thread only; the endpoint serves the harness from its own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gym_harness.errors import ConfigError
from gym_harness.model.action import InvalidAction, assistant_message
from gym_harness.modes.base import Episode, HeldCall, Mode, Opening, Recorder, Served, Start
from gym_harness.outcome import Outcome
from gym_harness.records.events import EventType, HarnessEvent, TurnResult
from gym_harness.records.trajectory import TurnRecord

if TYPE_CHECKING:
    from gym_harness.capture.proxy import ModelProxy
    from gym_harness.model.endpoint import EndpointConfig, ModelEndpoint, PendingCall
    from gym_harness.model.request import ModelRequest
    from gym_harness.records.trajectory import Trajectory
    from gym_harness.turn import TurnRunner

__all__ = ["ModelMode", "NextMessage", "UserFn", "model_options"]

#: ``user_fn(trajectory) -> str | None``: the next user message once a turn ends, or
#: ``None`` to end the episode.
UserFn = Callable[["Trajectory"], "str | None"]
#: The env's guarded ``user_fn``: ``(message or None, Outcome.OK, "")``, or
#: ``(None, Outcome.USER_FN_ERROR, why)`` when it raised or returned no str.
NextMessage = Callable[["Trajectory"], "tuple[str | None, Outcome, str]"]
#: ``side_call(request, headers)``: whether a model call is a side call (``Harness.side_call``).
SideCall = Callable[["ModelRequest", Mapping[str, str]], bool]


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


class ModelMode(Mode):
    """The driver of a model-mode episode (a :class:`~gym_harness.modes.base.Mode`): the
    call the policy holds, the last exchange.

    Args:
        recorder: Where each finished turn is recorded and scored.
        side_call: Which model calls are side calls (the harness's ``side_call``).
        options: The endpoint's settings (:func:`model_options`).
        user_fn: The env's guarded ``user_fn`` (:data:`NextMessage`), run at each turn's
            end, or ``None``.
    """

    def __init__(
        self,
        recorder: Recorder,
        side_call: SideCall,
        options: EndpointConfig,
        user_fn: NextMessage | None = None,
    ) -> None:
        super().__init__(recorder)
        self.side_call = side_call
        self.options = options
        self.user_fn = user_fn
        #: The env's model endpoint, once the first episode is served.
        self.endpoint: ModelEndpoint | None = None
        #: The main model call the policy holds (the observation), if any.
        self.pending: PendingCall | None = None
        #: The messages of the last call answered, with its answer (the transcript so far).
        self.messages: list[dict[str, Any]] | None = None
        #: The user message of the turn under way.
        self.message = ""
        #: A turn that ended before its first model call (during ``reset``), for the next step.
        self.ended: TurnResult | None = None
        #: How many of the turn's events earlier steps reported.
        self.shown = 0

    @property
    def live(self) -> ModelEndpoint:
        """The endpoint (served: the env steps only an episode it served)."""
        assert self.endpoint is not None
        return self.endpoint

    def open_endpoint(self) -> ModelEndpoint:
        """Start an endpoint whose side calls are the ones ``side_call`` names."""
        from gym_harness.model.endpoint import ModelEndpoint

        endpoint = ModelEndpoint(self.side_call, config=self.options)
        endpoint.start()
        return endpoint

    def serve(self, start: Start, proxy: ModelProxy | None) -> Served:
        """The endpoint (started once, owned by the env) with a new episode's key; calls
        of earlier episodes are refused.

        Args:
            start: Starts and owns the endpoint, the first time.
            proxy: The capture proxy side calls go through (``upstream=`` is set), if any,
                its token already rotated for the new episode.
        """
        if self.endpoint is None:  # started and owned, or neither
            self.endpoint = start(self.open_endpoint)
        endpoint = self.endpoint
        assert endpoint is not None
        side = None
        if proxy is not None:
            from gym_harness.model import via_proxy

            side = via_proxy(proxy.base_url, proxy.token, proxy.timeout_s)
        key = endpoint.rotate_token(side)
        return Served(endpoint.base_url, key, self.options.policy_timeout_s, endpoint)

    def held(self) -> HeldCall:
        """The call the policy holds and the turn's user message, for a fork."""
        observation = None if self.pending is None else self.pending.observation
        return HeldCall(observation, self.message, self.options.model_calls == "all")

    def step(self, action: str) -> tuple[str, TurnRecord]:
        """``env.step(action)`` in model mode: answer the pending call, run to the next.

        A turn that ends is recorded and scored (the recorder); ``user_fn`` may then
        start the next, whose first call is this step's observation (with the ended
        turn's reward). A ``user_fn`` that fails ends the episode as ``user_fn_error``.

        Returns:
            The observation, and the step's record: the turn's own when it ended the
            episode, else one made for this step (kept out of ``trajectory.turns``).
        """
        episode = self.started
        runner, trajectory = episode.runner, episode.trajectory
        turn = len(trajectory.turns) + 1
        started_at, start = time.time(), time.monotonic()
        if episode.startup_error[0] or runner is None:
            outcome, error = episode.startup_error
            result: TurnResult | None = TurnResult(error_type=outcome, error=error)
        else:
            result = self.answer_and_run(runner, action, episode.deadline)
        reward = 0.0
        while result is not None:  # a turn ended
            elapsed = time.monotonic() - start
            record = self.recorder.record(episode, turn, self.message, result, started_at, elapsed)
            if not (record.terminated or record.truncated or runner is None):
                message, outcome, why = self.next_turn(trajectory)
                if message is not None:
                    reward, turn = record.reward, turn + 1
                    result = self.run(runner, message, episode.deadline)
                    continue
                record = replace(record, terminated=True)
                if outcome:  # the turn stays scored; the episode ends on user_fn's fault
                    record = replace(record, error_type=outcome.value, error=why)
                trajectory.turns[-1] = record
            return self.observation(), replace(record, events=self.new_events(record.events))
        assert runner is not None and self.endpoint is not None
        step = TurnResult(events=self.new_events(runner.paused_events))
        elapsed = time.monotonic() - start
        record = TurnRecord.of_turn(turn, self.message, step, started_at, elapsed, False, False)
        trajectory.calls.extend(self.endpoint.drain())
        return self.observation(), replace(record, reward=reward)

    def start(self, episode: Episode, prompt: str, events: Sequence[HarnessEvent]) -> Opening:
        """Send the episode's first user message and run to the first model call.

        Without a runner (the harness did not start) the observation is the conversation
        so far: the user message alone.

        Returns:
            ``reset()``'s observation, and ``events`` (the startup's) with the turn's so far;
            the outcome is the startup's, or that of a turn that ended before its first call.
        """
        self.episode = episode
        self.pending, self.messages, self.ended, self.shown = None, None, None, 0
        self.message = prompt
        runner = episode.runner
        outcome, error = episode.startup_error
        if outcome or runner is None:
            self.messages = [{"role": "user", "content": prompt}]
            return Opening(self.observation(), list(events), str(outcome), error)
        self.ended = self.run(runner, prompt, episode.deadline)
        seen = [*events, *self.new_events(runner.paused_events)]
        ended = self.ended or TurnResult()  # a turn that ended before its first call
        return Opening(self.observation(), seen, str(ended.error_type), ended.error)

    def truncate(self, policy_error: str = "") -> bool:
        """The turn under way (its call held by the policy), recorded as truncated with
        what the harness said so far (as ``policy_error`` when the policy failed to answer
        it), and scored; ``False`` when no call is held."""
        episode = self.started
        if self.pending is None or episode.runner is None:
            return False
        turns = episode.trajectory.turns
        events = episode.runner.paused_events
        text = "".join(str(e.data.get("text") or "") for e in events if e.type is EventType.TEXT)
        started_at = turns[-1].started_at + turns[-1].elapsed_s if turns else time.time()
        fault = (Outcome.POLICY_ERROR, policy_error) if policy_error else (Outcome.OK, "")
        result = TurnResult(response=text, events=events, error_type=fault[0], error=fault[1])
        self.recorder.record(episode, len(turns) + 1, self.message, result, started_at, 0.0, True)
        return True

    def end(self, trajectory: Trajectory) -> None:
        """Cut the calls still waiting (the harness is stopped) and record every call."""
        if self.endpoint is None:
            return
        self.endpoint.cut("the episode ended")
        trajectory.calls.extend(self.endpoint.drain())

    def answer_and_run(
        self, runner: TurnRunner, action: str, deadline: float | None
    ) -> TurnResult | None:
        """Answer the pending call with ``action`` and run to the next one (``None``) or
        to the turn's end (its result; ``invalid_action`` for an action that does not fit)."""
        if self.ended is not None or self.pending is None:
            ended, self.ended = self.ended, None
            return ended or TurnResult(error_type=Outcome.PROTOCOL_ERROR, error="no model call")
        try:
            lost = self.answer(action)
        except InvalidAction as exc:
            return invalid_action(exc, runner.paused_events)
        if lost:  # too late: the harness got an API error instead, and is stopped
            return self.timed_out(runner, runner.paused_events, lost)
        return self.run(runner, None, deadline)

    def next_turn(self, trajectory: Trajectory) -> tuple[str | None, Outcome, str]:
        """After a turn's end: ``user_fn``'s next user message, or ``None`` to end (with
        ``user_fn_error`` and why, when it failed)."""
        if self.user_fn is None:
            return None, Outcome.OK, ""
        message, outcome, why = self.user_fn(trajectory)
        if message is not None:
            self.message, self.shown = message, 0
        return message, outcome, why

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
                return self.unanswered(runner, result)
            self.pending = self.live.next_request()
            if self.pending is not None:
                return None
            message = None  # the call ended before it was claimed (cut, timed out): go on

    def answer(self, action: str) -> str:
        """Deliver ``action`` as the answer to the pending call.

        Returns:
            ``""`` once delivered; else why it was not (the call timed out before: the
            harness got an API error instead, and the transcript keeps no answer).

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
            self.live.fail(call.request_id, f"invalid action: {exc}")
            raise
        if not self.live.deliver(call.request_id, completion):
            return self.too_late(call)
        self.messages = [*call.observation["messages"], assistant_message(completion)]
        return ""

    def too_late(self, call: PendingCall) -> str:
        """Why the answer to ``call`` was not delivered: how late it came, what the
        harness got instead, and how many more calls timed out meanwhile."""
        limit = self.options.policy_timeout_s
        took = time.time() - call.started
        status, error = call.failure or (504, "")
        count, ids = self.live.lapses()
        why = (
            f"the policy answered model call {call.request_id} {took:.1f}s after it arrived, "
            f"{max(took - limit, 0.0):.1f}s past policy_timeout_s={limit:g}: the harness got an "
            f"API error ({status}: {error}) instead, and the answer was not delivered"
        )
        if (more := count - (call.request_id in ids)) > 0:
            why += f"; {more} more model call(s) (the harness's retries) timed out meanwhile"
        return why + ". The harness is stopped; answer sooner, or raise policy_timeout_s."

    def unanswered(self, runner: TurnRunner, result: TurnResult) -> TurnResult:
        """``result``, or ``policy_timeout`` for a turn the harness ended cleanly (or with
        its own error) while a call of it had timed out and no later answer went out."""
        if result.error_type not in (Outcome.OK, Outcome.HARNESS_ERROR):
            return result
        count, ids = self.live.lapses()
        if not count:
            return result
        limit = self.options.policy_timeout_s
        more = f" ({count - 1} more after it)" if count > 1 else ""
        ended = f"with its own error: {result.error}" if result.error_type else "as if done"
        why = (
            f"model call {ids[0]}{more} got no answer within policy_timeout_s={limit:g}: the "
            f"harness got an API error (504) instead, no later answer was delivered, and it "
            f"ended the turn {ended}"
        )
        return self.timed_out(runner, result.events, why, result.response)

    def timed_out(
        self,
        runner: TurnRunner,
        events: tuple[HarnessEvent, ...],
        why: str,
        response: str | None = None,
    ) -> TurnResult:
        """The turn's end as ``policy_timeout``, with an ``error`` event that says why."""
        event = HarnessEvent(
            EventType.ERROR, {"error_type": Outcome.POLICY_TIMEOUT.value, "message": why}
        )
        runner.emit(event)
        if response is None:  # what the harness said before the call it got no answer to
            response = "".join(
                str(e.data.get("text") or "") for e in events if e.type is EventType.TEXT
            )
        return TurnResult(
            response=response,
            events=(*events, event),
            error_type=Outcome.POLICY_TIMEOUT,
            error=why,
        )

    def observation(self) -> str:
        """The pending call's observation; after the last one, the final transcript."""
        if self.pending is not None:
            return self.pending.observation_text
        return json.dumps(
            {
                "request_id": "",
                "api": "",
                "model": "",
                "messages": self.messages or [],
                "tools": [],
                "sampling": {},
                "stream": False,
                "extends": False,
                "new_from": 0,
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
