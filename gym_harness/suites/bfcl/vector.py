"""``gymnasium.make_vec("gym_harness/BFCL-v0", num_envs=N)``: BFCL envs in worker processes.

The registration's ``vector_entry_point`` of BFCL-v0: a ``HarnessVectorEnv`` (the vector
env of every gym_harness id) whose sub-envs are :class:`~gym_harness.suites.bfcl.env.BFCLEnv`.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium

from gym_harness.vector import HarnessVectorEnv

__all__ = ["make_vector_env"]


def _make_one(env_kwargs: dict[str, Any], max_episode_steps: int | None) -> gymnasium.Env[Any, Any]:
    from gym_harness.suites.bfcl.env import BFCLEnv

    env: gymnasium.Env[Any, Any] = BFCLEnv(**env_kwargs)
    if max_episode_steps is not None:
        env = gymnasium.wrappers.TimeLimit(env, max_episode_steps)
    return env


def make_vector_env(
    num_envs: int = 1,
    *,
    max_episode_steps: int | None = None,
    context: str | None = None,
    **env_kwargs: Any,
) -> HarnessVectorEnv:
    """A ``HarnessVectorEnv`` of ``num_envs`` BFCL envs (one worker process each).

    Args:
        num_envs: How many sub-envs.
        max_episode_steps: Truncate episodes after this many steps.
        context: The multiprocessing start method (``"spawn"``, ``"forkserver"``, ...).
        **env_kwargs: Passed to every ``BFCLEnv`` (``category``, ``mode``, ...).

    Example:
        >>> envs = gymnasium.make_vec("gym_harness/BFCL-v0", num_envs=2)  # doctest: +SKIP
    """
    make = functools.partial(_make_one, env_kwargs, max_episode_steps)
    return HarnessVectorEnv([make] * num_envs, context=context)
