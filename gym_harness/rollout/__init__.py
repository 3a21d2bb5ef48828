"""Rollouts: many episodes, one record each, locally, on Ray, or from the command line.

* :mod:`~gym_harness.rollout.local`: ``run_episode``, ``local_rollout`` and the one
  scheduler (``schedule``) both rollouts use.
* :mod:`~gym_harness.rollout.ray`: ``ray_rollout`` (``gym_harness[ray]``; its actors and
  ``RayVectorEnv`` are ``gym_harness.vector.ray``'s).
* :mod:`~gym_harness.rollout.cli`: the ``gym-harness`` command (``run``, ``rollout``), with
  :mod:`~gym_harness.rollout.console` (what it prints while it runs) and
  :mod:`~gym_harness.rollout.keywords` (every keyword of an env id, read from the code:
  ``--list-keywords``, the unknown-keyword check, the docs' generated reference) and
  :mod:`~gym_harness.rollout.outfile` (``OUT.partial``: whole-line writes, ``--resume``).
  cli.py is one job, the command line: its parsers, their errors and hints, and the two
  commands' runs and exit statuses.

The top of the package: it may import the env and anything below; nothing imports it.
"""

from gym_harness.rollout.local import local_rollout, run_episode

__all__ = ["local_rollout", "run_episode"]
