"""TurnRunner: drive one harness process through startup and turns, under deadlines.

The runner owns the loop that reads the harness's output lines, hands each to
the episode's session (``HarnessSession.feed``), writes its replies back, and ends
a turn on ``turn_complete``, an adapter-reported error, the end of the harness
(its output closed, or the process we started exited: a descendant that still
holds stdout does not keep it alive), or a deadline (turn, idle, episode). It
runs in the caller's thread.

The fault boundary
------------------
This module is the one place where harness, bridge and proxy faults become
outcomes, the way httpx maps transport errors at one boundary
(``map_httpcore_exceptions``). Every call the runner makes into the process
(write, read, liveness), the session (``startup_lines``, ``message_lines``, ``feed``,
``interrupt_lines``, ``missing_tools``), the bridge and the model proxy runs inside
``TurnRunner._faults``, which turns what it catches into ``TurnEnded(outcome,
message)``; ``startup`` and ``run`` catch that once and return the outcome::

    HarnessCrashed, OSError                      -> harness_crashed
    TurnTimeout (stdin unread until the deadline) -> turn_timeout
    ProtocolError, an adapter raising on a line  -> protocol_error
    BridgeError, the bridge's thread found dead  -> bridge_failed
    any other Exception                          -> the call site's outcome

The bridge is checked at the start of a turn, with every liveness check while
the turn waits, and when the harness ends a turn: a bridge that died during a
step names that step's outcome, never ``""``.

``run`` and ``startup`` never raise for harness faults. What passes through is
``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``): the env
then ends the episode, so a later step cannot read this turn's reply.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from gym_harness.config import TurnLimits
from gym_harness.errors import BridgeError, HarnessCrashed, ProtocolError, TurnTimeout
from gym_harness.harnesses.base import Feed, HarnessSession
from gym_harness.outcome import Outcome
from gym_harness.records.events import EventType, HarnessEvent, TurnResult

if TYPE_CHECKING:
    from gym_harness.bridge.server import MCPBridge
    from gym_harness.lifecycle import Liveness, Wake
    from gym_harness.process.harness_process import HarnessProcess

__all__ = ["TurnEnded", "TurnRunner", "end_flags"]

_log = logging.getLogger("gym_harness")

#: How long to wait for an exit code once the harness closed its output.
EXIT_WAIT_S = 1.0
#: How often a turn checks that the process we started still runs (even while
#: lines keep coming: a descendant may hold stdout after the harness died).
LIVENESS_S = 0.25
#: After the harness exited, how long its last output is still read (bounded:
#: a descendant may keep writing).
EXIT_DRAIN_S = 0.25
#: Joins a message and the harness's stderr tail.
STDERR_SUFFIX = "; stderr tail:\n"


def end_flags(result: TurnResult) -> tuple[bool, bool]:
    """Return ``(terminated, truncated)`` for a turn's result (the outcome table)."""
    if not result.error_type:  # Outcome.OK, which neither terminates nor truncates
        return result.done, False
    outcome = Outcome(result.error_type)
    if outcome.truncates:
        return False, True
    if outcome.terminates:
        return True, False
    return result.done, False


class TurnEnded(Exception):
    """Raised inside the runner when a fault ends the turn; never leaves it.

    Args:
        outcome: How the turn ended.
        message: What happened and what to do, for ``info["error"]``.
    """

    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message


class TurnRunner:
    """Runs the startup handshake and the turns of one harness process.

    Args:
        session: The episode's adapter session (from ``Harness.launch``).
        proc: The started harness process; its output counts as a sign of life.
        limits: The deadlines (``HarnessConfig.turn_limits()``).
        bridge: The env's MCP bridge (its failure ends the turn; the tool check).
        emit: Called with every event as soon as it is parsed; must not raise.
        liveness: Other sources of signs of life besides ``proc``: the bridge (tool
            calls), the model proxy (model traffic).
    """

    def __init__(
        self,
        session: HarnessSession,
        proc: HarnessProcess,
        limits: TurnLimits,
        bridge: MCPBridge | None,
        emit: Callable[[HarnessEvent], None],
        liveness: Sequence[Liveness] = (),
    ) -> None:
        self.session = session
        self.proc = proc
        self.limits = limits
        self.sources: tuple[Liveness, ...] = (proc, *liveness)
        self.bridge = bridge
        self.emit = emit
        self._paused: list[HarnessEvent] | None = None  # a turn's events while ``wake`` holds it
        # The hot path's boundaries, built once (a step passes them for every line).
        self._feeding = _Faults(self, Outcome.PROTOCOL_ERROR, "the adapter's feed()")
        self._reading = _Faults(self, Outcome.HARNESS_CRASHED, "reading its output")
        self._messaging = _Faults(self, Outcome.PROTOCOL_ERROR, "the adapter's message_lines()")
        self._writing = {
            when: _Faults(self, Outcome.HARNESS_CRASHED, f"writing to it {when}")
            for when in ("mid-turn", "during startup", "while interrupting")
        }
        self._sensing = _Faults(
            self, Outcome.BRIDGE_FAILED, "asking the bridge and proxy for signs of life"
        )

    def startup(self, events: list[HarnessEvent]) -> tuple[Outcome, str]:
        """Write the startup lines and wait for readiness; never raises for harness faults.

        Args:
            events: Receives the events seen during startup.

        Returns:
            ``(Outcome.OK, "")`` when ready, else ``(Outcome.STARTUP_FAILED, why)``.
        """
        deadline = time.monotonic() + self.limits.startup_timeout_s
        try:
            with self._faults(Outcome.PROTOCOL_ERROR, "the adapter's startup_lines()"):
                lines = self.session.startup_lines()
            self._write(lines, deadline, "during startup")
            if self.session.ready_at_spawn:
                return Outcome.OK, ""
            watch = _Liveness(self)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return Outcome.STARTUP_FAILED, (
                        f"the harness was not ready within startup_timeout_s="
                        f"{self.limits.startup_timeout_s}s; raise it or check the harness's "
                        "stderr" + self._stderr_suffix()
                    )
                line = watch.read(remaining, "during startup")
                if line is None:
                    continue
                feed = self._take(line, events, deadline)
                if feed.error_type:
                    return Outcome.STARTUP_FAILED, feed.error
                if feed.ready:
                    return Outcome.OK, ""
        except TurnEnded as end:
            end = self._past_limit(end)
            limited = end.outcome is Outcome.RESOURCE_LIMIT
            return Outcome.RESOURCE_LIMIT if limited else Outcome.STARTUP_FAILED, end.message

    def run(self, message: str, episode_deadline: float | None = None) -> TurnResult:
        """Send ``message`` and read until the turn ends; never raises for harness faults.

        Args:
            message: The user message.
            episode_deadline: ``time.monotonic()`` value at which the episode's
                wall budget runs out, or ``None``.
        """
        result = self.run_until_call(message, episode_deadline)
        assert result is not None  # only a ``wake`` pauses a turn
        return result

    @property
    def paused_events(self) -> tuple[HarnessEvent, ...]:
        """The events so far of the turn ``run_until_call`` paused (``()`` if none is)."""
        return tuple(self._paused or ())

    def run_until_call(
        self,
        message: str | None,
        episode_deadline: float | None = None,
        wake: Wake | None = None,
    ) -> TurnResult | None:
        """``run``, pausing where the harness waits on a model call (model mode).

        Args:
            message: The user message; ``None`` goes on with the turn ``wake`` paused.
            episode_deadline: As for ``run``.
            wake: The model endpoint: the turn pauses as soon as it holds a model call
                for the policy. The turn and idle deadlines count from each call, that
                is from each answer delivered.

        Returns:
            The turn's result, or ``None`` when ``wake`` paused it (its events so far
            are kept for the result of a later call).
        """
        events, self._paused = ([], None) if message is not None else (self._paused or [], None)
        start = time.monotonic()
        turn_deadline = start + self.limits.turn_timeout_s
        # Writes wait at most until the turn (or the episode) runs out.
        write_by = (
            turn_deadline if episode_deadline is None else min(turn_deadline, episode_deadline)
        )
        wake_fd = None if wake is None else wake.wake_fd
        try:
            if episode_deadline is not None and start >= episode_deadline:
                return self._timed_out(Outcome.EPISODE_TIMEOUT, events)
            self._check_bridge()
            if message is not None:
                with self._messaging:
                    lines = self.session.message_lines(message)
                self._write(lines, write_by, "mid-turn")
            watch = _Liveness(self, bridge_checked=True)
            deadline = start  # the nearest deadline; recomputed only when reached
            while True:
                if wake is not None and wake.waiting:
                    self._paused = events
                    return None
                now = time.monotonic()
                if now >= deadline:  # the idle deadline moves with activity: look again
                    deadline, kind = self._nearest(start, turn_deadline, episode_deadline)
                    if deadline <= now:
                        return self._timed_out(kind, events)
                line = watch.read(deadline - now, "mid-turn", wake_fd)
                if line is None:
                    continue
                feed = self._take(line, events, write_by)
                if feed.error_type or feed.turn_complete:
                    self._check_bridge()  # a bridge that died mid-turn names the turn's end
                if feed.error_type:
                    return TurnResult(
                        response=feed.response or _texts(events),
                        events=tuple(events),
                        error_type=Outcome(feed.error_type),
                        error=feed.error,
                    )
                if feed.turn_complete:
                    if missing := self._missing_tools():
                        return TurnResult(
                            response=feed.response,
                            events=tuple(events),
                            error_type=Outcome.STARTUP_FAILED,
                            error=missing,
                        )
                    return TurnResult(response=feed.response, events=tuple(events), done=feed.done)
        except TurnEnded as end:
            end = self._past_limit(end)
            # Outcomes no harness line reported (deadlines, a dead bridge) get an event.
            if end.outcome.truncates or end.outcome is Outcome.BRIDGE_FAILED:
                self._record_error(end.outcome, end.message, events)
            return TurnResult(
                response=_texts(events),
                events=tuple(events),
                error_type=end.outcome,
                error=end.message,
            )

    # ----------------------------------------------------------------- the boundary

    def _faults(self, other: Outcome, what: str) -> _Faults:
        """The fault boundary (see the module docstring): faults become ``TurnEnded``.

        Args:
            other: The outcome of an exception this boundary has no rule for.
            what: The call, as a message names it ("the adapter's feed()").
        """
        return _Faults(self, other, what)

    def _outcome_of(self, exc: Exception, other: Outcome, what: str) -> TurnEnded:
        """The mapping of the fault boundary, one rule per kind of fault."""
        if isinstance(exc, HarnessCrashed):
            return TurnEnded(
                Outcome.HARNESS_CRASHED, self._exit_account(f"was gone while we were {what}")
            )
        if isinstance(exc, TurnTimeout):
            return TurnEnded(
                Outcome.TURN_TIMEOUT,
                f"the harness did not read its stdin before the turn's deadline "
                f"(turn_timeout_s={self.limits.turn_timeout_s}): {exc.message}",
            )
        if isinstance(exc, ProtocolError):
            return TurnEnded(Outcome.PROTOCOL_ERROR, exc.message)
        if isinstance(exc, BridgeError):
            return TurnEnded(Outcome.BRIDGE_FAILED, exc.message)
        if isinstance(exc, OSError):
            return TurnEnded(
                Outcome.HARNESS_CRASHED,
                self._exit_account(f"was gone while we were {what} ({exc})"),
            )
        # An adapter choking on a line is a protocol error of the harness; the
        # traceback is logged so that a bug of ours stays visible.
        _log.warning("%s raised; the turn ends as %s", what, other.value, exc_info=exc)
        return TurnEnded(other, f"{what} raised {type(exc).__name__}: {exc}")

    def _take(self, line: str, events: list[HarnessEvent], write_by: float) -> Feed:
        # The boundary of ``self._feeding``, spelled out: this runs for every line.
        try:
            feed = self.session.feed(line)
            if feed.error_type:
                Outcome(feed.error_type)  # an adapter's unknown outcome name is its own fault
        except TurnEnded:
            raise
        except Exception as exc:
            raise self._outcome_of(exc, self._feeding.other, self._feeding.what) from exc
        if feed.events:
            events.extend(feed.events)
            for event in feed.events:
                self.emit(event)
        if feed.replies:
            self._write(feed.replies, write_by, "mid-turn")
        return feed

    def _write(self, lines: Sequence[str], deadline: float, when: str) -> None:
        faults = self._writing.get(when) or self._faults(
            Outcome.HARNESS_CRASHED, f"writing to it {when}"
        )
        with faults:
            for line in lines:
                self.proc.write_line(line, deadline=deadline)

    def _crash(self, what: str) -> NoReturn:
        raise TurnEnded(Outcome.HARNESS_CRASHED, self._exit_account(what))

    # ----------------------------------------------------------------- internals

    def _missing_tools(self) -> str:
        """After a turn: the session's tool check, "" when the env tools are loaded."""
        with self._faults(Outcome.PROTOCOL_ERROR, "the adapter's missing_tools()"):
            return self.session.missing_tools(self._tools_listed)

    def _tools_listed(self) -> bool:
        """Whether the harness has listed the env tools over MCP (asked of the bridge)."""
        with self._faults(Outcome.BRIDGE_FAILED, "asking the bridge for the tool listing"):
            return self.bridge is not None and self.bridge.tools_listed

    def _nearest(
        self, start: float, turn_deadline: float, episode_deadline: float | None
    ) -> tuple[float, Outcome]:
        idle = self._idle_deadline(start)
        nearest = min((turn_deadline, Outcome.TURN_TIMEOUT), (idle, Outcome.IDLE_TIMEOUT))
        if episode_deadline is not None and episode_deadline < nearest[0]:
            return episode_deadline, Outcome.EPISODE_TIMEOUT
        return nearest

    def _idle_deadline(self, turn_start: float) -> float:
        last = turn_start
        with self._sensing:
            for source in self.sources:
                if source.busy:  # a tool call is running: the harness is waiting on us
                    return time.monotonic() + self.limits.idle_timeout_s
                last = max(last, source.last_activity)
        return last + self.limits.idle_timeout_s

    def _timed_out(self, kind: Outcome, events: list[HarnessEvent]) -> TurnResult:
        limit = {
            Outcome.TURN_TIMEOUT: f"turn_timeout_s={self.limits.turn_timeout_s}",
            Outcome.IDLE_TIMEOUT: f"idle_timeout_s={self.limits.idle_timeout_s} without output",
            Outcome.EPISODE_TIMEOUT: f"episode_timeout_s={self.limits.episode_timeout_s}",
        }[kind]
        # The turn is over whatever happens now: a fault while interrupting (stdin
        # full, a crash, a bad line) only ends the wind-down early.
        grace = time.monotonic() + self.limits.interrupt_grace_s
        with contextlib.suppress(TurnEnded):
            with self._faults(Outcome.PROTOCOL_ERROR, "the adapter's interrupt_lines()"):
                interrupt = self.session.interrupt_lines()
            if interrupt:
                self._write(interrupt, grace, "while interrupting")
                while (remaining := grace - time.monotonic()) > 0:
                    with self._faults(Outcome.HARNESS_CRASHED, "reading its output"):
                        line = self.proc.read_line(remaining)
                    if line is None and self.proc.eof:
                        break
                    if line is not None and self._take(line, events, grace).turn_complete:
                        break
        message = f"the turn ran past {limit}"
        self._record_error(kind, message, events)
        return TurnResult(
            response=_texts(events), events=tuple(events), error_type=kind, error=message
        )

    def _check_bridge(self) -> None:
        """End the turn as ``bridge_failed`` if the env's MCP bridge died."""
        if self.bridge is not None and (why := self.bridge.failure):
            raise TurnEnded(Outcome.BRIDGE_FAILED, why)

    def _record_error(self, kind: Outcome, message: str, events: list[HarnessEvent]) -> None:
        """Add an ``error`` event for an outcome the env decided (a timeout)."""
        event = HarnessEvent(EventType.ERROR, {"error_type": kind.value, "message": message})
        events.append(event)
        self.emit(event)

    def _past_limit(self, end: TurnEnded) -> TurnEnded:
        """A crash the keeper caused by ending a tree past its limit is ``resource_limit``."""
        limit = self.proc.limit if end.outcome is Outcome.HARNESS_CRASHED else ""
        if not limit:
            return end
        message = f"the harness's tree went past {limit}, so it was ended ({end.message})"
        return TurnEnded(Outcome.RESOURCE_LIMIT, message)

    def _exit_account(self, what: str) -> str:
        deadline = time.monotonic() + EXIT_WAIT_S
        while self.proc.returncode is None and time.monotonic() < deadline:
            time.sleep(0.01)
        code = self.proc.returncode
        status = "closed its output but is still running" if code is None else f"exit code {code}"
        return f"the harness {what} ({status})" + self._stderr_suffix()

    def _stderr_suffix(self) -> str:
        tail = self.proc.stderr_tail()
        return f"{STDERR_SUFFIX}{tail}" if tail else ""


class _Faults:
    """One call site of the fault boundary: maps what the call raised to ``TurnEnded``.

    A plain class, not ``contextlib.contextmanager``: it wraps every line of every
    turn, and entering it must cost next to nothing. Stateless, so reusable.
    """

    __slots__ = ("other", "runner", "what")

    def __init__(self, runner: TurnRunner, other: Outcome, what: str) -> None:
        self.runner, self.other, self.what = runner, other, what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is None or isinstance(exc, TurnEnded) or not isinstance(exc, Exception):
            return  # KeyboardInterrupt and friends pass through (the env handles them)
        raise self.runner._outcome_of(exc, self.other, self.what) from exc


class _Liveness:
    """Reads lines for one turn (or the startup) and notices the harness's end.

    The harness has ended when its output closed, or when the process we started
    exited: then what it wrote before it died is still read (for at most
    ``EXIT_DRAIN_S``: a descendant holding stdout may keep writing), and the turn
    ends as ``harness_crashed``, unless those lines finished the turn.
    """

    def __init__(self, runner: TurnRunner, *, bridge_checked: bool = False) -> None:
        self.runner = runner
        self.next_check = time.monotonic()
        self.exited_at: float | None = None
        # The caller looked at the bridge just now: the first look here would repeat it.
        self.skip_bridge = bridge_checked

    def read(self, timeout_s: float, when: str, wake_fd: int | None = None) -> str | None:
        """The next line within ``timeout_s`` (``None`` if none came, or ``wake_fd`` became
        readable); ends the turn if the harness is dead."""
        runner, proc = self.runner, self.runner.proc
        now = time.monotonic()
        if self.exited_at is None and now >= self.next_check:
            self.next_check = now + LIVENESS_S
            if proc.returncode is not None:
                self.exited_at = now
            if self.skip_bridge:
                self.skip_bridge = False
            else:  # the harness may be waiting on a tool call that never ends
                runner._check_bridge()
        if self.exited_at is not None:
            timeout_s = 0.0
            if now - self.exited_at > EXIT_DRAIN_S:
                runner._crash(f"exited {when}")
        try:  # the boundary of ``runner._reading``, spelled out: this runs for every line
            line = proc.read_line(max(0.0, min(timeout_s, self.next_check - now)), wake_fd)
        except Exception as exc:
            reading = runner._reading
            raise runner._outcome_of(exc, reading.other, reading.what) from exc
        if line is None and (proc.eof or self.exited_at is not None):
            runner._crash(f"exited {when}")
        return line


def _texts(events: list[HarnessEvent]) -> str:
    return "".join(
        str(e.data.get("text", ""))
        for e in events
        if e.type is EventType.TEXT and e.data.get("text")
    )
