"""Model mode's fork: a fresh harness, answered with the parent's recorded completions.

Every answer the parent's harness got came from the env, so a child is made by starting
the same harness on the same task in a fresh workspace and answering each of its model
calls with the parent's completion for that call, at once and without the policy (side
calls are answered as usual), until it makes the call the parent holds: that request is
the child's observation. The harness re-runs its own tools and the env's along the way,
so the workspace is rebuilt by the same actions (a tool call's path into the parent's
episode directory is made the child's). User messages after the first are the
parent's, in order; once they are spent the child's ``user_fn`` is the parent's.

Each replayed request is compared with the recorded one (messages and tools; the
episode's own directory is the same path for this comparison, since every episode has
its own; what the adapter's ``replay_noise`` matches, such as a tool's wall time, does
not count). The first difference (a tool whose output changed, a timestamp in a prompt)
is reported, and with ``strict`` raises :class:`~gym_harness.errors.ForkDiverged`.

Threads: the caller's thread only.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_harness.errors import ForkDiverged, ForkUnsupported
from gym_harness.fork.parent import Forkable, Inherited, Parent

if TYPE_CHECKING:
    from gym_harness.model.action import Completion
    from gym_harness.modes.base import HeldCall
    from gym_harness.records.calls import ModelCall
    from gym_harness.records.trajectory import Trajectory

__all__ = ["ScriptedUser", "action_of", "difference", "replay"]

#: What CLIs make a dash when they name a directory after a path.
_DASHES = re.compile(r"[^A-Za-z0-9]")
#: How many characters of each side of a difference the report quotes.
QUOTE = 200


class ScriptedUser:
    """The child's ``user_fn``: the parent's later user messages in order, then the parent's
    own ``user_fn`` (or the end of the episode without one)."""

    def __init__(
        self, messages: Sequence[str], then: Callable[[Trajectory], str | None] | None
    ) -> None:
        self.messages = list(messages)
        self.then = then

    def __call__(self, trajectory: Trajectory) -> str | None:
        if self.messages:
            return self.messages.pop(0)
        return None if self.then is None else self.then(trajectory)


def action_of(completion: Completion, parent_dir: str = "", child_dir: str = "") -> str:
    """``completion`` as the action that gives it again: the same tool-call ids (so the
    harness's next request is the same too), and ``parent_dir`` (the parent episode's
    directory, in a tool call's absolute path) made ``child_dir``."""
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in completion.tool_calls]
    message = {"content": completion.content, "stop_reason": completion.stop_reason}
    text = json.dumps({**message, "tool_calls": calls} if calls else message, ensure_ascii=False)
    return _swap(text, parent_dir, child_dir) if parent_dir else text


def answered(parent: Parent, all_calls: bool) -> list[ModelCall]:
    """The parent's calls the policy answered (its steps), in order.

    Raises:
        ForkUnsupported: A step's record lost its request or answer to the endpoint's byte
            bound, so it cannot be replayed.
    """
    steps = []
    for call in parent.trajectory.calls:
        if call.side and not all_calls:
            continue
        if call.truncated:
            raise ForkUnsupported(
                f"model call {call.seq} of episode {parent.trajectory.episode_id} lost its "
                "record to the endpoint's max_record_bytes, so the episode cannot be replayed; "
                "fork earlier, or keep smaller requests."
            )
        if call.completion is not None and call.observation is not None:
            steps.append(call)
    return steps


def difference(
    parent: Any, child: Any, parent_dir: str, child_dir: str, noise: tuple[str, ...] = ()
) -> str:
    """Where ``child``'s request differs from ``parent``'s (messages, then tools), or ``""``;
    what the ``noise`` patterns match (``Harness.replay_noise``) does not count."""
    for key in ("messages", "tools"):
        want, got = parent.get(key) or [], child.get(key) or []
        for index in range(max(len(want), len(got))):
            mine = _text(want[index]) if index < len(want) else "(none)"
            theirs = _text(got[index]) if index < len(got) else "(none)"
            theirs = _swap(theirs, child_dir, parent_dir)
            if _quiet(mine, noise) != _quiet(theirs, noise):
                at = next(
                    (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
                    min(len(mine), len(theirs)),
                )
                return (
                    f"{key}[{index}] from character {at}: the parent's {_quote(mine, at)}, "
                    f"the child's {_quote(theirs, at)}"
                )
    return ""


def replay(
    parent: Parent, held: HeldCall, directory: Path, strict: bool
) -> tuple[Forkable, str, dict[str, Any]]:
    """Fork a model-mode episode by replay (see the module's docstring).

    Args:
        parent: The episode.
        held: Where it stands: the call the policy holds, the turn's user message.
        directory: The episode's directory (its path in requests stands for the child's).
        strict: Raise ``ForkDiverged`` at the first request that differs.

    Raises:
        ForkUnsupported: A record needed for the replay is missing; nothing started.
        ForkDiverged: The child ended or made no call before the parent's call, or, with
            ``strict``, a request differed; the child is closed.
    """
    if held.observation is None:
        raise ForkUnsupported(
            f"episode {parent.trajectory.episode_id} holds no model call to fork at (its "
            "harness did not start, or ended its turn): step() to see what happened."
        )
    steps = answered(parent, held.all_calls)
    targets = [*(call.observation for call in steps), held.observation]
    messages = [turn.message for turn in parent.trajectory.turns]
    later = [*messages[1:], held.message] if messages else []
    started = time.monotonic()
    inherited = Inherited(ScriptedUser(later, parent.user_fn), parent.trajectory, len(steps))
    child, adopt = parent.spawn(inherited)
    first: tuple[int, str] | None = None
    try:
        obs, info = child.reset(options=parent.options)
        child_dir, noise = str(_episode_dir(child)), parent.harness.replay_noise
        for index, target in enumerate(targets):
            if index:
                completion = steps[index - 1].completion
                assert completion is not None  # answered() keeps answered calls only
                action = action_of(completion, str(directory), child_dir)
                obs, _, terminated, truncated, info = child.step(action)
                if terminated or truncated:
                    raise _ended(parent, index + 1, info)
            seen = json.loads(obs)
            if not seen.get("request_id"):
                raise _ended(parent, index + 1, info)
            what = difference(target, seen, str(directory), child_dir, noise)
            if what and first is None:
                first = (index + 1, what)
                if strict:
                    raise ForkDiverged(
                        f"the fork of episode {parent.trajectory.episode_id} diverged at model "
                        f"call {index + 1}: {what}. Replay is exact only when the harness and the "
                        'env\'s tools answer the same way twice (README, "Forking").'
                    )
    except BaseException:
        child.close()
        raise
    took = time.monotonic() - started
    adopt(took)
    info["fork"] = {
        "method": "replay",
        "parent": parent.trajectory.episode_id,
        "step": len(steps),
        "replayed": len(targets),
        "diverged_at": None if first is None else first[0],
        "difference": "" if first is None else first[1],
        "elapsed_s": took,
    }
    return child, obs, info


def _ended(parent: Parent, call: int, info: dict[str, Any]) -> ForkDiverged:
    why = info.get("error_type") or "done"
    return ForkDiverged(
        f"the fork of episode {parent.trajectory.episode_id} could not reach model call {call}: "
        f"the child's harness ended its episode instead ({why}: {info.get('error', '')}). "
        "Its requests differed from the parent's; see info['fork'] of a non-strict fork."
    )


def _episode_dir(child: Forkable) -> Path:
    workspace = child.workspace
    assert workspace is not None  # reset made it
    return workspace.parent


def _quiet(text: str, noise: tuple[str, ...]) -> str:
    for pattern in noise:
        text = re.sub(pattern, "", text)
    return text


def _swap(text: str, old_dir: str, new_dir: str) -> str:
    """``text`` (JSON) with the episode directory ``old_dir`` made ``new_dir``: as a path,
    and in the dashed form CLIs name a project's directory by (Claude Code's
    ``-tmp-x-workspace``)."""
    for old, new in ((old_dir, new_dir), (_DASHES.sub("-", old_dir), _DASHES.sub("-", new_dir))):
        text = text.replace(_in_json(old), _in_json(new))
    return text


def _in_json(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _quote(text: str, at: int) -> str:
    """``text`` around character ``at`` (where two texts part), at most ``QUOTE`` of it."""
    start = max(0, at - QUOTE // 4)
    part = text[start : start + QUOTE]
    return f"{'...' if start else ''}{part!r}{'...' if start + QUOTE < len(text) else ''}"
