"""TurnRunner: drive one harness process through startup and turns, under deadlines.

The runner owns the loop that reads the harness's output lines, hands each to
the adapter (``Harness.feed``), writes the adapter's replies back, and ends a
turn on ``turn_complete``, an adapter-reported error, end of output (a crash),
or a deadline (turn, idle, episode). It runs in the caller's thread; it never
raises for harness faults.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gym_harness.config import HarnessConfig
from gym_harness.errors import HarnessCrashed
from gym_harness.events import EventType, HarnessEvent, TurnResult
from gym_harness.harnesses.base import Feed, Harness
from gym_harness.outcome import Outcome

if TYPE_CHECKING:
    from gym_harness.bridge import MCPBridge
    from gym_harness.capture import ModelProxy
    from gym_harness.process import HarnessProcess

__all__ = ["TurnRunner", "end_flags"]

#: How long an interrupted turn may take to wind down before the tree is stopped.
INTERRUPT_GRACE_S = 1.0
#: How long to wait for an exit code once the harness closed its output.
EXIT_WAIT_S = 1.0
#: How often a waiting turn checks that the env's MCP bridge is still alive.
BRIDGE_CHECK_S = 0.5


def end_flags(result: TurnResult) -> tuple[bool, bool]:
    """Return ``(terminated, truncated)`` for a turn's result (the outcome table)."""
    outcome = Outcome(result.error_type)
    if outcome.truncates:
        return False, True
    if outcome.terminates:
        return True, False
    return result.done, False


class TurnRunner:
    """Runs the startup handshake and the turns of one harness process.

    Args:
        harness: The adapter (already ``launch``-ed for this episode).
        proc: The started harness process.
        config: The config the process was spawned with (timeouts).
        bridge: The env's MCP bridge; its tool calls count as signs of life.
        emit: Called with every event as soon as it is parsed.
        proxy: The env's model proxy, if it captures; model traffic counts as life.
        tool_names: The env tools served this episode (for the bridge tool check).
    """

    def __init__(
        self,
        harness: Harness,
        proc: HarnessProcess,
        config: HarnessConfig,
        bridge: MCPBridge | None,
        emit: Callable[[HarnessEvent], None],
        proxy: ModelProxy | None = None,
        tool_names: tuple[str, ...] = (),
    ) -> None:
        self.harness = harness
        self.proxy = proxy
        self._unconfirmed = tool_names if harness.confirm_tools_via_bridge else ()
        self.proc = proc
        self.config = config
        self.bridge = bridge
        self.emit = emit

    def startup(self, events: list[HarnessEvent]) -> tuple[str, str]:
        """Write the startup lines and wait for readiness.

        Args:
            events: Receives the events seen during startup.

        Returns:
            ``("", "")`` when ready, else ``("startup_failed", why)``.
        """
        if not self._write(self.harness.startup_lines()):
            return "startup_failed", self._exit_account("exited during startup")
        if self.harness.ready_on_spawn:
            return "", ""
        deadline = time.monotonic() + self.config.startup_timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "startup_failed", (
                    f"the harness was not ready within startup_timeout_s="
                    f"{self.config.startup_timeout_s}s; raise it or check the harness's stderr"
                    + self._stderr_suffix()
                )
            line = self.proc.read_line(remaining)
            if line is None:
                if self.proc.eof:
                    return "startup_failed", self._exit_account("exited during startup")
                continue
            feed = self._take(line, events)
            if feed.error_type:
                return "startup_failed", feed.error
            if feed.ready:
                return "", ""

    def run(self, message: str, episode_deadline: float | None = None) -> TurnResult:
        """Send ``message`` and read until the turn ends; never raises for harness faults.

        Args:
            message: The user message.
            episode_deadline: ``time.monotonic()`` value at which the episode's
                wall budget runs out, or ``None``.
        """
        events: list[HarnessEvent] = []
        start = time.monotonic()
        if episode_deadline is not None and start >= episode_deadline:
            return self._timed_out("episode_timeout", events)
        if why := self._bridge_down():
            return self._bridge_failed(why, events)
        if not self._write(self.harness.message_lines(message)):
            return self._crashed(events)
        turn_deadline = start + self.config.turn_timeout_s
        deadline = start  # the nearest deadline; recomputed only when reached
        while True:
            now = time.monotonic()
            if now >= deadline:  # the idle deadline moves with activity: look again
                deadline, kind = self._nearest(start, turn_deadline, episode_deadline)
                if deadline <= now:
                    return self._timed_out(kind, events)
            line = self.proc.read_line(min(deadline - now, BRIDGE_CHECK_S))
            if line is None:
                if self.proc.eof:
                    return self._crashed(events)
                if why := self._bridge_down():
                    return self._bridge_failed(why, events)
                continue
            feed = self._take(line, events)
            if (feed.error_type or feed.turn_complete) and (why := self._bridge_down()):
                return self._bridge_failed(why, events)
            if feed.error_type:
                return TurnResult(
                    response=feed.response or _texts(events),
                    events=tuple(events),
                    error_type=feed.error_type,
                    error=feed.error,
                )
            if feed.turn_complete:
                if missing := self._missing_tools():
                    return TurnResult(
                        response=feed.response,
                        events=tuple(events),
                        error_type="startup_failed",
                        error=missing,
                    )
                return TurnResult(response=feed.response, events=tuple(events), done=feed.done)

    # ----------------------------------------------------------------- internals

    def _take(self, line: str, events: list[HarnessEvent]) -> Feed:
        feed = self.harness.feed(line)
        if feed.events:
            events.extend(feed.events)
            for event in feed.events:
                self.emit(event)
        if feed.replies:
            self._write(feed.replies)
        return feed

    def _write(self, lines: Sequence[str]) -> bool:
        try:
            for line in lines:
                self.proc.write_line(line)
        except HarnessCrashed:
            return False
        return True

    def _missing_tools(self) -> str:
        """After a turn: "" once the harness has listed the env tools over MCP, else why not."""
        if not self._unconfirmed or (self.bridge is not None and self.bridge.tools_listed):
            self._unconfirmed = ()
            return ""
        return (
            f"the harness never listed the env tools {list(self._unconfirmed)} over MCP "
            "during its first turn: its MCP server configuration was dropped or broken"
        )

    def _nearest(
        self, start: float, turn_deadline: float, episode_deadline: float | None
    ) -> tuple[float, str]:
        nearest = min((turn_deadline, "turn_timeout"), (self._idle_deadline(start), "idle_timeout"))
        if episode_deadline is not None and episode_deadline < nearest[0]:
            return episode_deadline, "episode_timeout"
        return nearest

    def _idle_deadline(self, turn_start: float) -> float:
        last = max(turn_start, self.proc.last_activity)
        bridge = self.bridge
        if bridge is not None:
            if bridge.in_flight > 0:  # a tool call is running: the harness is waiting on us
                return time.monotonic() + self.config.idle_timeout_s
            last = max(last, bridge.last_activity)
        if self.proxy is not None:
            last = max(last, self.proxy.last_activity)
        return last + self.config.idle_timeout_s

    def _timed_out(self, kind: str, events: list[HarnessEvent]) -> TurnResult:
        limit = {
            "turn_timeout": f"turn_timeout_s={self.config.turn_timeout_s}",
            "idle_timeout": f"idle_timeout_s={self.config.idle_timeout_s} without output",
            "episode_timeout": f"episode_timeout_s={self.config.episode_timeout_s}",
        }[kind]
        interrupt = self.harness.interrupt_lines()
        if interrupt and self._write(interrupt):
            deadline = time.monotonic() + min(INTERRUPT_GRACE_S, self.config.stop_grace_s)
            while (remaining := deadline - time.monotonic()) > 0:
                line = self.proc.read_line(remaining)
                if line is None and self.proc.eof:
                    break
                if line is not None and self._take(line, events).turn_complete:
                    break
        message = f"the turn ran past {limit}"
        event = _error_event(kind, message)
        events.append(event)
        self.emit(event)
        return TurnResult(
            response=_texts(events), events=tuple(events), error_type=kind, error=message
        )

    def _bridge_down(self) -> str:
        return self.bridge.failure if self.bridge is not None else ""

    def _bridge_failed(self, why: str, events: list[HarnessEvent]) -> TurnResult:
        event = _error_event(Outcome.BRIDGE_FAILED.value, why)
        events.append(event)
        self.emit(event)
        return TurnResult(
            response=_texts(events),
            events=tuple(events),
            error_type=Outcome.BRIDGE_FAILED.value,
            error=why,
        )

    def _crashed(self, events: list[HarnessEvent]) -> TurnResult:
        error = self._exit_account("exited mid-turn")
        return TurnResult(
            response=_texts(events), events=tuple(events), error_type="harness_crashed", error=error
        )

    def _exit_account(self, what: str) -> str:
        deadline = time.monotonic() + EXIT_WAIT_S
        while self.proc.returncode is None and time.monotonic() < deadline:
            time.sleep(0.01)
        code = self.proc.returncode
        status = "closed its output but is still running" if code is None else f"exit code {code}"
        return f"the harness {what} ({status})" + self._stderr_suffix()

    def _stderr_suffix(self) -> str:
        tail = self.proc.stderr_tail()
        return f"; stderr tail:\n{tail}" if tail else ""


def _error_event(kind: str, message: str) -> HarnessEvent:
    """An ``error`` event recording an outcome the env decided (a timeout)."""
    return HarnessEvent(EventType.ERROR, {"error_type": kind, "message": message})


def _texts(events: list[HarnessEvent]) -> str:
    return "".join(
        str(e.data.get("text", ""))
        for e in events
        if e.type is EventType.TEXT and e.data.get("text")
    )
