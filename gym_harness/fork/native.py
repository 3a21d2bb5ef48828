"""Turn mode's fork: a copy of the episode's directories, and the harness resuming its session.

The harness's model is not the env's in turn mode, so nothing can be replayed: the child
starts from a copy of the parent's workspace and private home, and its harness resumes a
fork of the session it saved there, by the harness's own mechanism (its adapter's
``Harness.fork_session``). A harness without one raises ``ForkUnsupported`` before
anything starts.

Threads: the caller's thread only.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gym_harness.errors import ForkUnsupported
from gym_harness.fork.parent import Forkable, Parent, child_trajectory

__all__ = ["resume"]


def resume(parent: Parent, directory: Path) -> tuple[Forkable, str, dict[str, Any]]:
    """Fork a turn-mode episode by resuming a copy of its session.

    Raises:
        ForkUnsupported: The harness has no way to resume a copy of its session (the
            message names it and what it lacks), or the episode's directories hold more
            than ``max_fork_bytes``; nothing started.
    """
    started = time.monotonic()
    child = parent.spawn(user_fn=parent.user_fn)
    try:
        name = child.harness.name
        raise ForkUnsupported(
            f"the {name!r} harness cannot fork a turn-mode episode: it has no way to resume "
            "a copy of its saved session; fork in mode='model' (replay) instead."
        )
    except BaseException:
        child.close()
        raise
    took = time.monotonic() - started
    child.trajectory = child_trajectory(
        parent, child.trajectory, len(parent.trajectory.turns), took
    )
    return child, "", {"fork": {"method": "native"}}
