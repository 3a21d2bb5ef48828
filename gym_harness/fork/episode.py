"""Which way a fork is made: replayed (model mode) or resumed (turn mode).

A model-mode episode is replayed (:mod:`~gym_harness.fork.replay`); a turn-mode one
resumes the harness's own saved session from a copy of its directories
(:mod:`~gym_harness.fork.native`).

Threads: the caller's thread only (the parent's, between two of its steps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym_harness.fork.native import resume
from gym_harness.fork.parent import Forkable, Parent
from gym_harness.fork.replay import replay

__all__ = ["fork_episode"]


def fork_episode(
    parent: Parent, directory: Path | None, strict: bool
) -> tuple[Forkable, str, dict[str, Any]]:
    """Make the child env of ``parent``'s episode: replayed (model mode) or resumed (turns).

    Args:
        parent: The episode.
        directory: The episode's directory (``workspace/``, ``home/`` in it).
        strict: Model mode: raise ``ForkDiverged`` at the first replayed request that differs.

    Returns:
        ``(child, observation, info)``; ``info["fork"]`` says how the child was made.

    Raises:
        ForkUnsupported: The episode cannot be forked (the message says why); nothing started.
        ForkDiverged: The child could not reach the parent's state, or, with ``strict``,
            a replayed request differed from the parent's; the child is closed.
    """
    assert directory is not None  # a running episode has one
    if parent.held is not None:
        return replay(parent, parent.held, directory, strict)
    return resume(parent, directory)
