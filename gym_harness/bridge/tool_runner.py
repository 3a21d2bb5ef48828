"""ToolRunner: one env tool call under bounds (time, env lock, worker threads, exits).

The bridge hands every call, from the harness over HTTP or from the env's
orchestrator in-process, to :meth:`ToolRunner.invoke`:

* whatever the tool raises, ``SystemExit`` and ``KeyboardInterrupt`` included, is
  an error of that call (``fastmcp.exceptions.ToolError``), never of the loop;
* the call passes through FastMCP once: the original tool's ``run`` (validation,
  result conversion), not its server's ``call_tool`` a second time, unless that
  server has middleware of its own to honour;
* a sync tool runs on one of at most ``workers`` threads (the loop's anyio thread
  limiter); with all of them taken, a call waits within its timeout, then fails "busy";
* a tool tagged ``locked`` runs holding the env lock, and keeps holding it until
  its body has really ended, even after the call timed out; a call that cannot get
  the lock within its timeout fails "env busy".

Threads: ``invoke`` runs on an event loop (the bridge's, or a private one before
the bridge starts); tool bodies run on it (async tools) or in anyio worker threads.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastmcp import FastMCP
    from fastmcp.tools import Tool, ToolResult

__all__ = ["ToolRunner"]

_POLL_S = 0.002
# The call a tool body belongs to (read by the wrapper around each original tool's function).
_SLOT: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar("tool_slot", default=None)


class ToolRunner:
    """Run served tools by their served names.

    Args:
        source: The env's tool server.
        originals: Served name -> the source's tool.
        names: Served name -> original name.
        locked: Served names of the tools that run holding ``lock``.
        lock: The env lock (a ``threading.Lock``), or ``None``.
        timeout_s: Budget of one call, waiting for the lock or a worker included.
        workers: Most threads running sync tools at once.
    """

    def __init__(
        self,
        source: FastMCP,
        originals: Mapping[str, Tool],
        names: Mapping[str, str],
        *,
        locked: frozenset[str],
        lock: threading.Lock | None,
        timeout_s: float,
        workers: int,
    ) -> None:
        self._source = source
        self._names = dict(names)
        direct = _calls_directly(source)
        self._tools = {n: _guarded(t) for n, t in originals.items()} if direct else {}
        self._sync = frozenset(n for n, t in originals.items() if _runs_in_thread(t))
        self._locked = locked
        self._lock = lock
        self.timeout_s = timeout_s
        self.workers = workers
        self._busy = 0
        self._count_lock = threading.Lock()
        self._abandoned: set[asyncio.Future[Any]] = set()

    @property
    def busy_workers(self) -> int:
        """Sync tool bodies running now (hung ones included)."""
        return self._busy

    async def invoke(
        self, served_name: str, arguments: dict[str, Any], *, own_context: bool = False
    ) -> ToolResult:
        """Run one call; raise ``ToolError`` for a timeout, a busy env or pool, or an exit.

        Args:
            served_name: The tool's served name.
            arguments: Its arguments.
            own_context: Open a FastMCP ``Context`` for the tool (an in-process call, which
                no served server's ``call_tool`` wraps in one).

        Returns:
            The tool's result.

        Raises:
            fastmcp.exceptions.ToolError: The call failed in one of the ways above.
            Exception: Whatever else the tool raised (FastMCP turns it into a tool error).
        """
        from fastmcp.exceptions import ToolError

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        lock = self._lock if served_name in self._locked else None
        if lock is not None and not lock.acquire(blocking=False):
            # Poll: a blocking acquire would stall the loop, one in a thread cannot be undone.
            while not lock.acquire(blocking=False):
                if loop.time() >= deadline:
                    raise ToolError(
                        f"env busy: tool {served_name!r} waited {self.timeout_s}s for the env "
                        "lock, which an earlier locked tool call still holds; retry later"
                    )
                await asyncio.sleep(_POLL_S)
        sync = served_name in self._sync
        if sync and not self._take_worker():
            try:
                while not self._take_worker():
                    if loop.time() >= deadline:
                        raise ToolError(
                            f"busy: all {self.workers} tool worker threads stayed taken by "
                            f"earlier calls (slow or hung sync tools) for {self.timeout_s}s; "
                            f"retry {served_name!r} later"
                        )
                    await asyncio.sleep(_POLL_S)
            except BaseException:
                if lock is not None:
                    lock.release()
                raise
        slot = _Slot(self, lock, sync)
        reset = _SLOT.set(slot)
        try:
            task = loop.create_task(self._run(served_name, arguments, own_context))
        finally:
            _SLOT.reset(reset)
        task.add_done_callback(slot.task_done)
        try:
            done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()))
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not done:
            # Cancelling a sync tool does not stop its thread; don't wait, keep a reference.
            task.cancel()
            self._abandoned.add(task)
            task.add_done_callback(self._abandoned.discard)
            held = " (it keeps the env lock until it really ends)" if lock is not None else ""
            raise ToolError(f"tool {served_name!r} did not finish within {self.timeout_s}s{held}")
        return task.result()

    async def _run(
        self, served_name: str, arguments: dict[str, Any], own_context: bool
    ) -> ToolResult:
        from fastmcp.exceptions import ToolError
        from fastmcp.server.context import Context

        try:
            tool = self._tools.get(served_name)
            if tool is not None and own_context:
                async with Context(fastmcp=self._source):
                    return await tool.run(arguments)
            if tool is not None:
                return await tool.run(arguments)
            return await self._source.call_tool(self._names[served_name], arguments)
        except (Exception, asyncio.CancelledError):
            raise
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: one call's error only
            raise ToolError(_fatal_message(served_name, exc)) from exc

    def _take_worker(self) -> bool:
        with self._count_lock:
            if self._busy >= self.workers:
                return False
            self._busy += 1
            return True

    def _give_worker(self) -> None:
        with self._count_lock:
            self._busy -= 1


class _Slot:
    """One call's hold on the env lock and on a worker thread, given back exactly once.

    Given back when the tool body really ends (the guarded function's ``finally``, in
    whatever thread it runs), or, if the body never started, when the call's task ends.
    A body that would start after that is refused, so it never runs without its hold.
    """

    __slots__ = ("_guard", "_lock", "_runner", "_state", "_sync")

    def __init__(self, runner: ToolRunner, lock: threading.Lock | None, sync: bool) -> None:
        self._runner, self._lock, self._sync = runner, lock, sync
        self._guard = threading.Lock()
        self._state = 0  # 0 waiting, 1 running, 2 ended

    def begin(self) -> bool:
        with self._guard:
            if self._state == 2:
                return False
            self._state = 1
            return True

    def end(self) -> None:
        with self._guard:
            if self._state == 2:
                return
            self._state = 2
        if self._lock is not None:
            self._lock.release()
        if self._sync:
            self._runner._give_worker()

    def task_done(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved: an abandoned call's error is no one's to log
        if self._state != 1:
            self.end()


def _fatal_message(name: str, exc: BaseException) -> str:
    return (
        f"tool {name!r} raised {type(exc).__name__}({exc}); the bridge turned it into this "
        "error (a tool must not exit the process)"
    )


def _guarded(tool: Tool) -> Tool:
    """A copy of ``tool`` whose function holds its slot while it runs and exits nowhere."""
    fn = getattr(tool, "fn", None)
    if fn is None or inspect.isasyncgenfunction(fn):
        return tool  # its slot is given back when its task ends
    name = tool.name
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def guarded_async(*args: Any, **kwargs: Any) -> Any:
            slot = _SLOT.get()
            if slot is not None and not slot.begin():
                raise asyncio.CancelledError
            try:
                return await fn(*args, **kwargs)
            except (Exception, asyncio.CancelledError):
                raise
            except BaseException as exc:
                raise RuntimeError(_fatal_message(name, exc)) from exc
            finally:
                if slot is not None:
                    slot.end()

        return tool.model_copy(update={"fn": guarded_async})

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        slot = _SLOT.get()
        if slot is not None and not slot.begin():
            raise RuntimeError(f"tool {name!r} was cancelled before it started")
        try:
            result = fn(*args, **kwargs)
            # A generator's body runs while it is consumed: consume it while the slot is held.
            return list(result) if inspect.isgenerator(result) else result
        except Exception:
            raise
        except BaseException as exc:
            raise RuntimeError(_fatal_message(name, exc)) from exc
        finally:
            if slot is not None:
                slot.end()

    return tool.model_copy(update={"fn": guarded})


def _calls_directly(source: FastMCP) -> bool:
    """Whether calls may skip the source server's ``call_tool`` (no middleware to honour)."""
    return all(type(m).__name__ == "DereferenceRefsMiddleware" for m in source.middleware)


def _runs_in_thread(tool: Tool) -> bool:
    fn = getattr(tool, "fn", None)
    if fn is None:
        return False
    is_async = inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
    return not is_async and bool(getattr(tool, "run_in_thread", True))
