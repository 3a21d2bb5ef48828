"""The arguments of a vector env's reset, read and checked as gymnasium's vector envs do.

Shared by ``HarnessVectorEnv`` and ``RayVectorEnv``: one seed per sub-env, and the
``options["reset_mask"]`` that picks the sub-envs to reset.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["batch_seeds", "pop_reset_mask"]


def batch_seeds(seed: int | list[int | None] | None, n: int) -> list[int | None]:
    """One seed per sub-env: ``None`` for all, ``seed + i`` from an int, or the list as given.

    Raises:
        ValueError: A list whose length is not ``n``.
    """
    if seed is None:
        return [None] * n
    if isinstance(seed, int):
        return [seed + i for i in range(n)]
    if len(seed) != n:
        raise ValueError(
            f"If seeds are passed as a list the length must match num_envs={n} "
            f"but got length={len(seed)}."
        )
    return list(seed)


def pop_reset_mask(options: dict[str, Any] | None, n: int) -> np.ndarray:
    """Take ``options["reset_mask"]`` out of ``options`` (all True without one).

    Raises:
        TypeError: It is not a numpy array of ``np.bool_``.
        ValueError: Its shape is not ``(n,)``, or it resets no sub-env.
    """
    if options is None or "reset_mask" not in options:
        return np.ones(n, dtype=np.bool_)
    mask = options.pop("reset_mask")
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (n,):
        raise ValueError(f"`options['reset_mask']` must have shape `({n},)`, got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not mask.any():
        raise ValueError(
            "`options['reset_mask']` must contain a boolean array with at least one True "
            f"value, got reset_mask={mask}"
        )
    return mask
