"""The reference agent's MCP client: the bridge's tools over one streamable-HTTP session.

A sibling of ``reference.py``, imported by it both as ``gym_harness.agents._mcp_tools``
and, when the agent runs as a plain script, as the top-level module ``_mcp_tools``:
so it imports nothing from gym_harness, and the MCP client only lazily (it costs
most of a second; ``start_prewarm`` does it in the background right after ``ready``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio
    import concurrent.futures
    import threading

    from mcp import ClientSession

__all__ = ["MCPTools", "await_prewarm", "describe", "start_prewarm"]

_CONNECT_TIMEOUT_S = 30.0
_CLOSE_TIMEOUT_S = 5.0


def describe(exc: BaseException) -> str:
    """``"Type: message"`` of ``exc``, or of the first error inside its exception groups."""
    # anyio task groups wrap the real cause in (nested) exception groups.
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


_prewarm: threading.Thread | None = None


def start_prewarm(tools: MCPTools) -> None:
    """Import the MCP client and open the session in the background, right after ready.

    The imports cost most of a second (httpcore2 pulls in trio, tool results pull
    in jsonschema), the session a few round trips more; done here they are usually
    finished before the first message arrives. Failures are left for the first
    real use to report.
    """
    import threading

    def run() -> None:
        try:
            import asyncio  # noqa: F401

            import httpcore2  # noqa: F401
            import httpx2  # noqa: F401
            import jsonschema  # noqa: F401
            from mcp import types  # noqa: F401
            from mcp.client.session import ClientSession  # noqa: F401
            from mcp.client.streamable_http import streamable_http_client  # noqa: F401

            tools.connect_quietly()
        except BaseException:
            return

    global _prewarm
    _prewarm = threading.Thread(target=run, name="prewarm", daemon=True)
    _prewarm.start()


def await_prewarm() -> None:
    """Wait (bounded) for ``start_prewarm``'s thread before using the MCP client."""
    # The mcp package has import cycles: importing it from two threads at once can
    # fail with "partially initialized module", so the main thread waits its turn.
    if _prewarm is not None:
        _prewarm.join(timeout=_CONNECT_TIMEOUT_S + _CLOSE_TIMEOUT_S)


class MCPTools:
    """The bridge's tools through one MCP session kept open across turns.

    The session lives in a task on a private asyncio loop in a daemon thread
    (anyio scopes must be entered and left by one task); the main thread submits
    calls to that loop and waits for them with a bound.

    Args:
        url: The bridge's streamable-HTTP URL ("" when there is no bridge).
        token: The bearer token.
        call_timeout_s: Longest wait for one tool call.
    """

    def __init__(self, url: str, token: str, call_timeout_s: float) -> None:
        self._url = url
        self._token = token
        self._call_timeout_s = call_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._holder: concurrent.futures.Future[None] | None = None
        self._session: ClientSession | None = None
        self._closing: asyncio.Event | None = None

    def list_tools(self) -> list[dict[str, Any]]:
        """Return ``{"name", "description", "input_schema"}`` for every tool.

        Raises:
            RuntimeError: There is no bridge, or listing failed.
        """
        await_prewarm()
        from mcp import types

        async def list_all(session: ClientSession) -> list[types.Tool]:
            tools: list[types.Tool] = []
            cursor: str | None = None
            while True:
                params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await session.list_tools(params=params)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return tools

        tools = self._run(list_all(self._connect()))
        return [
            {"name": t.name, "description": t.description or "", "input_schema": t.input_schema}
            for t in tools
        ]

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Call one tool; return ``(content text, is_error)``. Never raises."""
        await_prewarm()
        from mcp import types

        try:
            result = self._run(self._connect().call_tool(name, arguments))
        except Exception as exc:
            return str(exc), True
        parts = []
        for block in result.content:
            if isinstance(block, types.TextContent):
                parts.append(block.text)
            else:
                parts.append(json.dumps(block.model_dump(mode="json", exclude_none=True)))
        if not parts and result.structured_content is not None:
            parts.append(json.dumps(result.structured_content))
        return "\n".join(parts), bool(result.is_error)

    def connect_quietly(self) -> None:
        """Open the session now if there is a bridge; errors wait for the first real use."""
        if self._url:
            try:
                self._connect()
            except RuntimeError:
                return

    def close(self) -> None:
        """End the session (the server sees a clean DELETE) and stop the loop thread."""
        loop, holder = self._loop, self._holder
        if loop is None:
            return
        if holder is not None and not holder.done() and self._closing is not None:
            loop.call_soon_threadsafe(self._closing.set)
            try:
                holder.result(timeout=_CLOSE_TIMEOUT_S)
            except BaseException:
                holder.cancel()
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=_CLOSE_TIMEOUT_S)
        if not loop.is_running():
            loop.close()
        self._loop = self._thread = self._holder = self._session = None

    def _run(self, coro: Any) -> Any:
        import asyncio
        import concurrent.futures

        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout=self._call_timeout_s)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise RuntimeError(f"no answer from the MCP bridge in {self._call_timeout_s}s") from exc
        except Exception as exc:
            raise RuntimeError(describe(exc)) from exc

    def _connect(self) -> ClientSession:
        import asyncio
        import concurrent.futures
        import threading

        if self._session is not None and self._holder is not None and not self._holder.done():
            return self._session
        if not self._url:
            raise RuntimeError("no MCP bridge: GYM_HARNESS_MCP_URL is not set")
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=self._loop.run_forever, name="mcp-client", daemon=True
            )
            self._thread.start()
        ready: concurrent.futures.Future[ClientSession] = concurrent.futures.Future()
        self._holder = asyncio.run_coroutine_threadsafe(self._hold(ready), self._loop)
        try:
            self._session = ready.result(timeout=_CONNECT_TIMEOUT_S)
        except concurrent.futures.TimeoutError as exc:
            self._holder.cancel()
            raise RuntimeError(f"MCP bridge at {self._url} did not answer in time") from exc
        except Exception as exc:
            raise RuntimeError(
                f"cannot open an MCP session at {self._url}: {describe(exc)}"
            ) from exc
        return self._session

    async def _hold(self, ready: concurrent.futures.Future[ClientSession]) -> None:
        import asyncio

        import httpx2
        from mcp.client.session import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        self._closing = asyncio.Event()
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        timeout = httpx2.Timeout(_CONNECT_TIMEOUT_S, read=self._call_timeout_s)
        try:
            async with (
                httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
                streamable_http_client(self._url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                ready.set_result(session)
                await self._closing.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(exc))
            raise
