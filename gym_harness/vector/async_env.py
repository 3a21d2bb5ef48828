"""HarnessVectorEnv: gymnasium's ``AsyncVectorEnv`` whose workers may die, on one core.

**One core.** As in EnvPool, ``step`` is ``send`` to every sub-env then ``recv`` of every
sub-env, and the as-ready pair is the same core with fewer sub-envs: ``send(actions,
env_ids)`` hands actions to some sub-envs and returns at once; ``recv(min_envs)`` sleeps
until at least ``min_envs`` of the sub-envs sent to have their results and returns every
result that is in (``infos["env_id"]`` says whose), so the policy's batch is whatever is
ready. ``reset``, ``call`` and ``set_attr`` send and wait through the same pipes and the
same one wait loop, which sleeps in ``multiprocessing.connection.wait`` on the pipes of
the sub-envs it waits for and their workers' sentinels, reads only those that woke it,
and checks every worker it waits for at least every half second.

A worker process can die under any env: the out-of-memory killer picks the largest
process, an operator kills one. gymnasium's own ``AsyncVectorEnv`` then raises a bare
``EOFError``, and its ``close()`` waits forever on replies it has already read. Here:

* A wait never waits on a dead worker: it is noticed by its sentinel, or by its exit
  status at least every half second.
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
from collections.abc import Callable, Iterable, Sequence
from copy import deepcopy
from multiprocessing import connection
from typing import Any

import gymnasium
import numpy as np
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector import AsyncVectorEnv
from gymnasium.vector.async_vector_env import AsyncState
from gymnasium.vector.utils import CloudpickleWrapper, clear_mpi_env_vars, concatenate, iterate

from gym_harness.errors import WorkerLost
from gym_harness.vector.resets import batch_seeds, pop_reset_mask
from gym_harness.vector.results import (
    AUTORESET,
    CALL,
    RESET,
    SLICE_S,
    STEP,
    Batch,
    Result,
    ready_batch,
    result_of,
)
from gym_harness.vector.worker import (
    WorkerFailure,
    describe_exit,
    end_processes,
    release_parent_side,
    run_worker,
    track,
)

__all__ = ["CLOSE_TIMEOUT_S", "HarnessVectorEnv"]

#: How long ``close()`` lets the workers close their envs before it ends them.
CLOSE_TIMEOUT_S = 5.0
#: What ``_read`` gives for a worker still working, and the reply of one that died.
_WORKING = object()
_LOST = object()


class HarnessVectorEnv(AsyncVectorEnv):
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
        n = len(env_fns)
        self.close_timeout_s = close_timeout_s
        # Set before gymnasium's __init__, which checks the spaces through our pipes.
        self._lost = [""] * n  # how sub-env i's worker ended; "" while it runs
        self._unreported = [""] * n  # a loss no step has reported yet (its episode's end)
        self._owed = [0] * n  # replies a worker still sends to messages nobody waits for
        self._pending: dict[int, str] = {}  # sub-env -> the kind of its unanswered message
        self._in: dict[int, tuple[str, Any]] = {}  # sub-env -> (kind, reply) read, not handed out
        self._last_info: list[dict[str, Any]] = [{} for _ in range(n)]
        self._autoreset = np.zeros(n, dtype=np.bool_)
        self._mask = np.ones(n, dtype=np.bool_)
        self._reset_kwargs: list[dict[str, Any]] = [dict(AUTORESET) for _ in range(n)]
        track(self)  # workers forked later close this one's pipes (see worker.py)
        super().__init__(
            env_fns,
            shared_memory=False,
            context=context,
            daemon=daemon,
            worker=run_worker,  # type: ignore[arg-type]  # gymnasium's hint lists 6 of the 8 args
        )

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

    def send(self, actions: Any, env_ids: Iterable[int] | None = None) -> None:
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
        n = self.num_envs
        ids = list(range(n)) if env_ids is None else [int(i) for i in env_ids]
        actions = list(actions)
        if len(actions) != len(ids):
            raise ValueError(f"send got {len(actions)} actions for {len(ids)} env_ids")
        if len(set(ids)) != len(ids):
            raise ValueError(f"send got an env_id twice: {ids}")
        for i in ids:
            if not 0 <= i < n:
                raise ValueError(f"env_id {i} is out of range for {n} sub-envs")
            if i in self._pending or i in self._in:
                raise AlreadyPendingCallError(
                    f"sub-env {i} was sent an action whose result is not received yet: "
                    "call recv() first",
                    "send",
                )
        self._send_actions(actions, ids)

    def recv(self, min_envs: int = 1, timeout: float | None = None) -> Batch:
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
        if self._state != AsyncState.DEFAULT or not self._outstanding:
            raise NoAsyncCallError("Calling `recv` without any prior call to `send`.", "recv")
        if min_envs < 1:
            raise ValueError(f"min_envs must be at least 1, got {min_envs}")
        self._wait(min(min_envs, self._outstanding), timeout, "recv")
        failed = [i for i, (_, reply) in self._in.items() if reply is not _LOST and not reply[1]]
        if failed:
            error = self._hand_out([min(failed)])[min(failed)]
            assert isinstance(error, BaseException)
            raise error
        results = self._hand_out(sorted(self._in))
        return ready_batch(self.single_observation_space, results)  # type: ignore[arg-type]

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

    # ----------------------------------------------------------------- the core

    @property
    def _outstanding(self) -> int:
        """Sub-envs sent a message whose reply was not handed out yet."""
        return len(self._pending) + len(self._in)

    def _send_actions(self, actions: Sequence[Any], ids: Iterable[int]) -> None:
        """Send sub-env ``ids[j]`` ``actions[j]``, or a reset where its episode ended."""
        for i, action in zip(ids, actions, strict=True):
            if self._unreported[i]:  # its worker died: this result reports the loss
                self._in[i] = (STEP, _LOST)
                continue
            if self._lost[i]:
                self._restart(i)
            if self._autoreset[i]:
                self._post(i, ("reset", AUTORESET), RESET)
            else:
                self._post(i, ("step", action), STEP)

    def _hand_out(self, ids: Iterable[int]) -> dict[int, Result | BaseException]:
        """Take the replies of ``ids`` as results (an env's exception as itself): a loss is
        reported once, an ended episode arms its autoreset, a failed env keeps its state."""
        results: dict[int, Result | BaseException] = {}
        for i in ids:
            kind, reply = self._in.pop(i)
            if reply is _LOST:
                result = self._loss(i)
            else:
                value, ok = reply
                if not ok:
                    assert isinstance(value, WorkerFailure)
                    results[i] = value.exception(i)
                    continue
                result = result_of(kind, value, "", self._last_info[i])
            self._last_info[i] = result[4]
            self._autoreset[i] = result[2] or result[3]
            results[i] = result
        return results

    def _wait(self, want: int, timeout: float | None, what: str) -> None:
        """The one wait loop: read replies until ``want`` are in (a dead worker's is ``_LOST``).

        Raises:
            multiprocessing.TimeoutError: ``timeout`` passed first; what was read stays in.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        self._take(list(self._pending))
        while len(self._in) < want:
            slice_s = SLICE_S
            if deadline is not None:
                slice_s = min(slice_s, deadline - time.monotonic())
                if slice_s <= 0:
                    raise multiprocessing.TimeoutError(
                        f"The call to `{what}` has timed out after {timeout} second(s) "
                        f"with {len(self._in)} of {want} replies in."
                    )
            owner: dict[Any, int] = {}
            for i in self._pending:
                owner[self.parent_pipes[i]] = i
                owner[self.processes[i].sentinel] = i
            woke = sorted({owner[w] for w in connection.wait(list(owner), slice_s)})
            self._take(woke or list(self._pending))  # quiet: check every worker lives

    def _take(self, ids: list[int]) -> None:
        """Read the replies of ``ids`` that are in."""
        for i in ids:
            if i in self._pending:
                reply = self._read(i)
                if reply is not _WORKING:
                    self._in[i] = (self._pending.pop(i), reply)

    def _collect(self, what: str, timeout: float | None) -> dict[int, tuple[Any, bool]]:
        """Wait for the reply of every pending sub-env; those whose worker died are missing.

        Raises:
            multiprocessing.TimeoutError: ``timeout`` passed first (late replies are
                skipped when they come).
        """
        try:
            self._wait(self._outstanding, timeout, what)
        except multiprocessing.TimeoutError:
            self._abandon()
            raise
        replies = {i: reply for i, (_, reply) in self._in.items() if reply is not _LOST}
        self._in = {}
        return replies

    def _abandon(self) -> None:
        """Forget every message in flight: their replies are skipped when they come."""
        for i in self._pending:
            self._owed[i] += 1
        self._pending, self._in = {}, {}
        self._state = AsyncState.DEFAULT

    def _check_idle(self, what: str) -> None:
        self._assert_is_running()
        if self._state != AsyncState.DEFAULT:
            raise AlreadyPendingCallError(
                f"Calling `{what}` while waiting for a pending call to "
                f"`{self._state.value}` to complete.",
                str(self._state.value),
            )
        if self._outstanding:
            raise AlreadyPendingCallError(
                f"Calling `{what}` while {self._outstanding} sub-env(s) sent to "
                "with send() have results not received yet: recv() them first.",
                "send",
            )

    def _check_waiting(self, state: AsyncState, what: str) -> None:
        self._assert_is_running()
        if self._state != state:
            raise NoAsyncCallError(
                f"Calling `{what}` without any prior call to `{state.value}_async`.",
                state.value,
            )

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

    # ----------------------------------------------------------------- workers

    def _post(self, i: int, message: tuple[str, Any], kind: str) -> None:
        """Write one message to sub-env ``i``'s pipe; a worker that died is marked lost,
        and its reply is that loss."""
        try:
            self.parent_pipes[i].send(message)
        except OSError:  # BrokenPipeError, ConnectionResetError: it died while idle
            self._lose(i)
            self._in[i] = (kind, _LOST)
        else:
            self._pending[i] = kind

    def _read(self, i: int) -> Any:
        """Sub-env ``i``'s reply, ``_WORKING`` while none came, or ``_LOST`` (then marked)."""
        pipe = self.parent_pipes[i]
        alive = self.processes[i].is_alive()  # first: what it sent before dying is in the pipe
        try:
            while pipe.poll():
                reply = pipe.recv()
                if not self._owed[i]:
                    return reply
                self._owed[i] -= 1  # the late reply to a message nobody waits for now
        except (EOFError, OSError):
            alive = False
        if alive:
            return _WORKING
        self._lose(i)
        return _LOST

    def _loss(self, i: int) -> Result:
        """The result that reports sub-env ``i``'s lost worker (once)."""
        lost, self._unreported[i] = self._unreported[i] or self._lost[i], ""
        return result_of(STEP, None, lost, self._last_info[i])

    def _lose(self, i: int) -> None:
        """Mark sub-env ``i``'s worker lost: close its pipe, reap (or kill) the process."""
        process = self.processes[i]
        with contextlib.suppress(OSError):
            self.parent_pipes[i].close()
        end_processes([process], time.monotonic())
        self._owed[i] = 0
        how = describe_exit(process.exitcode)
        self._lost[i] = self._unreported[i] = (
            f"the vector worker of sub-env {i} (pid {process.pid}) {how}"
        )

    def _restart(self, i: int) -> None:
        """A fresh worker for sub-env ``i``: its env is made anew, and reset at its next step."""
        context = multiprocessing.get_context(self.context)
        parent_pipe, child_pipe = context.Pipe()
        process = context.Process(  # type: ignore[attr-defined]
            target=self.worker,
            name=f"Worker<{type(self).__name__}>-{i}",
            args=(
                *(i, CloudpickleWrapper(self.env_fns[i]), child_pipe, parent_pipe),
                *(None, self.error_queue, self.autoreset_mode, None),  # as gymnasium passes
            ),
            daemon=self.daemon,
        )
        with clear_mpi_env_vars():
            process.start()
        child_pipe.close()
        self.parent_pipes[i], self.processes[i] = parent_pipe, process
        self._lost[i], self._owed[i] = "", 0
        self._autoreset[i] = True

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
