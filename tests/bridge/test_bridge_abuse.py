"""The bridge under hostile tools and clients: exits, dead loops, sessions, locks, pools.

A real bridge on 127.0.0.1, a real MCP client (fastmcp's, or raw JSON-RPC over httpx2
for the session-based protocol versions that real CLIs speak), real harness processes
for the env-level checks.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import httpx2
import pytest
from fastmcp import Client, Context, FastMCP
from fastmcp.client.transports import StreamableHttpTransport
from support.gate import Gate

from gym_harness import HarnessEnv, tool_tags
from gym_harness.bridge.server import MCPBridge
from gym_harness.bridge.tools import LOCKED_TAG
from gym_harness.lifecycle import Lifecycle
from gym_harness.outcome import Outcome

LEGACY_VERSION = "2025-06-18"


def _client(bridge: MCPBridge) -> Client[Any]:
    return Client(StreamableHttpTransport(bridge.url, auth=bridge.token), timeout=30)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def exits(code: int) -> str:
    """What argparse does with bad arguments."""
    sys.exit(code)


def interrupts() -> str:
    """Raise KeyboardInterrupt in a worker thread."""
    raise KeyboardInterrupt


async def exits_async() -> str:
    """Raise SystemExit on the bridge loop itself."""
    raise SystemExit(4)


async def interrupts_async() -> str:
    """Raise KeyboardInterrupt on the bridge loop itself."""
    raise KeyboardInterrupt


async def kill_loop() -> str:
    """Make the bridge loop die past every guard of a tool call."""

    def die() -> None:
        raise SystemExit("the loop was killed on purpose")

    asyncio.get_running_loop().call_soon(die)
    return "scheduled"


EXITING = [add, exits, interrupts, exits_async, interrupts_async]


# -- exits are tool errors ------------------------------------------------------------


@pytest.mark.parametrize("tool", ["exits", "interrupts", "exits_async", "interrupts_async"])
def test_exiting_tool_is_a_tool_error_and_the_bridge_lives_on(tool: str) -> None:
    args = {"code": 2} if tool == "exits" else {}

    async def calls(bridge: MCPBridge) -> None:
        async with _client(bridge) as client:
            for _ in range(2):
                result = await client.call_tool(tool, args, raise_on_error=False)
                assert result.is_error
                assert "must not exit" in result.content[0].text  # type: ignore[union-attr]
                assert (await client.call_tool("add", {"a": 1, "b": 2})).data == 3

    with MCPBridge(EXITING) as bridge:
        asyncio.run(calls(bridge))
        assert bridge.state is Lifecycle.RUNNING
        bridge.rotate_token()  # the next episode
        asyncio.run(calls(bridge))
        orchestrator = bridge.call_tool(tool, args)
        assert orchestrator.is_error and "must not exit" in orchestrator.text
        assert bridge.state is Lifecycle.RUNNING


def test_exit_in_one_step_then_tools_work_in_that_episode_and_the_next() -> None:
    env = HarnessEnv("reference", tools=[add, exits])
    try:
        env.reset()
        reply, _, terminated, _, info = env.step('/call exits {"code": 2}')
        assert "exits failed" in reply and "must not exit" in reply
        assert (terminated, info["error_type"]) == (False, Outcome.OK)
        reply, _, terminated, _, info = env.step('/call add {"a": 2, "b": 3}')
        assert "add -> 5" in reply and not terminated and info["error_type"] == Outcome.OK
        env.reset()
        reply, _, _, _, info = env.step('/call add {"a": 4, "b": 5}')
        assert "add -> 9" in reply and info["error_type"] == Outcome.OK
    finally:
        env.close()


# -- a dead loop is bridge_failed, and reset restarts -----------------------------------


def test_dead_bridge_loop_is_reported_and_restarted() -> None:
    with MCPBridge([add, kill_loop]) as bridge:
        port = bridge.url
        bridge.call_tool("kill_loop")
        deadline = time.monotonic() + 5
        while bridge.state is not Lifecycle.FAILED and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bridge.state is Lifecycle.FAILED
        assert "loop was killed on purpose" in bridge.failure and bridge.url == ""
        assert bridge.call_tool("add", {"a": 1, "b": 1}).text == "2"  # on a private loop
        bridge.start()
        assert bridge.state is Lifecycle.RUNNING and bridge.url != port

        async def call() -> Any:
            async with _client(bridge) as client:
                return (await client.call_tool("add", {"a": 2, "b": 2})).data

        assert asyncio.run(call()) == 4


def test_step_during_which_the_bridge_died_is_bridge_failed() -> None:
    env = HarnessEnv("reference", tools=[add, kill_loop])
    try:
        env.reset()
        reply, _, terminated, truncated, info = env.step("/call kill_loop {}")
        assert info["error_type"] == Outcome.BRIDGE_FAILED
        assert (terminated, truncated) == (True, False)
        assert "loop was killed on purpose" in info["error"]
        assert any(e["data"].get("error_type") == "bridge_failed" for e in info["events"])
        env.reset()  # restarts the bridge
        reply, _, terminated, _, info = env.step('/call add {"a": 2, "b": 3}')
        assert "add -> 5" in reply and info["error_type"] == Outcome.OK and not terminated
    finally:
        env.close()


# -- sessions belong to a token ---------------------------------------------------------


class Legacy:
    """A raw client of the session-based protocol (``initialize``, ``mcp-session-id``)."""

    def __init__(self, bridge: MCPBridge) -> None:
        self.bridge = bridge
        self.http = httpx2.Client(timeout=10)
        self.ids = iter(range(1, 1 << 30))

    def headers(self, session: str | None = None) -> dict[str, str]:
        out = {
            "authorization": f"Bearer {self.bridge.token}",
            "accept": "application/json, text/event-stream",
        }
        if session is not None:
            out |= {"mcp-session-id": session, "mcp-protocol-version": LEGACY_VERSION}
        return out

    def open(self) -> httpx2.Response:
        body = {
            "jsonrpc": "2.0",
            "id": next(self.ids),
            "method": "initialize",
            "params": {
                "protocolVersion": LEGACY_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "legacy", "version": "0"},
            },
        }
        response = self.http.post(self.bridge.url, json=body, headers=self.headers())
        session = response.headers.get("mcp-session-id")
        if session is not None:
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            self.http.post(self.bridge.url, json=note, headers=self.headers(session))
        return response

    def call(self, session: str, name: str, arguments: dict[str, Any]) -> httpx2.Response:
        body = {
            "jsonrpc": "2.0",
            "id": next(self.ids),
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments},
        }
        return self.http.post(self.bridge.url, json=body, headers=self.headers(session))

    def close(self) -> None:
        self.http.close()


def test_session_cap_refuses_initialize_while_open_sessions_work() -> None:
    with MCPBridge([add], max_sessions=5) as bridge:
        legacy = Legacy(bridge)
        try:
            opened = [legacy.open() for _ in range(5)]
            assert all(r.status_code == 200 for r in opened)
            assert opened[0].headers["content-type"].startswith("application/json")  # not SSE
            sessions = [r.headers["mcp-session-id"] for r in opened]
            refused = legacy.open()
            assert refused.status_code == 429
            error = refused.json()["error"]
            assert "too many MCP sessions" in error["message"]
            assert "max_mcp_sessions" in error["message"]
            for session in sessions:
                answer = legacy.call(session, "add", {"a": 1, "b": 2})
                assert answer.json()["result"]["structuredContent"] == {"result": 3}
            assert bridge._http is not None and bridge._http.session_count(bridge.token) == 5

            bridge.rotate_token()  # the next episode: every old session is gone
            assert bridge._http.sessions == {}
            assert bridge._http.manager._server_instances == {}
            again = [legacy.open() for _ in range(5)]
            assert all(r.status_code == 200 for r in again)
            stale = legacy.call(sessions[0], "add", {"a": 1, "b": 2})
            assert stale.status_code == 404  # the new token cannot reach an old session
        finally:
            legacy.close()


def test_session_flood_is_bounded_and_later_episodes_are_unaffected() -> None:
    with MCPBridge([add], max_sessions=64) as bridge:
        legacy = Legacy(bridge)
        try:
            codes = [legacy.open().status_code for _ in range(200)]
            assert codes.count(200) == 64 and codes.count(429) == 136
            assert bridge._http is not None and len(bridge._http.manager._server_instances) == 64
            bridge.rotate_token()
            fresh = legacy.open()
            assert fresh.status_code == 200
            answer = legacy.call(fresh.headers["mcp-session-id"], "add", {"a": 2, "b": 2})
            assert answer.json()["result"]["structuredContent"] == {"result": 4}
            assert len(bridge._http.manager._server_instances) == 1
        finally:
            legacy.close()


# -- locked tools and the worker pool ---------------------------------------------------


def test_timed_out_locked_tool_keeps_the_lock_until_it_really_ends(gate: Gate) -> None:
    lock = threading.Lock()

    @tool_tags(LOCKED_TAG)
    def hold() -> str:
        """Hold the env lock until the gate opens."""
        return gate.hang()

    @tool_tags(LOCKED_TAG)
    def touch() -> bool:
        """Touch env state under the lock."""
        return lock.locked()

    with MCPBridge([hold, touch, add], lock=lock, tool_timeout_s=0.5) as bridge:

        async def calls() -> None:
            async with _client(bridge) as client:
                first = await client.call_tool("hold", {}, raise_on_error=False)
                assert first.is_error
                assert "keeps the env lock" in first.content[0].text  # type: ignore[union-attr]
                assert lock.locked()
                busy = await client.call_tool("touch", {}, raise_on_error=False)
                assert busy.is_error
                assert "env busy" in busy.content[0].text  # type: ignore[union-attr]
                assert (await client.call_tool("add", {"a": 1, "b": 1})).data == 2
                gate.event.set()
                deadline = time.monotonic() + 5
                while lock.locked() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert not lock.locked()
                assert (await client.call_tool("touch", {})).data is True

        asyncio.run(calls())


def test_locked_async_tool_that_ignores_cancellation_keeps_the_lock() -> None:
    lock = threading.Lock()
    release = threading.Event()

    @tool_tags(LOCKED_TAG)
    async def stubborn() -> str:
        """Ignore the first cancellation, then finish when released."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            while not release.is_set():
                await asyncio.sleep(0.01)
        return "done"

    with MCPBridge([stubborn], lock=lock, tool_timeout_s=0.3) as bridge:
        result = bridge.call_tool("stubborn")
        assert result.is_error and "did not finish" in result.text
        assert lock.locked()
        release.set()
        deadline = time.monotonic() + 5
        while lock.locked() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not lock.locked()


def test_full_worker_pool_is_busy_and_never_one_more_thread(gate: Gate) -> None:
    def hang() -> str:
        """A sync tool that hangs until the gate opens."""
        return gate.hang()

    with MCPBridge([hang, add], tool_workers=2, tool_timeout_s=0.5) as bridge:
        assert bridge.call_tool("add", {"a": 1, "b": 1}).text == "2"  # one worker exists
        before = threading.active_count()

        async def flood() -> list[Any]:
            async with _client(bridge) as client:
                calls = [client.call_tool("hang", {}, raise_on_error=False) for _ in range(8)]
                return list(await asyncio.gather(*calls))

        results = asyncio.run(flood())
        texts = [r.content[0].text for r in results]
        assert sum("did not finish" in t for t in texts) == 2
        assert sum(t.startswith("busy: all 2 tool worker threads") for t in texts) == 6
        assert threading.active_count() <= before + 1  # at most the second worker
        gate.event.set()
        deadline = time.monotonic() + 5
        while (
            bridge._runner is not None
            and bridge._runner.busy_workers
            and (time.monotonic() < deadline)
        ):
            time.sleep(0.01)
        assert bridge.call_tool("add", {"a": 2, "b": 2}).text == "4"


# -- one pass through FastMCP -------------------------------------------------------------


class CountingServer(FastMCP):
    """A tool server that counts how often its own ``call_tool`` runs."""

    calls = 0

    async def call_tool(self, *args: Any, **kwargs: Any) -> Any:
        type(self).calls += 1
        return await super().call_tool(*args, **kwargs)


def test_a_call_runs_the_tool_once_and_skips_the_source_server() -> None:
    runs = []

    def count(text: str) -> str:
        """Record each run."""
        runs.append(text)
        return text

    server = CountingServer("counting", tools=[count])
    CountingServer.calls = 0
    with MCPBridge(server) as bridge:

        async def go() -> Any:
            async with _client(bridge) as client:
                return (await client.call_tool("count", {"text": "x"})).data

        assert asyncio.run(go()) == "x"
    assert runs == ["x"]
    assert CountingServer.calls == 0


def test_source_server_middleware_is_still_honoured() -> None:
    from fastmcp.server.middleware import Middleware

    seen: list[str] = []

    class Audit(Middleware):
        async def on_call_tool(self, context: Any, call_next: Any) -> Any:
            seen.append(context.message.name)
            return await call_next(context)

    server = FastMCP("audited", tools=[add], middleware=[Audit()])
    with MCPBridge(server) as bridge:
        assert bridge.call_tool("add", {"a": 1, "b": 2}).text == "3"
    assert seen == ["add"]


def test_tools_taking_a_context_work_over_http_and_in_process() -> None:
    server = FastMCP("ctx")

    @server.tool
    async def who(a: int, ctx: Context) -> str:
        """Name the context the tool got."""
        return f"{a} {type(ctx).__name__}"

    with MCPBridge(server) as bridge:
        assert bridge.call_tool("who", {"a": "5"}).text == "5 Context"

        async def go() -> Any:
            async with _client(bridge) as client:
                return (await client.call_tool("who", {"a": 7})).data

        assert asyncio.run(go()) == "7 Context"
