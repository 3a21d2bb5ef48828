"""MCPBridge: the env's domain tools over streamable HTTP on 127.0.0.1.

The bridge serves the env's tools (see :mod:`gym_harness.tools`) and nothing
else: reserved names, internal and reward tools are never served. Every HTTP
request needs the bridge's bearer token; :meth:`MCPBridge.rotate_token` at each
reset locks out a harness from an earlier episode. A foreign ``Host`` or
``Origin`` header is refused (DNS-rebinding protection).

Threads: the caller's thread owns the lifecycle (``start``/``stop``/
``rotate_token``) and never needs an event loop. The bridge thread (a
:class:`~gym_harness._loopback.LoopbackServer`) owns one asyncio loop running
uvicorn; tool calls run on it, sync tools in its worker threads.
``list_tools``/``call_tool`` are for the env's orchestrator: they run in-process
on the bridge loop (or a private one before ``start``), not over HTTP.
"""

from __future__ import annotations

import asyncio
import enum
import hmac
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gym_harness._loopback import LoopbackServer, RotatingToken
from gym_harness.errors import BridgeError, ConfigError, ToolConflictError
from gym_harness.tools import (
    HIDDEN_TAGS,
    LOCKED_TAG,
    RESERVED_TOOL_NAMES,
    ToolSpec,
    load_tools,
    resolve_tool_conflicts,
    run_sync,
)

if TYPE_CHECKING:
    from fastmcp import FastMCP
    from fastmcp.tools import Tool, ToolResult

__all__ = ["BridgeState", "MCPBridge", "ToolCallResult"]

MCP_PATH = "/mcp"
_STOP_TIMEOUT_S = 1.0
_LOCK_POLL_S = 0.002
_RLOCK_TYPE = type(threading.RLock())


class BridgeState(enum.Enum):
    """Where a bridge is in its life; ``start`` works from NEW and STOPPED."""

    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


@dataclass(frozen=True)
class ToolCallResult:
    """The outcome of one in-process tool call.

    Attributes:
        text: The text content blocks, joined by newlines (the error message on error).
        is_error: True when the tool raised, timed out or reported an error.
        structured: The tool's structured content, if it returned any.
    """

    text: str
    is_error: bool = False
    structured: dict[str, Any] | None = None


class _BearerGuard:
    """ASGI middleware: every request needs ``Authorization: Bearer <current token>``."""

    def __init__(self, app: Any, bridge: MCPBridge) -> None:
        self.app = app
        self.bridge = bridge

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        supplied = b""
        for key, value in scope["headers"]:
            if key == b"authorization":
                supplied = value
                break
        expected = b"Bearer " + self.bridge.token.encode()
        if not hmac.compare_digest(supplied, expected):
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"text/plain"),
                        (b"www-authenticate", b'Bearer realm="gym_harness"'),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": b"invalid or missing bearer token"})
            return
        self.bridge.last_activity = time.monotonic()
        await self.app(scope, receive, send)


class MCPBridge(RotatingToken):
    """Serve an env's domain tools to a harness over loopback streamable HTTP.

    Args:
        tools: Anything :func:`gym_harness.tools.load_tools` accepts.
        tool_names: Served name -> original name (from
            :func:`~gym_harness.tools.resolve_tool_conflicts`). ``None`` serves every
            non-hidden tool under its own name, renamed with ``prefix`` where it clashes
            with one of ``builtin_names``.
        builtin_names: The harness's own tool names (with ``tool_names=None``).
        prefix: Prepended to a tool that clashes with a built-in (with ``tool_names=None``).
        tool_timeout_s: A call running longer returns an MCP tool error (a hung sync
            tool keeps its worker thread until it returns; Python cannot kill it).
        lock: A ``threading.Lock`` held around every call of a tool tagged
            ``"locked"``; the tool must not take it again.

    Attributes:
        last_activity: ``time.monotonic()`` of the last authenticated request or the end
            of the last harness tool call (idle detection counts them as signs of life).
        tool_calls: Tool calls served over HTTP since construction.
        in_flight: Harness tool calls running now (the harness is waiting on the env).

    Raises:
        ConfigError: A bad timeout or a reentrant lock.

    Example:
        >>> with MCPBridge([add]) as bridge:  # doctest: +SKIP
        ...     env["GYM_HARNESS_MCP_URL"], env["GYM_HARNESS_MCP_TOKEN"] = bridge.url, bridge.token
    """

    def __init__(
        self,
        tools: Any,
        *,
        tool_names: Mapping[str, str] | None = None,
        builtin_names: Iterable[str] = (),
        prefix: str = "env_",
        tool_timeout_s: float = 120.0,
        lock: threading.Lock | None = None,
    ) -> None:
        if not tool_timeout_s > 0:
            raise ConfigError(f"tool_timeout_s must be > 0, got {tool_timeout_s}")
        if isinstance(lock, _RLOCK_TYPE):
            raise ConfigError("lock must be a threading.Lock: the bridge acquires it off-thread")
        self._spec = tools
        self._requested_names = dict(tool_names) if tool_names is not None else None
        self._builtin_names = frozenset(builtin_names)
        self._prefix = prefix
        self.tool_timeout_s = tool_timeout_s
        self._lock = lock
        super().__init__()
        self._state = BridgeState.NEW
        self._state_lock = threading.Lock()
        self._source: FastMCP | None = None
        self._served: FastMCP | None = None
        self._names: dict[str, str] = {}
        self._locked: frozenset[str] = frozenset()
        self._specs: list[ToolSpec] = []
        self._server: LoopbackServer | None = None
        self._url = ""
        self._abandoned: set[asyncio.Future[Any]] = set()
        self.last_activity = time.monotonic()
        self.tool_calls = 0
        self.in_flight = 0
        #: True once a harness holding the current token listed the tools (``tools/list``):
        #: the env's proof that a harness which reports no tool list loaded them.
        self.tools_listed = False

    @property
    def state(self) -> BridgeState:
        """The lifecycle state."""
        return self._state

    @property
    def url(self) -> str:
        """The MCP endpoint, ``http://127.0.0.1:<port>/mcp`` ("" unless running)."""
        return self._url if self._state is BridgeState.RUNNING else ""

    def rotate_token(self) -> str:
        """Replace the bearer token; requests with the old one get 401 from now on.

        Returns:
            The new token (``tools_listed`` is False again until a harness lists the tools).
        """
        self.tools_listed = False
        return super().rotate_token()

    def list_tools(self) -> list[ToolSpec]:
        """The served tools, under their served names (no HTTP, no running loop needed).

        Raises:
            ConfigError, ToolConflictError: The tools cannot be loaded or named.
        """
        self._prepare()
        return list(self._specs)

    def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None) -> ToolCallResult:
        """Call a served tool in-process for the env's orchestrator.

        These calls do not count in ``tool_calls``, ``in_flight`` or ``last_activity``
        (those describe the harness).

        Args:
            name: A served name.
            arguments: The tool's arguments.

        Returns:
            The result; a raising or timed-out tool gives ``is_error=True``.

        Raises:
            ConfigError: No served tool has this name.
            BridgeError: The bridge loop did not answer in time.
        """
        self._prepare()
        if name not in self._names:
            raise ConfigError(f"no served tool named {name!r}; served: {sorted(self._names)}")
        args = dict(arguments or {})
        limit = self.tool_timeout_s + 5.0
        loop = self._server.loop if self._server is not None else None
        if self._state is not BridgeState.RUNNING or loop is None:
            return run_sync(lambda: self._call_for_orchestrator(name, args), limit)
        future = asyncio.run_coroutine_threadsafe(self._call_for_orchestrator(name, args), loop)
        try:
            return future.result(limit)
        except TimeoutError as exc:
            future.cancel()
            raise BridgeError(f"the bridge did not answer a call of {name!r} in {limit}s") from exc

    def start(self) -> None:
        """Bind 127.0.0.1 on an OS-chosen port and serve until :meth:`stop`.

        Raises:
            BridgeError: The server could not bind or start in time.
            ConfigError, ToolConflictError: The tools cannot be loaded or named.
        """
        with self._state_lock:
            if self._state is BridgeState.RUNNING:
                return
            self._prepare()
            self._start_server()
            self._state = BridgeState.RUNNING

    def stop(self) -> None:
        """Stop serving within about a second. Idempotent; never raises."""
        with self._state_lock:
            if self._state is not BridgeState.RUNNING:
                return
            self._state = BridgeState.STOPPED
            server, self._server, self._url = self._server, None, ""
            if server is not None:
                server.stop()  # bounded, never raises

    def __enter__(self) -> MCPBridge:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __del__(self) -> None:
        if getattr(self, "_state", None) is BridgeState.RUNNING:
            self.stop()

    # -- preparing the served tools -------------------------------------------------

    def _prepare(self) -> None:
        if self._served is not None:
            return
        from fastmcp import FastMCP

        source = load_tools(self._spec)
        originals = {tool.name: tool for tool in run_sync(source.list_tools)}
        visible = [name for name, tool in originals.items() if not _hidden(tool)]
        if self._requested_names is None:
            names = resolve_tool_conflicts(visible, self._builtin_names, self._prefix)
        else:
            names = self._check_requested(self._requested_names, originals, visible)
        served = [_ServedTool.wrap(self, new, originals[old]) for new, old in names.items()]
        self._source, self._names = source, names
        self._locked = frozenset(n for n, o in names.items() if LOCKED_TAG in originals[o].tags)
        self._specs = [
            ToolSpec(t.name, t.description or "", dict(t.parameters), frozenset(t.tags))
            for t in served
        ]
        self._served = FastMCP(
            "gym-harness-bridge",
            tools=served,
            on_duplicate="error",
            middleware=[_listing_watch(self)],
        )

    @staticmethod
    def _check_requested(
        requested: dict[str, str], originals: Mapping[str, Tool], visible: list[str]
    ) -> dict[str, str]:
        reserved = sorted(RESERVED_TOOL_NAMES.intersection(requested))
        if reserved:
            raise ToolConflictError(f"tool_names serves reserved names {reserved}")
        unknown = sorted(old for old in requested.values() if old not in originals)
        if unknown:
            raise ToolConflictError(f"tool_names names tools the env does not have: {unknown}")
        hidden = sorted(old for old in requested.values() if old not in visible)
        if hidden:
            raise ToolConflictError(f"tool_names would serve internal or reward tools {hidden}")
        return dict(requested)

    # -- calls (on the bridge loop) ---------------------------------------------------

    async def _call_for_orchestrator(self, name: str, args: dict[str, Any]) -> ToolCallResult:
        try:
            result = await self._invoke(name, args)
        except Exception as exc:  # a tool's failure is the orchestrator's result, not a crash
            return ToolCallResult(text=str(exc), is_error=True)
        text = "\n".join(getattr(block, "text", "") for block in result.content)
        return ToolCallResult(
            text=text, is_error=result.is_error, structured=result.structured_content
        )

    async def _invoke(self, served_name: str, arguments: dict[str, Any]) -> ToolResult:
        from fastmcp.exceptions import ToolError

        task = asyncio.ensure_future(self._call_source(served_name, arguments))
        try:
            done, _ = await asyncio.wait({task}, timeout=self.tool_timeout_s)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not done:
            # Cancelling a sync tool waits for its thread; don't wait, keep a reference.
            task.cancel()
            self._abandoned.add(task)
            task.add_done_callback(self._abandoned.discard)
            raise ToolError(f"tool {served_name!r} did not finish within {self.tool_timeout_s}s")
        return task.result()

    async def _serve_call(self, served_name: str, arguments: dict[str, Any]) -> ToolResult:
        """A harness's call over HTTP: counted, and a sign of life while it runs and when done."""
        self.tool_calls += 1
        self.in_flight += 1
        try:
            return await self._invoke(served_name, arguments)
        finally:
            self.in_flight -= 1
            self.last_activity = time.monotonic()

    async def _call_source(self, served_name: str, arguments: dict[str, Any]) -> ToolResult:
        assert self._source is not None
        original = self._names[served_name]
        lock = self._lock if served_name in self._locked else None
        if lock is None:
            return await self._source.call_tool(original, arguments)
        # Poll: a blocking acquire would stall the loop, one in a thread cannot be undone.
        while not lock.acquire(blocking=False):
            await asyncio.sleep(_LOCK_POLL_S)
        try:
            return await self._source.call_tool(original, arguments)
        finally:
            lock.release()

    # -- the server thread ------------------------------------------------------------

    def _start_server(self) -> None:
        from starlette.middleware import Middleware

        assert self._served is not None
        app = self._served.http_app(
            path=MCP_PATH,
            middleware=[Middleware(_BearerGuard, bridge=self)],
            host_origin_protection=True,
        )
        # In-flight calls get 0.4 s to finish when stopping.
        options = {"lifespan": "on", "timeout_graceful_shutdown": 0.4}
        server = LoopbackServer(
            app,
            label="bridge",
            thread_name="gym-harness-bridge",
            error=BridgeError,
            stop_timeout_s=_STOP_TIMEOUT_S,
            options=options,
        )
        server.start()
        self._server = server
        self._url = f"http://127.0.0.1:{server.port}{MCP_PATH}"


def _hidden(tool: Tool) -> bool:
    return bool(set(tool.tags) & HIDDEN_TAGS)


def _served_tool_class() -> type[Tool]:
    global _SERVED_TOOL_CLASS
    if _SERVED_TOOL_CLASS is None:
        from fastmcp.tools import Tool
        from pydantic import PrivateAttr

        class ServedTool(Tool):
            _bridge: Any = PrivateAttr(default=None)

            async def run(self, arguments: dict[str, Any]) -> ToolResult:
                return await self._bridge._serve_call(self.name, arguments)

        _SERVED_TOOL_CLASS = ServedTool
    return _SERVED_TOOL_CLASS


_SERVED_TOOL_CLASS: type[Tool] | None = None


def _listing_watch(bridge: MCPBridge) -> Any:
    """FastMCP middleware that sets ``bridge.tools_listed`` when a harness lists the tools."""
    from fastmcp.server.middleware import Middleware

    class ListingWatch(Middleware):
        async def on_list_tools(self, context: Any, call_next: Any) -> Any:
            result = await call_next(context)
            bridge.tools_listed = True
            return result

    return ListingWatch()


class _ServedTool:
    @staticmethod
    def wrap(bridge: MCPBridge, name: str, original: Tool) -> Tool:
        cls = _served_tool_class()
        tool = cls(
            name=name,
            title=original.title,
            description=original.description,
            parameters=original.parameters,
            output_schema=original.output_schema,
            annotations=original.annotations,
            tags=set(original.tags),
        )
        tool._bridge = bridge  # type: ignore[attr-defined]
        return tool
