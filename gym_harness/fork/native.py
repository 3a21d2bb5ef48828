"""Turn mode's fork: a copy of the episode's directories, and the harness resuming its session.

The harness's model is not the env's in turn mode, so nothing can be replayed: the child
starts from a copy of the parent's workspace and private home (copy-on-write where the
filesystem can), and its harness resumes a fork of the session it saved there, by the
harness's own mechanism (its adapter's ``Harness.fork_session`` says what that needs;
``Harness.forked`` makes the launch that resumes it). A harness without one, or an
episode whose directories hold more than ``max_fork_bytes``, raises ``ForkUnsupported``
before anything starts.

The parent's harness is not paused for the copy: between turns it waits for its next
message, and whatever it does meanwhile the copy is safe (``utils/trees.py``: no link
followed at any depth, at most ``max_fork_bytes`` copied, counted as they are). A copy
that cannot finish (the tree grew past the bound, an entry vanished or became a link,
a full disk) raises ``ForkFailed`` with the cause, and the child is closed.

Threads: the caller's thread only.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gym_harness.errors import ForkFailed, ForkUnsupported, HarnessStartError
from gym_harness.fork.parent import Forkable, Inherited, Parent
from gym_harness.harnesses.base import ForkOrigin
from gym_harness.utils.trees import MAX_ENTRIES, tree_size

__all__ = ["resume"]


def resume(parent: Parent, directory: Path) -> tuple[Forkable, str, dict[str, Any]]:
    """Fork a turn-mode episode by resuming a copy of its session.

    Returns:
        ``(child, observation, info)``: the observation is the parent's last reply (the
        task's prompt before any turn); ``info`` is the child's reset's, with ``"fork"``.

    Raises:
        ForkUnsupported: The harness has no way to resume a copy of its session (the
            message names it and what it lacks), or the episode's workspace and home
            hold more than ``max_fork_bytes`` (or one of them more than
            ``utils.trees.MAX_ENTRIES`` entries); nothing started.
        ForkFailed: The copy of the workspace and home stopped (the message says where
            and why), or the child's episode directories could not be made (a full
            disk); the child was closed.
    """
    started = time.monotonic()
    before = parent.trajectory
    state = parent.harness.fork_session(parent.session)
    limit = parent.max_fork_bytes
    size = tree_size([directory / "workspace", directory / "home"], limit)
    if size.bytes > limit:
        raise ForkUnsupported(
            f"episode {before.episode_id}'s workspace and home hold more than "
            f"max_fork_bytes={limit} bytes (at least {size.bytes}), which a fork of it would "
            "copy: raise max_fork_bytes, or fork in mode='model' (replay copies nothing)."
        )
    if size.entries > MAX_ENTRIES:
        raise ForkUnsupported(
            f"episode {before.episode_id}'s workspace or home holds more than {MAX_ENTRIES} "
            "entries (files, directories, links), more than a fork copies: fork before the "
            "harness makes so many, or fork in mode='model' (replay copies nothing)."
        )
    origin = ForkOrigin(before.episode_id, directory, state, limit)
    child, adopt = parent.spawn(Inherited(parent.user_fn, before, len(before.turns), origin))
    try:  # an env starts nothing before its reset; its first launch resumes ``origin``
        _, info = child.reset(options=parent.options)
    except HarnessStartError as exc:  # its directories could not be made (a full disk)
        child.close()
        raise ForkFailed(f"could not make the fork's episode: {exc.message}") from exc
    except BaseException:
        child.close()
        raise
    took = time.monotonic() - started
    adopt(took)
    task = before.task or {}
    reply = before.turns[-1].response if before.turns else str(task.get("prompt", ""))
    info["fork"] = {
        "method": "native",
        "parent": before.episode_id,
        "step": len(before.turns),
        "replayed": 0,
        "diverged_at": None,
        "difference": "",
        "elapsed_s": took,
    }
    return child, reply, info
