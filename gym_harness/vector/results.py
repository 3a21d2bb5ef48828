"""What a vector env's sub-env hands back, and the batches made of it.

The words of ``HarnessVectorEnv``'s core, defined once: the kinds of message a worker
answers, the next-step autoreset's arguments, how long a wait goes without checking
that the workers live, one sub-env's :data:`Result`, and the batch of the sub-envs that
are in (EnvPool's ``recv``: ``infos["env_id"]`` says whose).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import concatenate, create_empty_array

from gym_harness.vector.worker import lost_info

__all__ = [
    "AUTORESET",
    "CALL",
    "RESET",
    "SLICE_S",
    "STEP",
    "Batch",
    "Result",
    "ready_batch",
    "result_of",
]

#: The kinds of message a worker answers: a step, a reset, anything else (a call).
STEP, RESET, CALL = "step", "reset", "call"
#: The arguments of a next-step autoreset.
AUTORESET: Mapping[str, Any] = {"seed": None, "options": None}
#: The longest a wait for replies goes without checking that the workers it waits for live.
SLICE_S = 0.5

#: One sub-env's result: (observation, reward, terminated, truncated, info).
Result = tuple[Any, float, bool, bool, dict[str, Any]]
#: A batch: (observations, rewards, terminated, truncated, infos).
Batch = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


def result_of(kind: str, reply: Any, lost: str, last_info: dict[str, Any]) -> Result:
    """A sub-env's result from its worker's reply (``None``: the worker died, ``lost`` says how).

    A reset's reply reads as its observation and info, reward 0, neither flag set.
    """
    if reply is None:
        why = f"{lost}; a fresh worker resets the sub-env at its next step"
        return "", 0.0, True, False, lost_info(last_info, why)
    if kind == RESET:
        observation, info = reply
        return observation, 0.0, False, False, info
    observation, reward, terminated, truncated, info = reply
    return observation, float(reward), bool(terminated), bool(truncated), info


class _Infos:
    """Gymnasium's info batching, for a batch of ``num_envs`` results."""

    _add_info = VectorEnv._add_info

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs


def ready_batch(space: Any, results: Mapping[int, Result]) -> Batch:
    """The batch of the sub-envs in ``results``, ordered by id; ``infos["env_id"]`` holds the ids.

    Args:
        space: One sub-env's observation space.
        results: Each sub-env's result, by id.
    """
    ids = sorted(results)
    rows = [results[i] for i in ids]
    out: Any = create_empty_array(space, len(ids))
    observations = concatenate(space, [r[0] for r in rows], out)
    batch = _Infos(len(ids))
    infos: dict[str, Any] = {}
    for j, (i, row) in enumerate(zip(ids, rows, strict=True)):
        infos = batch._add_info(infos, {**row[4], "env_id": i}, j)  # type: ignore[misc]
    return (
        observations,
        np.array([r[1] for r in rows], dtype=np.float64),
        np.array([r[2] for r in rows], dtype=np.bool_),
        np.array([r[3] for r in rows], dtype=np.bool_),
        infos,
    )
