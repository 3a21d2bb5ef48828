"""MCPBridge: the env's domain tools over streamable HTTP on 127.0.0.1.

The bridge serves the env's tools (see :mod:`gym_harness.bridge.tools`) and nothing
else: reserved names, internal and reward tools are never served. Every HTTP
request needs the bridge's bearer token; :meth:`MCPBridge.rotate_token` at each
reset locks out a harness from an earlier episode and closes its sessions and
connections. A foreign ``Host`` or ``Origin`` header is refused (DNS-rebinding
protection). The HTTP side and its bounds live in :mod:`gym_harness.bridge.http`
and :mod:`gym_harness.loopback.server`.

A tool cannot take the bridge down, hold the env lock past its real end, or
take more than ``tool_workers`` threads: see :mod:`gym_harness.bridge.tool_runner`.
If the bridge thread dies anyway, ``state`` says FAILED and ``start`` (each reset)
serves afresh.

Threads: the caller's thread owns the lifecycle (``start``/``stop``/
``rotate_token``) and never needs an event loop. The bridge thread (a
:class:`~gym_harness.loopback.server.LoopbackServer`) owns one asyncio loop; tool calls
run on it, sync tools in its worker threads. ``list_tools``/``call_tool`` are for
the env's orchestrator: they run in-process on the bridge loop (or a private one
before ``start``), not over HTTP.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gym_harness.bridge.fast_call import eligible_tools
from gym_harness.bridge.http import MCP_PATH, BridgeHTTP
from gym_harness.bridge.tool_runner import ToolRunner
from gym_harness.bridge.tools import (
    HIDDEN_TAGS,
    LOCKED_TAG,
    ToolSpec,
    load_tools,
    offered_names,
    resolve_tool_conflicts,
)
from gym_harness.errors import BridgeError, ConfigError
from gym_harness.lifecycle import Lifecycle
from gym_harness.loopback.connections import HEADER_TIMEOUT_S
from gym_harness.loopback.server import IDLE_TIMEOUT_S, LoopbackServer, RotatingToken, run_sync
from gym_harness.utils.interrupts import interrupts_held

if TYPE_CHECKING:
    from fastmcp import FastMCP
    from fastmcp.tools import Tool, ToolResult

    from gym_harness.config import HarnessConfig

__all__ = ["MCPBridge", "ToolCallResult"]

_STOP_TIMEOUT_S = 1.0
_CLOSE_TIMEOUT_S = 2.0
_RLOCK_TYPE = type(threading.RLock())
#: Default per-token session cap, sync-tool threads and request-body limit.
MAX_SESSIONS = 64
TOOL_WORKERS = 32
MAX_BODY_BYTES = 4 * 1024 * 1024


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


class MCPBridge(RotatingToken):
    """Serve an env's domain tools to a harness over loopback streamable HTTP.

    Args:
        tools: Anything :func:`gym_harness.bridge.tools.load_tools` accepts.
        builtin_names: The harness's own tool names. Every non-hidden tool is served
            under its own name, renamed with ``prefix`` where it clashes with one of them
            (:func:`~gym_harness.bridge.tools.resolve_tool_conflicts`).
        prefix: Prepended to a tool that clashes with a built-in.
        tool_timeout_s: A call running longer returns an MCP tool error (a hung sync
            tool keeps its worker thread until it returns; Python cannot kill it).
        lock: A ``threading.Lock`` held around every call of a tool tagged
            ``"locked"``; the tool must not take it again.
        max_sessions: MCP sessions one token (one episode) may have open at once; one
            more ``initialize`` gets a JSON-RPC error.
        tool_workers: Threads that run sync tools, at most. A call that finds them all
            taken waits for one within its ``tool_timeout_s``, then gets a "busy" tool error.
        max_body_bytes: Largest HTTP request body accepted (413 beyond it).
        header_timeout_s: A connection that has not sent a request's complete headers
            this long after opening (or going idle) is closed.
        idle_timeout_s: An idle keep-alive connection is closed after this long.

    Attributes:
        last_activity: ``time.monotonic()`` of the last authenticated request or the end
            of the last harness tool call (idle detection counts them as signs of life).
        tool_calls: Tool calls served over HTTP since construction.
        in_flight: Harness tool calls running now (the harness is waiting on the env).

    Raises:
        ConfigError: A bad timeout, bound or a reentrant lock.

    Example:
        >>> with MCPBridge([add]) as bridge:  # doctest: +SKIP
        ...     env["GYM_HARNESS_MCP_URL"], env["GYM_HARNESS_MCP_TOKEN"] = bridge.url, bridge.token
    """

    @classmethod
    def for_env(
        cls,
        tools: Any,
        builtin_names: Iterable[str],
        config: HarnessConfig,
        lock: threading.Lock,
    ) -> MCPBridge:
        """The bridge of an env: its harness's built-in tool names kept clear, the prefix,
        tool timeout, sessions and tool workers ``config`` says, and locked tools run
        holding ``lock``."""
        return cls(
            tools,
            builtin_names=builtin_names,
            prefix=config.tool_prefix,
            tool_timeout_s=config.tool_timeout_s,
            lock=lock,
            max_sessions=config.max_mcp_sessions,
            tool_workers=config.tool_workers,
        )

    def __init__(
        self,
        tools: Any,
        *,
        builtin_names: Iterable[str] = (),
        prefix: str = "env_",
        tool_timeout_s: float = 120.0,
        lock: threading.Lock | None = None,
        max_sessions: int = MAX_SESSIONS,
        tool_workers: int = TOOL_WORKERS,
        max_body_bytes: int = MAX_BODY_BYTES,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        for name, limit in (
            ("tool_timeout_s", tool_timeout_s),
            ("header_timeout_s", header_timeout_s),
            ("idle_timeout_s", idle_timeout_s),
        ):
            if not limit > 0:
                raise ConfigError(f"{name} must be > 0, got {limit}")
        if isinstance(lock, _RLOCK_TYPE):
            raise ConfigError("lock must be a threading.Lock: the bridge acquires it off-thread")
        for name, value in (
            ("max_sessions", max_sessions),
            ("tool_workers", tool_workers),
            ("max_body_bytes", max_body_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        self._spec = tools
        self._offered = offered_names(tools)
        self._builtin_names = frozenset(builtin_names)
        self._prefix = prefix
        self.tool_timeout_s = tool_timeout_s
        self._lock = lock
        self.max_sessions = max_sessions
        self.tool_workers = tool_workers
        self.max_body_bytes = max_body_bytes
        self._timeouts = (header_timeout_s, idle_timeout_s)
        super().__init__()
        self._state = Lifecycle.NEW
        self._state_lock = threading.Lock()
        self._source: FastMCP | None = None
        self._served: FastMCP | None = None
        self._names: dict[str, str] = {}
        self._runner: ToolRunner | None = None
        self._fast: frozenset[str] = frozenset()  # tools a plain tools/call reaches directly
        self._specs: list[ToolSpec] = []
        self._server: LoopbackServer | None = None
        self._http: BridgeHTTP | None = None
        self._url = ""
        self.last_activity = time.monotonic()
        self.tool_calls = 0
        self.in_flight = 0
        #: True once a harness holding the current token listed the tools (``tools/list``):
        #: the env's proof that a harness which reports no tool list loaded them.
        self.tools_listed = False

    @property
    def state(self) -> Lifecycle:
        """The lifecycle state; FAILED as soon as the bridge thread or loop has died."""
        server = self._server
        if self._state is Lifecycle.RUNNING and (server is None or not server.alive):
            return Lifecycle.FAILED
        return self._state

    def close_connections(self) -> None:
        """Close every open connection of the server (its front end calls this at rotation)."""
        server = self._server
        if server is not None:
            server.close_connections()

    @property
    def busy(self) -> bool:
        """True while a harness tool call runs (the harness waits on the env): ``Liveness``."""
        return self.in_flight > 0

    @property
    def failure(self) -> str:
        """Why the bridge died on its own ("" while it serves, and after :meth:`stop`)."""
        if self.state is not Lifecycle.FAILED:
            return ""
        server = self._server
        why = server.failure if server is not None else ""
        return (why or "the bridge thread ended") + "; the next reset() restarts the bridge"

    @property
    def url(self) -> str:
        """The MCP endpoint, ``http://127.0.0.1:<port>/mcp`` ("" unless running)."""
        return self._url if self.state is Lifecycle.RUNNING else ""

    def rotate_token(self) -> str:
        """Replace the bearer token and close every session and connection of the old one.

        Requests with the old token get 401 from now on.

        Returns:
            The new token (``tools_listed`` is False again until a harness lists the tools).
        """
        self.tools_listed = False
        token = super().rotate_token()
        server, http = self._server, self._http
        loop = server.loop if server is not None else None
        if loop is not None and http is not None:
            future = asyncio.run_coroutine_threadsafe(http.close_all(), loop)
            try:
                future.result(_CLOSE_TIMEOUT_S)
            except Exception:  # bounded; a dead loop is reported by ``state``
                future.cancel()
        return token

    def list_tools(self) -> list[ToolSpec]:
        """The tools offered now, under their served names (no HTTP, no running loop
        needed): all served tools, or those an ``OfferedTools`` spec offers at the moment.

        Raises:
            ConfigError, ToolConflictError: The tools cannot be loaded or named.
        """
        self._prepare()
        offered = self.offered()
        return [spec for spec in self._specs if offered is None or spec.name in offered]

    def offered(self) -> frozenset[str] | None:
        """The served names offered now, or ``None`` when every served tool is."""
        if self._offered is None:
            return None
        originals = self._offered()
        if originals is None:
            return None
        wanted = frozenset(originals)
        return frozenset(new for new, old in self._names.items() if old in wanted)

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
        server = self._server
        loop = server.loop if server is not None else None
        if self.state is not Lifecycle.RUNNING or loop is None:
            return run_sync(lambda: self._call_for_orchestrator(name, args), limit)
        future = asyncio.run_coroutine_threadsafe(self._call_for_orchestrator(name, args), loop)
        try:
            return future.result(limit)
        except TimeoutError as exc:
            future.cancel()
            raise BridgeError(f"the bridge did not answer a call of {name!r} in {limit}s") from exc

    def start(self) -> None:
        """Bind 127.0.0.1 on an OS-chosen port and serve until :meth:`stop`.

        A FAILED bridge is cleaned up and started afresh (on a new port).

        Raises:
            BridgeError: The server could not bind or start in time.
            ConfigError, ToolConflictError: The tools cannot be loaded or named.
        """
        with self._state_lock, interrupts_held():  # whole: no server thread left unowned
            if self.state is Lifecycle.RUNNING:
                return
            self._shut()
            self._prepare()
            self._start_server()
            self._state = Lifecycle.RUNNING

    def stop(self) -> None:
        """Stop serving, bounded (milliseconds unless a call is stuck). Idempotent; never raises."""
        with self._state_lock, interrupts_held():
            if self._state is not Lifecycle.RUNNING:
                return
            self._state = Lifecycle.STOPPED
            self._shut()

    def _shut(self) -> None:
        server, self._server, self._http, self._url = self._server, None, None, ""
        if server is not None:
            server.stop()  # bounded, never raises

    def __enter__(self) -> MCPBridge:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __del__(self) -> None:
        if getattr(self, "_state", None) is Lifecycle.RUNNING:
            self.stop()

    # -- preparing the served tools -------------------------------------------------

    def _prepare(self) -> None:
        if self._served is not None:
            return
        source = load_tools(self._spec)
        originals = {tool.name: tool for tool in run_sync(source.list_tools)}
        visible = [name for name, tool in originals.items() if not _hidden(tool)]
        names = resolve_tool_conflicts(visible, self._builtin_names, self._prefix)
        served = [_ServedTool.wrap(self, new, originals[old]) for new, old in names.items()]
        self._source, self._names = source, names
        self._runner = ToolRunner(
            source,
            {new: originals[old] for new, old in names.items()},
            names,
            locked=frozenset(n for n, o in names.items() if LOCKED_TAG in originals[o].tags),
            lock=self._lock,
            timeout_s=self.tool_timeout_s,
            workers=self.tool_workers,
        )
        self._fast = eligible_tools({new: originals[old] for new, old in names.items()})
        self._specs = [
            ToolSpec(t.name, t.description or "", dict(t.parameters), frozenset(t.tags))
            for t in served
        ]
        self._served = _served_server_class()(
            "gym-harness-bridge",
            tools=served,
            on_duplicate="error",
            # A plain tools/call skips this server's middleware (bridge/fast_call.py): what
            # is added here may watch tools/list, never a call.
            middleware=[_listing_watch(self)],
        )
        self._served.fixed_tools = {tool.name: tool for tool in served}  # type: ignore[attr-defined]

    # -- calls (on the bridge loop) ---------------------------------------------------

    async def _call_for_orchestrator(self, name: str, args: dict[str, Any]) -> ToolCallResult:
        try:
            assert self._runner is not None
            result = await self._runner.invoke(name, args, own_context=True)
        except Exception as exc:  # a tool's failure is the orchestrator's result, not a crash
            return ToolCallResult(text=str(exc), is_error=True)
        text = "\n".join(getattr(block, "text", "") for block in result.content)
        return ToolCallResult(
            text=text, is_error=result.is_error, structured=result.structured_content
        )

    async def _serve_call(self, served_name: str, arguments: dict[str, Any]) -> ToolResult:
        """A harness's call over HTTP: counted, and a sign of life while it runs and when done."""
        self.tool_calls += 1
        self.in_flight += 1
        try:
            assert self._runner is not None
            return await self._runner.invoke(served_name, arguments)
        finally:
            self.in_flight -= 1
            self.last_activity = time.monotonic()

    # -- the server thread ------------------------------------------------------------

    def _start_server(self) -> None:
        assert self._served is not None
        http = BridgeHTTP(
            self,
            self._served,
            max_sessions=self.max_sessions,
            max_body_bytes=self.max_body_bytes,
            tool_workers=self.tool_workers,
            fast_tools=self._fast,
        )
        server = LoopbackServer(
            http,
            label="bridge",
            thread_name="gym-harness-bridge",
            error=BridgeError,
            stop_timeout_s=_STOP_TIMEOUT_S,
            options={"timeout_keep_alive": self._timeouts[1]},
            context=http.serving,
            header_timeout_s=self._timeouts[0],
            quick=http,
        )
        self._http = http
        try:
            server.start()
        except BaseException:
            self._http = None
            raise
        http.port = server.port
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


def _served_server_class() -> type[FastMCP]:
    global _SERVED_SERVER_CLASS
    if _SERVED_SERVER_CLASS is None:
        from fastmcp import FastMCP

        class ServedServer(FastMCP):
            """The served tools are fixed (no transforms, visibility or auth): a call finds
            its tool in a dict, not through FastMCP's provider aggregation (tasks, gather)."""

            fixed_tools: dict[str, Tool] = {}  # replaced per instance in _prepare

            async def get_tool(self, name: str, version: Any = None) -> Tool | None:
                tool = self.fixed_tools.get(name) if version is None else None
                return tool if tool is not None else await super().get_tool(name, version=version)

        _SERVED_SERVER_CLASS = ServedServer
    return _SERVED_SERVER_CLASS


_SERVED_SERVER_CLASS: type[FastMCP] | None = None


def _listing_watch(bridge: MCPBridge) -> Any:
    """FastMCP middleware that sets ``bridge.tools_listed`` when a harness lists the tools,
    and keeps from the listing the tools an ``OfferedTools`` spec does not offer now."""
    from fastmcp.server.middleware import Middleware

    class ListingWatch(Middleware):
        async def on_list_tools(self, context: Any, call_next: Any) -> Any:
            result = await call_next(context)
            bridge.tools_listed = True
            offered = bridge.offered()
            return result if offered is None else [t for t in result if t.name in offered]

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
