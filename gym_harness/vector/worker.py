"""The worker side of ``HarnessVectorEnv``, and the words for a worker that died.

``run_worker`` is the target of every worker process: it makes one env and answers
the parent's commands over its pipe, one reply per command. Unlike gymnasium's own
worker it holds no episode state (the parent decides when a sub-env autoresets, so a
fresh worker needs nothing replayed) and it survives an exception of its env: the
exception travels back in the reply and the parent raises it, with the worker's
traceback as a note.

A forked worker inherits the parent's ends of every earlier worker's pipe and process
sentinels: 3 fds per sibling, O(N²) in all, and a sibling holding a worker's pipe open
keeps that worker from seeing EOF when the parent dies. :func:`track` registers a vector
env whose pipes and sentinels every process forked afterwards closes at once.
:func:`release_parent_side` closes the parent's own at ``close()`` (not only when the
vector env is collected).

Threads: a worker's main thread runs its env; the parent's caller thread drives the pipe.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
import traceback
import weakref
from collections.abc import Callable, Iterable, Mapping
from multiprocessing.connection import Connection
from typing import Any

import gymnasium

from gym_harness.outcome import Outcome
from gym_harness.records.trajectory import StepInfo

__all__ = [
    "WorkerFailure",
    "describe_exit",
    "end_processes",
    "lost_info",
    "release_parent_side",
    "run_worker",
    "track",
]

_JOIN_S = 1.0  # after SIGTERM, and after SIGKILL


class WorkerFailure:
    """An exception raised by a worker's env, as the parent receives it.

    Args:
        error: The exception itself (``None`` when it could not be pickled).
        text: ``"Type: message"``, for an exception that could not travel.
        trace: The worker's formatted traceback.
    """

    def __init__(self, error: BaseException | None, text: str, trace: str) -> None:
        self.error, self.text, self.trace = error, text, trace

    def exception(self, index: int) -> BaseException:
        """The exception to raise in the parent for sub-env ``index``."""
        error = self.error if self.error is not None else RuntimeError(self.text)
        error.add_note(f"(raised in the vector worker of sub-env {index})\n{self.trace}")
        return error


def run_worker(
    index: int,
    env_fn: Callable[[], gymnasium.Env[Any, Any]],
    pipe: Connection,
    parent_pipe: Connection,
    _shared_memory: Any,
    _error_queue: Any,
    _autoreset_mode: Any,
    _semaphore: Any,
) -> None:
    """Serve one env over ``pipe`` until ``("close", None)`` or the parent is gone.

    The signature is gymnasium's ``AsyncVectorEnv`` worker's; the shared memory, error
    queue, autoreset mode and semaphore are unused (``HarnessVectorEnv`` uses none).
    """
    parent_pipe.close()
    env: gymnasium.Env[Any, Any] | None = None
    made: WorkerFailure | None = None
    try:
        env = env_fn()
    except Exception as exc:  # every command is answered with it, so the parent raises it
        made = _failure(exc)
    try:
        while True:
            command, data = pipe.recv()
            if command == "close":
                pipe.send((None, True))
                break
            if env is None:
                assert made is not None
                _reply(pipe, made, False)
                continue
            try:
                result = _run(env, command, data)
            except Exception as exc:
                _reply(pipe, _failure(exc), False)
            else:
                _reply(pipe, result, True)
    except (EOFError, OSError, KeyboardInterrupt):
        pass  # the parent is gone, or Ctrl-C reached the whole process group: close and go
    finally:
        if env is not None:
            env.close()


def _run(env: gymnasium.Env[Any, Any], command: str, data: Any) -> Any:
    if command == "step":
        obs, reward, terminated, truncated, info = env.step(data)
        return obs, float(reward), bool(terminated), bool(truncated), info
    if command == "reset":
        return env.reset(**data)
    if command == "_call":
        name, args, kwargs = data
        attr = env.get_wrapper_attr(name)
        return attr(*args, **kwargs) if callable(attr) else attr
    if command == "_setattr":
        name, value = data
        env.set_wrapper_attr(name, value)
        return None
    if command == "_check_spaces":
        observation_space, action_space = data
        return observation_space == env.observation_space, action_space == env.action_space
    raise RuntimeError(f"unknown vector worker command {command!r}")


def _failure(exc: Exception) -> WorkerFailure:
    return WorkerFailure(exc, f"{type(exc).__name__}: {exc}", traceback.format_exc())


def _reply(pipe: Connection, result: Any, ok: bool) -> None:
    """Send a reply; one that cannot be pickled becomes a failure that can."""
    try:
        pipe.send((result, ok))
    except OSError:
        raise  # the parent is gone
    except Exception as exc:  # pickling failed, so nothing was sent
        if isinstance(result, WorkerFailure) and result.error is not None:
            result.error = None  # the exception's text and traceback still travel
            pipe.send((result, False))
        else:
            pipe.send((_failure(exc), False))


_TRACKED: weakref.WeakSet[Any] = weakref.WeakSet()


def track(envs: Any) -> None:
    """Have every process forked from now on close ``envs``'s parent-side pipes and
    sentinels (``envs.parent_pipes``, ``envs.processes``): they are not the child's."""
    _TRACKED.add(envs)


def _forget_siblings() -> None:
    """In a forked child: close the tracked vector envs' parent-side fds (their objects
    stay, closed; the child's own pipe is passed to it separately and stays open)."""
    for envs in list(_TRACKED):
        for pipe in list(getattr(envs, "parent_pipes", ())):
            with contextlib.suppress(OSError):
                pipe.close()
        for process in list(getattr(envs, "processes", ())):
            for fd in _popen_fds(process):
                with contextlib.suppress(OSError):
                    os.close(fd)
    _TRACKED.clear()


def _popen_fds(process: Any) -> tuple[int, ...]:
    """The parent-side fds of a started fork ``Process`` (its sentinel and its finalizer's
    pipe end): multiprocessing keeps them on its ``Popen`` until the process is closed."""
    finalizer = getattr(getattr(process, "_popen", None), "finalizer", None)
    fds = getattr(finalizer, "_args", None) or ()
    return tuple(fd for fd in fds if isinstance(fd, int))


os.register_at_fork(after_in_child=_forget_siblings)


def release_parent_side(pipes: Iterable[Connection], processes: Iterable[Any], queue: Any) -> None:
    """Close the parent's pipes, each ended process's sentinel and gymnasium's error queue
    now (they are otherwise closed only when the vector env is collected). Never raises."""
    for pipe in pipes:
        with contextlib.suppress(OSError):
            pipe.close()
    for process in processes:
        with contextlib.suppress(Exception):  # ValueError: still running (then kept)
            process.close()
    for end in (getattr(queue, "_reader", None), getattr(queue, "_writer", None)):
        with contextlib.suppress(Exception):
            end.close()  # type: ignore[union-attr]


def end_processes(processes: Iterable[multiprocessing.Process], deadline: float) -> None:
    """Let each process exit by ``deadline``, then SIGTERM, then SIGKILL; reap. Never raises."""
    started = [p for p in processes if p.pid is not None]
    for end in ("", "terminate", "kill"):
        for process in started:
            if end and process.exitcode is None:
                with contextlib.suppress(Exception):
                    getattr(process, end)()
        for process in started:
            with contextlib.suppress(Exception):
                process.join(max(0.0, deadline - time.monotonic()))
        if all(p.exitcode is not None for p in started):
            return
        deadline = time.monotonic() + _JOIN_S


def describe_exit(code: int | None) -> str:
    """A process's exit status in words: ``"was killed by signal 9 (SIGKILL)"``."""
    if code is None:
        return "is gone (its exit status is unknown)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


def lost_info(last: Mapping[str, Any], error: str) -> dict[str, Any]:
    """The info of the step that reports a lost worker: ``StepInfo``'s keys, ``worker_lost``.

    Args:
        last: The sub-env's last info (its turn, episode and task ids, a wrapper's keys).
        error: What happened, for ``info["error"]``.
    """
    lost: StepInfo = {
        "turn": int(last.get("turn", 0)) + 1,
        "error_type": Outcome.WORKER_LOST.value,
        "error": error,
        "events": [],
        "tool_calls": 0,
        "elapsed_s": 0.0,
        "exit_code": -1,  # unknown: the harness died with its worker
        "stderr_tail": "",
        "episode_id": str(last.get("episode_id", "")),
        "task_id": str(last.get("task_id", "")),
    }
    return {**last, **lost}  # a wrapper's own keys stay, as on the steps before
