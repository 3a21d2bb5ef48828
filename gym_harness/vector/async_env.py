"""HarnessVectorEnv: gymnasium's ``AsyncVectorEnv`` whose workers may die, on one core.

As in EnvPool, ``step`` is ``send`` to every sub-env then ``recv`` of every sub-env;
``send(actions, env_ids)``/``recv(min_envs)`` are the same core with fewer sub-envs
(:class:`~gym_harness.vector.core.VectorCore`: the worker pipes and the one wait loop).
``reset``, ``call`` and ``set_attr`` go through the same core.

A worker process can die under any env: the out-of-memory killer picks the largest
process, an operator kills one. gymnasium's own ``AsyncVectorEnv`` then raises a bare
``EOFError``, and its ``close()`` waits forever on replies it has already read. Here:

* A step (or ``recv``) reports a worker that died as its sub-env's outcome,
  ``terminated`` with ``info["error_type"] == "worker_lost"`` and the worker's pid and
  exit (signal or exit code) in ``info["error"]``, as ``RayVectorEnv`` does for a lost
  actor. At the sub-env's next step a fresh worker starts and resets it (the usual
  next-step autoreset); the other sub-envs go on untouched.
* ``reset()``, ``call``, ``get_attr`` and ``set_attr`` replace a dead worker first. A
  worker that dies while resetting is replaced once more, and a second death raises
  ``WorkerLost``; so does a worker's death during a call (the sub-env's next step then
  reports it, unless ``reset()`` comes first).
* ``close()`` never reads a reply twice nor waits on a dead pipe. It gives the workers
  ``close_timeout_s`` (or ``close(timeout=...)``) to close their envs, then SIGTERMs and,
  a second later, SIGKILLs the rest, so it returns within that bound plus about 2 s; the
  keepers of killed workers end their harnesses and remove their workspaces. Sub-envs
  still busy are ended (their late results are never read).

**Autoreset** is gymnasium's next-step mode, per sub-env, decided by the parent: after a
result that ended its episode, the sub-env's next step (or ``send``) resets it (the
action is ignored) and its result is the reset's observation and info, reward 0,
neither flag set. A worker holds no episode state, so a fresh one needs nothing replayed.

**An env's exception** is raised in the parent with the worker's traceback as a note,
and the worker goes on serving its env, which keeps its state. ``step`` raises it after
every reply is in; ``recv`` raises it, and the results that came in with it wait for the
next ``recv``.

**Mixing**: ``step``, ``reset`` and ``call`` raise ``AlreadyPendingCallError`` while a
sent sub-env's result is not received yet, and ``send`` while a ``step_async``,
``reset_async`` or ``call_async`` waits.

Threads: one caller thread drives the vector env (as for gymnasium's own); each worker
process runs one env in its main thread (``gym_harness.vector.worker.run_worker``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector.async_vector_env import AsyncState
from gymnasium.vector.utils import concatenate, iterate

from gym_harness.errors import WorkerLost
from gym_harness.vector.core import VectorCore
from gym_harness.vector.resets import batch_seeds, pop_reset_mask
from gym_harness.vector.results import AUTORESET, CALL, RESET, Batch
from gym_harness.vector.worker import (
    WorkerFailure,
    describe_exit,
    end_processes,
    release_parent_side,
)

__all__ = ["CLOSE_TIMEOUT_S", "HarnessVectorEnv"]

#: How long ``close()`` lets the workers close their envs before it ends them.
CLOSE_TIMEOUT_S = 5.0


class HarnessVectorEnv(VectorCore):
    """An ``AsyncVectorEnv`` (one worker process per sub-env) that survives a worker's death,
    with EnvPool's as-ready pair ``send(actions, env_ids)`` / ``recv(min_envs)``; ``step``
    is ``send`` to all then ``recv`` of all.

    What ``make_vector_env`` (the ``vector_entry_point`` of every gym_harness id) builds:
    texts travel over the pipes (``shared_memory=False``), autoreset is next-step.

    Args:
        env_fns: One function per sub-env that makes its env (called in the worker).
        context: The multiprocessing start method (``None``: the default).
        daemon: Whether the workers are daemonic (they end with the parent).
        close_timeout_s: How long ``close()`` waits for the workers to close their envs
            before it terminates them (``close(timeout=...)`` overrides it).

    Raises:
        WorkerLost: A worker died before the vector env was up.

    Example:
        >>> envs = gymnasium.make_vec("gym_harness/Command-v0", num_envs=2,
        ...                           command=["python", "agent.py"])  # doctest: +SKIP
        >>> obs, rewards, terminated, truncated, infos = envs.step(actions)  # doctest: +SKIP
        >>> infos["error_type"]  # doctest: +SKIP
        array(['', 'worker_lost'], dtype=object)
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gymnasium.Env[Any, Any]]],
        *,
        context: str | None = None,
        daemon: bool = True,
        close_timeout_s: float = CLOSE_TIMEOUT_S,
    ) -> None:
        self.close_timeout_s = close_timeout_s
        self._mask = np.ones(len(env_fns), dtype=np.bool_)  # the sub-envs of the last reset
        self._reset_kwargs: list[dict[str, Any]] = [dict(AUTORESET) for _ in env_fns]
        super().__init__(env_fns, context=context, daemon=daemon)

    # ----------------------------------------------------------------- reset

    def reset_async(
        self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Send ``reset`` to each sub-env (those of ``options["reset_mask"]``), new workers
        first for dead ones."""
        self._check_idle("reset_async")
        seeds = batch_seeds(seed, self.num_envs)
        options = None if options is None else dict(options)
        self._mask = pop_reset_mask(options, self.num_envs)
        try:
            for i in map(int, np.flatnonzero(self._mask)):
                if self._lost[i]:
                    self._restart(i)
                self._unreported[i] = ""  # a new episode: the lost one needs no report
                self._reset_kwargs[i] = {"seed": seeds[i], "options": options}
                self._post(i, ("reset", self._reset_kwargs[i]), RESET)
        except BaseException:
            self._abandon()  # whatever was sent is answered to nobody
            raise
        self._state = AsyncState.WAITING_RESET

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """The reset observations and infos.

        Raises:
            WorkerLost: A sub-env's worker died while resetting, and so did its replacement.
        """
        self._check_waiting(AsyncState.WAITING_RESET, "reset_wait")
        wanted = [int(i) for i in np.flatnonzero(self._mask)]
        replies = self._collect("reset_wait", timeout)
        first = {i: self._lost[i] for i in wanted if i not in replies}
        for i in first:  # one more fresh worker each
            self._restart(i)
            self._post(i, ("reset", self._reset_kwargs[i]), RESET)
        if first:
            replies.update(self._collect("reset_wait", timeout))
        self._state = AsyncState.DEFAULT
        self._autoreset[wanted] = False
        _raise_failures(replies)
        for i in first:
            if i not in replies:
                process = self.processes[i]
                raise WorkerLost(
                    f"{first[i]} during reset(), and its replacement (pid {process.pid}) "
                    f"{describe_exit(process.exitcode)} too: is the machine short of memory?",
                    index=i,
                    exit_code=process.exitcode,
                    pid=process.pid,
                )
        observations: list[Any] = list(self.observations)
        infos: dict[str, Any] = {}
        for i in wanted:
            observations[i], info = replies[i][0]
            self._last_info[i] = info
            infos = self._add_info(infos, info, i)
        return self._observe(observations), infos

    # ----------------------------------------------------------------- step: send + recv

    def step(self, actions: Any) -> Batch:
        """Step every sub-env: ``send`` to all, then ``recv`` of all (EnvPool's ``step``).

        A sub-env whose episode ended is reset instead (next-step autoreset); one whose
        worker died reports ``worker_lost``.
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Send each sub-env its action (the ``send`` to all of ``step``)."""
        self._check_idle("step_async")
        try:
            self._send_actions(list(iterate(self.action_space, actions)), range(self.num_envs))
        except BaseException:
            self._abandon()  # whatever was sent is answered to nobody
            raise
        self._state = AsyncState.WAITING_STEP

    def step_wait(self, timeout: float | None = None) -> Batch:
        """The batched step results (the ``recv`` of all of ``step``).

        Raises:
            multiprocessing.TimeoutError: ``timeout`` passed first.
            Exception: What a sub-env's env raised, once every reply is in.
        """
        self._check_waiting(AsyncState.WAITING_STEP, "step_wait")
        try:
            self._wait(self._outstanding, timeout, "step_wait")
        except multiprocessing.TimeoutError:
            self._abandon()
            raise
        self._state = AsyncState.DEFAULT
        results = self._hand_out(sorted(self._in))
        n = self.num_envs
        observations: list[Any] = list(self.observations)
        rewards = np.zeros(n, dtype=np.float64)
        terminations = np.zeros(n, dtype=np.bool_)
        truncations = np.zeros(n, dtype=np.bool_)
        infos: dict[str, Any] = {}
        for i, result in results.items():
            if isinstance(result, BaseException):
                continue  # raised below
            observations[i], rewards[i], terminations[i], truncations[i], info = result
            infos = self._add_info(infos, info, i)
        for result in results.values():
            if isinstance(result, BaseException):
                raise result
        return self._observe(observations), rewards, terminations, truncations, infos

    # ----------------------------------------------------------------- calls

    def call_async(self, name: str, /, *args: object, **kwargs: object) -> None:
        """Call ``name`` (a method or attribute) in every sub-env (dead workers replaced first)."""
        self._check_idle("call_async")
        self._send_all([("_call", (name, args, kwargs))] * self.num_envs)

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """The results of ``call_async``, one per sub-env.

        Raises:
            WorkerLost: A sub-env's worker died during the call.
        """
        self._check_waiting(AsyncState.WAITING_CALL, "call_wait")
        return self._answers(self._collect("call_wait", timeout))

    def set_attr(self, name: str, values: list[Any] | tuple[Any] | object) -> None:
        """Set attribute ``name`` in every sub-env (one value each, or one for all).

        Raises:
            WorkerLost: A sub-env's worker died meanwhile.
        """
        self._check_idle("set_attr")
        if not isinstance(values, list | tuple):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of "
                f"environments. Got `{len(values)}` values for {self.num_envs} environments."
            )
        self._send_all([("_setattr", (name, value)) for value in values])
        self._answers(self._collect("set_attr", None))

    def _check_spaces(self) -> None:
        """Check every sub-env has the first one's spaces (gymnasium's __init__ calls this)."""
        spaces = (self.single_observation_space, self.single_action_space)
        self._send_all([("_check_spaces", spaces)] * self.num_envs)
        answers = self._answers(self._collect("__init__", None))
        same_observation, same_action = zip(*answers, strict=True)
        if not all(same_observation):
            raise RuntimeError("Some sub-envs have an observation space unlike the first one's.")
        if not all(same_action):
            raise RuntimeError("Some sub-envs have an action space unlike the first one's.")

    # ----------------------------------------------------------------- close

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Close every sub-env's env and end the workers, within the bound; never raises.

        Args:
            timeout: How long the workers may take to close their envs (default
                ``close_timeout_s``); then they are terminated.
            terminate: Terminate the workers at once.
        """
        bound = 0.0 if terminate else self.close_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + bound
        self._abandon()  # whatever is in flight is never read now
        live = [i for i in range(self.num_envs) if not self._lost[i]]
        if not terminate:
            for i in live:
                with contextlib.suppress(Exception):
                    self._post(i, ("close", None), CALL)
            self._pending, self._in = {}, {}
        end_processes([self.processes[i] for i in live], deadline)
        release_parent_side(self.parent_pipes, self.processes, self.error_queue)

    def _send_all(self, messages: Sequence[tuple[str, Any]]) -> None:
        """Send sub-env ``i`` ``messages[i]`` as a call, fresh workers first for dead ones
        (their sub-envs' next steps reset them)."""
        try:
            for i, message in enumerate(messages):
                if self._lost[i]:
                    self._restart(i)
                self._post(i, message, CALL)
        except BaseException:
            self._abandon()
            raise
        self._state = AsyncState.WAITING_CALL

    def _answers(self, replies: dict[int, tuple[Any, bool]]) -> tuple[Any, ...]:
        self._state = AsyncState.DEFAULT
        _raise_failures(replies)
        for i in range(self.num_envs):
            if i not in replies:
                process = self.processes[i]
                raise WorkerLost(
                    f"{self._lost[i]} during a call; its next step reports it as "
                    "worker_lost (unless reset() comes first) and a fresh worker replaces it.",
                    index=i,
                    exit_code=process.exitcode,
                    pid=process.pid,
                )
        return tuple(replies[i][0] for i in range(self.num_envs))

    def _observe(self, observations: list[Any]) -> Any:
        self.observations = concatenate(
            self.single_observation_space, observations, self.observations
        )
        return deepcopy(self.observations) if self.copy else self.observations


def _raise_failures(replies: dict[int, tuple[Any, bool]]) -> None:
    """Raise the first exception a sub-env's env raised (with the worker's traceback)."""
    for i in sorted(replies):
        result, ok = replies[i]
        if not ok:
            assert isinstance(result, WorkerFailure)
            raise result.exception(i)
