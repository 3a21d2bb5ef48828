"""``gymnasium.make_vec("gym_harness/BFCL-v0", num_envs=N)``: BFCL envs in worker processes.

The registration's ``vector_entry_point`` of BFCL-v0: a ``HarnessVectorEnv`` (the vector
env of every gym_harness id) whose sub-envs are :class:`~gym_harness.suites.bfcl.env.BFCLEnv`.
"""

from __future__ import annotations

from typing import Any

from gym_harness.vector import HarnessVectorEnv, factory

__all__ = ["make_vector_env"]


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
    from gym_harness.suites.bfcl.env import BFCLEnv

    return factory.make_vector_env(
        num_envs,
        max_episode_steps=max_episode_steps,
        context=context,
        env_class=BFCLEnv,
        **env_kwargs,
    )
