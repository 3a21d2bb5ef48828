"""The core of ``HarnessVectorEnv``: worker pipes, one wait loop, EnvPool's ``send``/``recv``.

:class:`VectorCore` is gymnasium's ``AsyncVectorEnv`` with our workers
(``gym_harness.vector.worker.run_worker``) and the one way anything reaches them: a
message is posted to a sub-env's pipe (:meth:`VectorCore._post`), the one wait loop
(:meth:`VectorCore._wait`) reads replies until enough are in, and they are handed out
as results (:meth:`VectorCore._hand_out`) or, for resets and calls, as the raw replies
(:meth:`VectorCore._collect`). ``send(actions, env_ids)`` and ``recv(min_envs)`` are
EnvPool's as-ready pair over it; ``HarnessVectorEnv`` builds gymnasium's ``step``
(``send`` to all, ``recv`` of all), ``reset`` and ``call`` on the same methods.

* **The wait** sleeps in ``multiprocessing.connection.wait`` on the pipes of the
  sub-envs it waits for and their workers' sentinels, reads only those that woke it, and
  checks every worker it waits for at least every ``SLICE_S``: a dead worker is noticed,
  never waited on. A timeout keeps what was read.
* **A dead worker** is its sub-env's reply (``_LOST``): a step's result reports it as
  ``worker_lost`` (once); the sub-env's next message starts a fresh worker
  (:meth:`VectorCore._restart`), which is reset first.
* **Late replies** to messages nobody waits for any more (a timed-out reset or call,
  ``close()``) are counted as owed and skipped when they come.

Threads: the caller's thread, as for the rest of the vector env.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Callable, Iterable, Sequence
from multiprocessing import connection
from typing import Any

import gymnasium
import numpy as np
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector import AsyncVectorEnv
from gymnasium.vector.async_vector_env import AsyncState
from gymnasium.vector.utils import CloudpickleWrapper, clear_mpi_env_vars

from gym_harness.vector.results import (
    AUTORESET,
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
    run_worker,
    track,
)

__all__ = ["VectorCore"]

#: What ``_read`` gives for a worker still working, and the reply of one that died.
_WORKING = object()
_LOST = object()


class VectorCore(AsyncVectorEnv):
    """``AsyncVectorEnv`` with our workers, reached only through one post and one wait.

    Args:
        env_fns: One function per sub-env that makes its env (called in the worker).
        context: The multiprocessing start method (``None``: the default).
        daemon: Whether the workers are daemonic (they end with the parent).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gymnasium.Env[Any, Any]]],
        *,
        context: str | None = None,
        daemon: bool = True,
    ) -> None:
        n = len(env_fns)
        # Set before gymnasium's __init__, which checks the spaces through our pipes.
        self._lost = [""] * n  # how sub-env i's worker ended; "" while it runs
        self._unreported = [""] * n  # a loss no step has reported yet (its episode's end)
        self._owed = [0] * n  # replies a worker still sends to messages nobody waits for
        self._pending: dict[int, str] = {}  # sub-env -> the kind of its unanswered message
        self._in: dict[int, tuple[str, Any]] = {}  # sub-env -> (kind, reply) read, not handed out
        self._last_info: list[dict[str, Any]] = [{} for _ in range(n)]
        self._autoreset = np.zeros(n, dtype=np.bool_)
        track(self)  # workers forked later close this one's pipes (see worker.py)
        super().__init__(
            env_fns,
            shared_memory=False,
            context=context,
            daemon=daemon,
            worker=run_worker,  # type: ignore[arg-type]  # gymnasium's hint lists 6 of the 8 args
        )

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
