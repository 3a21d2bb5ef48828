"""start_ready: start a bare HarnessProcess and wait for its ready line.

The env waits for a harness to become ready with ``TurnRunner.startup``. A process
used on its own (tests, benchmarks) takes that same path here, through an adapter
whose only rule is a predicate on each stdout line, so readiness has one
implementation: deadlines, an exit or a closed stdout during startup are noticed
the same way for both.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING

from gym_harness.config import TurnLimits
from gym_harness.errors import HarnessStartError
from gym_harness.harnesses.base import Feed, HarnessSession
from gym_harness.outcome import Outcome
from gym_harness.turn import STDERR_SUFFIX, TurnRunner

if TYPE_CHECKING:
    from gym_harness.process.harness_process import HarnessProcess

__all__ = ["start_ready"]


def start_ready(
    proc: HarnessProcess, ready: Callable[[str], bool], *, timeout_s: float = 60.0
) -> None:
    """Start ``proc`` and return once a stdout line satisfies ``ready``.

    The line that satisfies ``ready`` and every line before it are consumed;
    later lines stay for ``read_line``.

    Args:
        proc: A process not started yet.
        ready: Predicate on each stdout line.
        timeout_s: How long the harness may take (the runner's ``startup_timeout_s``).

    Raises:
        HarnessStartError: The command could not be started; or it exited, closed
            its stdout or stayed silent past ``timeout_s`` before a ready line (it
            is stopped: nothing of it is left running); or ``proc`` was started before.

    Example:
        >>> proc = HarnessProcess(ProcessSpec(command=["agent"]))  # doctest: +SKIP
        >>> start_ready(proc, lambda line: line == "ready", timeout_s=10)  # doctest: +SKIP
    """
    proc.start()
    runner = TurnRunner(
        _ReadyLine(ready), proc, TurnLimits(startup_timeout_s=timeout_s), None, _drop
    )
    try:
        outcome, why = runner.startup([])
    except BaseException:  # KeyboardInterrupt: startup() turns every Exception into an outcome
        proc.stop()
        raise
    if outcome is Outcome.OK:
        return
    pid = proc.pid
    proc.stop()  # joins the stderr reader: the tail below is whole
    command = shlex.join(proc.spec.command)
    raise HarnessStartError(
        f"Harness `{command[:120]}` (pid {pid}) did not become ready: "
        f"{why.split(STDERR_SUFFIX, 1)[0]}. It was stopped. See its stderr tail; run the "
        "command by hand in its cwd to reproduce, or raise the startup timeout if it is slow.",
        exit_code=proc.exit_code,
        stderr_tail=proc.stderr_tail(),
        pid=pid,
    )


class _ReadyLine(HarnessSession):
    """The session of a bare process: a line is ready or it is not; nothing else is said."""

    def __init__(self, ready: Callable[[str], bool]) -> None:
        self.ready = ready

    def message_lines(self, text: str) -> list[str]:
        return [text]

    def feed(self, line: str) -> Feed:
        return Feed(ready=bool(self.ready(line)))


def _drop(event: object) -> None:
    return None
