"""BFCL's own multi-turn checker, run on the calls a harness made.

:func:`check` hands BFCL's ``multi_turn_checker`` the calls of each turn (one step per
call, as BFCL's decoder gives them) and the task's ground truth. The checker executes
both on fresh instances of BFCL's backends, turn by turn, and compares the backends'
state and the results of the calls after each turn whose ground truth has calls; its
verdict (valid or not, the error type, the message) becomes a :class:`Verdict`, with the
turn where it failed.

``bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker`` imports only its sibling
``multi_turn_utils`` and ``bfcl_eval.constants.executable_backend_config``, which use the
standard library alone (the package ``__init__`` files are empty), so it is imported
as usual, on first use. The checker keeps the instances it makes in
``multi_turn_utils``'s module globals, keyed by model name and task id, and reuses them
when they are there: each check runs under a model name of its own and removes its
instances afterwards, so a rerun of a task starts afresh and the globals stay bounded.

Threads: any; checks run under one lock (they share those module globals).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gym_harness.suites.bfcl.data import BFCLTask

__all__ = ["FORCE_TERMINATED", "Verdict", "check", "force_terminated"]

#: BFCL's error type for an entry whose turns did not all run.
FORCE_TERMINATED = "multi_turn:force_terminated"
_TURN = re.compile(r"\bturn (\d+)\b")
_LOCK = threading.Lock()
#: Longest checker message kept (the state diffs of a long-context task are large).
MAX_MESSAGE = 2000


@dataclass(frozen=True)
class Verdict:
    """What BFCL's checker said.

    Attributes:
        valid: Every checked turn matched the ground truth.
        error_type: The checker's error type (``"multi_turn:instance_state_mismatch"``,
            ``"multi_turn:execution_response_mismatch"``,
            ``"multi_turn:empty_turn_model_response"``, :data:`FORCE_TERMINATED`) or ``""``.
        error: The checker's message, with its details when short ("" when valid).
        turn: The turn (from 0) where it failed, ``-1`` when valid.
    """

    valid: bool
    error_type: str = ""
    error: str = ""
    turn: int = -1

    def to_dict(self) -> dict[str, Any]:
        """The verdict as ``info["bfcl"]`` carries it."""
        return {
            "valid": self.valid,
            "error_type": self.error_type,
            "error": self.error,
            "failed_turn": self.turn,
        }


def check(task: BFCLTask, calls: Sequence[Sequence[str]], turns: int | None = None) -> Verdict:
    """Run BFCL's multi-turn checker on ``calls`` against ``task``'s ground truth.

    Args:
        task: The task.
        calls: The call strings the harness made, per turn (missing turns count as
            turns without calls).
        turns: Check only the first ``turns`` turns (the turns done so far); all of them
            when ``None``.

    Returns:
        The checker's verdict; a checker that raised is an invalid verdict saying why.
    """
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils

    count = len(task.ground_truth) if turns is None else min(turns, len(task.ground_truth))
    decoded = [[[call] for call in calls[i]] if i < len(calls) else [] for i in range(count)]
    truth = [list(task.ground_truth[i]) for i in range(count)]
    model_name = f"gym_harness_{uuid.uuid4().hex}"
    with _LOCK:
        try:
            result = multi_turn_checker.multi_turn_checker(
                decoded, truth, task.entry, f"multi_turn_{task.category}", model_name
            )
        except Exception as exc:  # an assertion of the checker's, a backend's failure
            return Verdict(False, "checker_error", f"{type(exc).__name__}: {exc}"[:MAX_MESSAGE])
        finally:
            for name in [n for n in vars(multi_turn_utils) if n.startswith(model_name)]:
                del vars(multi_turn_utils)[name]
    if result.get("valid"):
        return Verdict(True)
    message = str(result.get("error_message", ""))
    found = _TURN.search(message)
    executed = (result.get("details") or {}).get("execution_result") or result.get(
        "execution_result"
    )
    turn = int(found.group(1)) if found else (len(executed) - 1 if executed else count - 1)
    detail = result.get("details")
    text = message if detail is None else f"{message} {_short(detail)}"
    return Verdict(False, str(result.get("error_type", "")), text[:MAX_MESSAGE], turn)


def _short(detail: Any) -> str:
    if isinstance(detail, dict):
        kept = {k: v for k, v in detail.items() if "state" not in k and k != "execution_result"}
        return repr(kept)
    return repr(detail)


def force_terminated(task: BFCLTask, turns_done: int) -> Verdict:
    """The verdict of an episode that ended after ``turns_done`` of the task's turns, as
    BFCL's evaluation gives an entry whose inference stopped early."""
    return Verdict(
        False,
        FORCE_TERMINATED,
        f"The episode ended after {turns_done} of the task's {len(task.turns)} turns.",
        turns_done,
    )
