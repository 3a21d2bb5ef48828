"""As-ready stepping for ``HarnessVectorEnv``: ``send(actions, env_ids)``, ``recv(min_envs)``.

A synchronous ``step`` waits for the slowest sub-env: one harness in a long tool call
holds every other sub-env's answered call. EnvPool's pair instead lets each sub-env run
at its own pace: ``send`` hands actions to some sub-envs and returns at once; ``recv``
sleeps until at least ``min_envs`` of the sub-envs sent to have their results, and
returns every result that is in (``infos["env_id"]`` says whose), so the policy's batch
is whatever is ready.

* **Autoreset** is gymnasium's next-step mode, per sub-env: after a result that ended
  its episode, the sub-env's next ``send`` resets it (the action is ignored) and its
  ``recv`` result is the reset's observation and info, reward 0, neither flag set.
* **A dead worker** is its sub-env's result, ``terminated`` with ``worker_lost``, as in
  ``step``; its next ``send`` starts a fresh worker and resets it.
* **An env's exception** is raised by the ``recv`` that meets it; the results that came
  in with it wait for the next ``recv``. The sub-env keeps its state, as in ``step``.
* **Mixing**: ``step``, ``reset`` and ``call`` raise ``AlreadyPendingCallError`` while
  a sent sub-env's result is not received yet; ``close()`` ends the sub-envs still busy
  (their late results are never read).
* **No busy loop**: ``recv`` sleeps in ``multiprocessing.connection.wait`` on the pipes
  of the sub-envs it waits for and their workers' sentinels, and reads only those that
  woke it.

Threads: the caller's thread, as for the rest of the vector env.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterable, Sequence
from multiprocessing import connection
from typing import Any, ClassVar, Protocol

import numpy as np
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector import VectorEnv
from gymnasium.vector.async_vector_env import AsyncState
from gymnasium.vector.utils import concatenate, create_empty_array

from gym_harness.vector.worker import lost_info

__all__ = ["RESET", "STEP", "AsReady", "ReadySteps", "Result", "Workers", "result_of"]

STEP, RESET = "step", "reset"
#: One sub-env's result: (observation, reward, terminated, truncated, info).
Result = tuple[Any, float, bool, bool, dict[str, Any]]
_AUTORESET = {"seed": None, "options": None}
_SLICE_S = 0.5  # the longest recv sleeps without checking every worker it waits for


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


class Workers(Protocol):
    """What :class:`ReadySteps` drives: ``HarnessVectorEnv``'s workers, pipes and episodes."""

    num_envs: int
    single_observation_space: Any
    parent_pipes: list[Any]
    processes: list[Any]
    WORKING: ClassVar[object]
    LOST: ClassVar[object]
    _autoreset: np.ndarray
    _unreported: list[str]
    _lost: list[str]
    _last_info: list[dict[str, Any]]

    def _post(self, i: int, message: tuple[str, Any]) -> bool: ...
    def _read(self, i: int) -> Any: ...
    def _restart(self, i: int) -> None: ...
    def _loss(self, i: int) -> Result: ...


class _Batch:
    """Gymnasium's info batching, for a batch of ``num_envs`` results (one ``recv``'s)."""

    _add_info = VectorEnv._add_info

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs


class ReadySteps:
    """The sub-envs sent to and not yet received, and the results that wait to be.

    Args:
        envs: The vector env whose workers this drives (its pipe primitives).
    """

    def __init__(self, envs: Workers) -> None:
        self.envs = envs
        self.busy: dict[int, str] = {}  # sub-env -> the kind of its message in flight
        self.done: dict[int, Result] = {}  # results not received yet
        self.failed: dict[int, BaseException] = {}  # env exceptions not raised yet

    @property
    def outstanding(self) -> int:
        """Sub-envs sent to whose results were not received yet."""
        return len(self.busy) + len(self.done) + len(self.failed)

    def send(self, actions: Sequence[Any], env_ids: Iterable[int] | None) -> None:
        """Hand ``actions[j]`` to sub-env ``env_ids[j]`` (all sub-envs when ``None``)."""
        envs = self.envs
        ids = list(range(envs.num_envs)) if env_ids is None else [int(i) for i in env_ids]
        actions = list(actions)
        if len(actions) != len(ids):
            raise ValueError(f"send got {len(actions)} actions for {len(ids)} env_ids")
        if len(set(ids)) != len(ids):
            raise ValueError(f"send got an env_id twice: {ids}")
        for i in ids:
            if not 0 <= i < envs.num_envs:
                raise ValueError(f"env_id {i} is out of range for {envs.num_envs} sub-envs")
            if i in self.busy or i in self.done or i in self.failed:
                raise AlreadyPendingCallError(
                    f"sub-env {i} was sent an action whose result is not received yet: "
                    "call recv() first",
                    "send",
                )
        for i, action in zip(ids, actions, strict=True):
            if envs._unreported[i]:  # its worker died: this result reports the loss
                self._lost(i)
                continue
            if envs._lost[i]:
                envs._restart(i)
            kind = RESET if envs._autoreset[i] else STEP
            message = (RESET, _AUTORESET) if kind == RESET else (STEP, action)
            if envs._post(i, message):
                self.busy[i] = kind
            else:  # it died while idle
                self._lost(i)

    def recv(
        self, min_envs: int, timeout: float | None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for at least ``min_envs`` results (fewer when fewer are outstanding);
        return every result in, by sub-env id."""
        if self.outstanding == 0:
            raise NoAsyncCallError("Calling `recv` without any prior call to `send`.", "recv")
        if min_envs < 1:
            raise ValueError(f"min_envs must be at least 1, got {min_envs}")
        want = min(min_envs, self.outstanding)
        deadline = None if timeout is None else time.monotonic() + timeout
        self._take(list(self.busy))
        while len(self.done) + len(self.failed) < want:
            slice_s = _SLICE_S
            if deadline is not None:
                slice_s = min(slice_s, deadline - time.monotonic())
                if slice_s <= 0:
                    raise multiprocessing.TimeoutError(
                        f"recv has timed out after {timeout} second(s) with "
                        f"{len(self.done)} of {want} results; the rest stay in flight"
                    )
            woke = self._sleep(slice_s)
            self._take(woke if woke else list(self.busy))  # quiet: check every worker lives
        if self.failed:
            i = min(self.failed)
            raise self.failed.pop(i)
        return self._batch()

    def abandon(self) -> list[int]:
        """Forget everything in flight (``close()``); the sub-envs whose replies are owed."""
        owed = list(self.busy)
        self.busy, self.done, self.failed = {}, {}, {}
        return owed

    def _sleep(self, slice_s: float) -> list[int]:
        """Sleep until a busy sub-env's pipe or worker wakes us, at most ``slice_s``."""
        envs = self.envs
        owner: dict[Any, int] = {}
        for i in self.busy:
            owner[envs.parent_pipes[i]] = i
            owner[envs.processes[i].sentinel] = i
        woke = connection.wait(list(owner), slice_s)
        return sorted({owner[w] for w in woke})

    def _take(self, ids: list[int]) -> None:
        """Read the replies of ``ids`` that are in; a dead worker's result is its loss."""
        envs = self.envs
        for i in ids:
            if i not in self.busy:
                continue
            reply = envs._read(i)
            if reply is envs.WORKING:
                continue
            kind = self.busy.pop(i)
            if reply is envs.LOST:
                self._lost(i)
                continue
            result, ok = reply
            if not ok:  # the env raised; it keeps its state (no autoreset)
                self.failed[i] = result.exception(i)
                continue
            self._finish(i, result_of(kind, result, "", envs._last_info[i]))

    def _lost(self, i: int) -> None:
        self._finish(i, self.envs._loss(i))

    def _finish(self, i: int, result: Result) -> None:
        envs = self.envs
        envs._last_info[i] = result[4]
        envs._autoreset[i] = result[2] or result[3]
        self.done[i] = result

    def _batch(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        ids = sorted(self.done)
        results = [self.done.pop(i) for i in ids]
        n = len(ids)
        space = self.envs.single_observation_space
        out: Any = create_empty_array(space, n)
        observations = concatenate(space, [r[0] for r in results], out)
        batch = _Batch(n)
        infos: dict[str, Any] = {}
        for j, (i, result) in enumerate(zip(ids, results, strict=True)):
            infos = batch._add_info(infos, {**result[4], "env_id": i}, j)  # type: ignore[misc]
        return (
            observations,
            np.array([r[1] for r in results], dtype=np.float64),
            np.array([r[2] for r in results], dtype=np.bool_),
            np.array([r[3] for r in results], dtype=np.bool_),
            infos,
        )


class AsReady:
    """``send``/``recv`` for ``HarnessVectorEnv`` (it sets ``_as_ready``, a :class:`ReadySteps`)."""

    _as_ready: ReadySteps
    _state: AsyncState
    _assert_is_running: Callable[[], None]  # AsyncVectorEnv's

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Hand ``actions[j]`` to sub-env ``env_ids[j]`` and return at once (EnvPool's pair).

        Args:
            actions: One action per id (a sequence).
            env_ids: The sub-envs (default: all). A sub-env whose episode ended is reset
                instead (next-step autoreset; its action is ignored).

        Raises:
            AlreadyPendingCallError: A sub-env's earlier result was not received yet, or a
                ``step_async``/``reset_async``/``call_async`` waits.
            ValueError: Not one action per id, an id twice, or an id out of range.
        """
        self._assert_is_running()
        if self._state != AsyncState.DEFAULT:
            raise AlreadyPendingCallError(
                f"Calling `send` while waiting for a pending call to `{self._state.value}` "
                "to complete.",
                str(self._state.value),
            )
        self._as_ready.send(actions, env_ids)

    def recv(
        self, min_envs: int = 1, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Sleep until at least ``min_envs`` sent sub-envs have results; return all that do.

        Args:
            min_envs: Fewest results to wait for (fewer when fewer are outstanding).
            timeout: Longest wait in seconds (``None``: until they come; each sub-env's
                step is bounded by its own turn and episode limits).

        Returns:
            ``(observations, rewards, terminated, truncated, infos)`` of the sub-envs in,
            ordered by id; ``infos["env_id"]`` holds their ids.

        Raises:
            NoAsyncCallError: Nothing was sent.
            multiprocessing.TimeoutError: ``timeout`` passed first (nothing is lost: the
                results come with a later ``recv``).
            Exception: What a sub-env's env raised (the other results wait for the next
                ``recv``).
        """
        self._assert_is_running()
        return self._as_ready.recv(min_envs, timeout)
