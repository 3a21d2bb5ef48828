"""Forking: one episode's state as a new, independent env (``HarnessEnv.fork``).

* :mod:`~gym_harness.fork.parent`: :class:`Parent`, what the env hands over of the
  episode it forks, and the record a child starts with.
* :mod:`~gym_harness.fork.episode`: :func:`fork_episode`, which picks the way.
* :mod:`~gym_harness.fork.replay`: model mode. A fresh harness is answered with the
  parent's recorded completions until it makes the call the parent holds; each replayed
  request is compared with the recorded one.
* :mod:`~gym_harness.fork.native`: turn mode. The parent's workspace and private home are
  copied and the harness resumes a fork of its own saved session.

Below the env: it never imports ``env.py`` (the env hands it a way to make the child
env, from what the child inherits), nor the process layer's internals, the loopback
servers or the adapters' modules; it writes no attribute of an env.
"""

from gym_harness.fork.episode import fork_episode
from gym_harness.fork.parent import Adopt, Forkable, Inherited, Parent, Spawn

__all__ = ["Adopt", "Forkable", "Inherited", "Parent", "Spawn", "fork_episode"]
