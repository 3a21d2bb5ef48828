"""Vector envs over harnesses: ``HarnessVectorEnv``, an AsyncVectorEnv set up for text.

``gymnasium.make_vec(id, num_envs=N)`` uses this as the registered
``vector_entry_point``: one worker process per env, texts over the workers' pipes
(``shared_memory=False``), and a worker that dies is reported and replaced
(see :mod:`gym_harness.vector.async_env`).

The bridge's server stack (fastmcp, mcp, uvicorn, starlette) is imported once
before the workers start, not in each: in the parent when workers fork (the
Linux default), in the forkserver when that is the start method. Forked workers
share those pages copy-on-write. Spawned workers (``context="spawn"``) import it
themselves, each on its first reset.
"""

from __future__ import annotations

import functools
import multiprocessing
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium

from gym_harness.vector.async_env import CLOSE_TIMEOUT_S, HarnessVectorEnv

__all__ = ["make_vector_env"]

_FORKSERVER_PRELOAD = "gym_harness.vector.forkserver_preload"


def _make_one(
    env_kwargs: dict[str, Any],
    max_episode_steps: int | None,
    env_class: Callable[..., gymnasium.Env[Any, Any]] | None,
) -> gymnasium.Env[Any, Any]:
    if env_class is None:
        from gym_harness.env import HarnessEnv

        env_class = HarnessEnv
    env: gymnasium.Env[Any, Any] = env_class(**env_kwargs)
    if max_episode_steps is not None:
        env = gymnasium.wrappers.TimeLimit(env, max_episode_steps)
    return env


def make_vector_env(
    num_envs: int = 1,
    *,
    max_episode_steps: int | None = None,
    context: str | None = None,
    close_timeout_s: float = CLOSE_TIMEOUT_S,
    env_class: Callable[..., gymnasium.Env[Any, Any]] | None = None,
    **env_kwargs: Any,
) -> HarnessVectorEnv:
    """Build a ``HarnessVectorEnv`` (an ``AsyncVectorEnv``) of ``num_envs`` ``HarnessEnv``s.

    Args:
        num_envs: How many sub-envs (one worker process each).
        max_episode_steps: Truncate episodes after this many turns.
        context: The multiprocessing start method (``"spawn"``, ``"forkserver"``, ...).
        close_timeout_s: How long ``close()`` lets the workers close their envs before
            it terminates them.
        env_class: The sub-envs' class (``None``: ``HarnessEnv``; a suite passes its own
            subclass, picklable by reference for the workers).
        **env_kwargs: Passed to every sub-env.

    Returns:
        The vector env (``shared_memory=False``, next-step autoreset). A sub-env whose
        worker dies reports ``info["error_type"] == "worker_lost"`` and gets a new worker.

    Example:
        >>> envs = gymnasium.make_vec("gym_harness/Reference-v0", num_envs=4)  # doctest: +SKIP
    """
    _preload_for(context)
    make = functools.partial(_make_one, env_kwargs, max_episode_steps, env_class)
    return HarnessVectorEnv([make] * num_envs, context=context, close_timeout_s=close_timeout_s)


def _preload_for(context: str | None) -> None:
    """Import the server stack where the workers will inherit it (see the module doc)."""
    method = context or multiprocessing.get_start_method()
    if method == "forkserver":
        from multiprocessing import forkserver

        # Added to the modules already asked for (``["__main__"]`` by default). Read when
        # the forkserver starts: one already running keeps what it has.
        server = getattr(forkserver, "_forkserver", None)
        modules = list(getattr(server, "_preload_modules", None) or ["__main__"])
        if _FORKSERVER_PRELOAD not in modules:
            modules.append(_FORKSERVER_PRELOAD)
        multiprocessing.get_context("forkserver").set_forkserver_preload(modules)
    elif method == "fork":
        from gym_harness.errors import HarnessError
        from gym_harness.vector.preload import preload_server_stack

        try:
            preload_server_stack()
        except (HarnessError, ImportError) as exc:
            warnings.warn(
                f"could not preload the MCP server stack ({exc}); each vector worker will "
                "import it on its first reset, which is slower and uses more memory",
                RuntimeWarning,
                stacklevel=3,
            )
