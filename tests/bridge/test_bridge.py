"""Tests for MCPBridge: a real bridge, a real MCP client over loopback HTTP."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import psutil
import pytest
from fastmcp import Client, FastMCP
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from support import sample_tools
from support.gate import Gate

from gym_harness.bridge.server import MCPBridge
from gym_harness.bridge.tools import INTERNAL_TAG, LOCKED_TAG, REWARD_TAG, OfferedTools
from gym_harness.errors import ConfigError, ToolConflictError
from gym_harness.lifecycle import Lifecycle

_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
_ACCEPT = "application/json, text/event-stream"


def _client(bridge: MCPBridge, token: str | None = None) -> Client[Any]:
    return Client(StreamableHttpTransport(bridge.url, auth=token or bridge.token), timeout=30)


def _raw_post(url: str, headers: dict[str, str]) -> httpx2.Response:
    with httpx2.Client(timeout=10) as http:
        return http.post(url, json=_INIT, headers={"accept": _ACCEPT, **headers})


@pytest.fixture
def bridge_args(gate: Gate) -> tuple[Any, dict[str, Any]]:
    def boom(reason: str) -> str:
        """Always fails."""
        raise RuntimeError(f"tool failed: {reason}")

    def big(size: int) -> str:
        """A large result."""
        return "x" * size

    def read(path: str) -> str:
        """Clashes with a harness built-in; served as env_read."""
        return f"contents of {path}"

    server = FastMCP("env")
    for fn in (sample_tools.echo, sample_tools.add, boom, big, read, gate.hang):
        server.tool(fn)
    server.tool(sample_tools.peek_answer, tags={INTERNAL_TAG})
    server.tool(sample_tools.score, tags={REWARD_TAG})
    return server, {"builtin_names": {"read"}, "tool_timeout_s": 1.0}


def test_list_and_call_over_http(bridge: MCPBridge) -> None:
    async def go() -> None:
        async with _client(bridge) as client:
            names = {t.name for t in await client.list_tools()}
            assert names == {"echo", "add", "boom", "big", "env_read", "hang"}
            result = await client.call_tool("add", {"a": 2, "b": 40})
            assert result.data == 42

    asyncio.run(go())
    assert bridge.tool_calls == 1


def test_missing_or_wrong_token_is_401(bridge: MCPBridge) -> None:
    assert _raw_post(bridge.url, {}).status_code == 401
    assert _raw_post(bridge.url, {"authorization": "Bearer wrong"}).status_code == 401
    assert _raw_post(bridge.url, {"authorization": bridge.token}).status_code == 401
    ok = _raw_post(bridge.url, {"authorization": f"Bearer {bridge.token}"})
    assert ok.status_code == 200


def test_stale_token_is_locked_out_after_rotation(bridge: MCPBridge) -> None:
    old = bridge.token
    new = bridge.rotate_token()
    assert new != old and bridge.token == new
    assert _raw_post(bridge.url, {"authorization": f"Bearer {old}"}).status_code == 401

    async def go() -> None:
        with pytest.raises(MCPError):
            async with _client(bridge, token=old) as client:
                await client.list_tools()
        async with _client(bridge) as client:
            assert (await client.call_tool("echo", {"text": "hi"})).data == "hi"

    asyncio.run(go())


def test_session_opened_before_rotation_is_cut_off(bridge: MCPBridge) -> None:
    async def go() -> None:
        async with _client(bridge) as client:
            await client.call_tool("echo", {"text": "before"})
            bridge.rotate_token()
            with pytest.raises(MCPError):
                await client.call_tool("echo", {"text": "after"})

    asyncio.run(go())


def test_foreign_host_or_origin_is_refused(bridge: MCPBridge) -> None:
    auth = {"authorization": f"Bearer {bridge.token}"}
    port = urlsplit(bridge.url).port
    assert _raw_post(bridge.url, {**auth, "host": "evil.example"}).status_code == 421
    assert _raw_post(bridge.url, {**auth, "origin": "http://evil.example"}).status_code == 403
    local = _raw_post(bridge.url, {**auth, "origin": f"http://localhost:{port}"})
    assert local.status_code == 200


def test_internal_reward_and_reserved_tools_are_never_served(bridge: MCPBridge) -> None:
    served = {spec.name for spec in bridge.list_tools()}
    assert not served & {"peek_answer", "score", "read", "reset", "step", "state", "close"}

    async def go() -> None:
        async with _client(bridge) as client:
            for hidden in ("peek_answer", "score", "read"):
                with pytest.raises(ToolError):
                    await client.call_tool(hidden, {})

    asyncio.run(go())


def test_reserved_names_refuse_to_start() -> None:
    server = FastMCP("bad")

    @server.tool
    def reset() -> str:
        return "should never be served"

    with pytest.raises(ToolConflictError, match="reset"):
        MCPBridge(server).start()


def test_renamed_tool_reaches_the_original(bridge: MCPBridge) -> None:
    async def go() -> str:
        async with _client(bridge) as client:
            return (await client.call_tool("env_read", {"path": "/a"})).data  # type: ignore[no-any-return]

    assert asyncio.run(go()) == "contents of /a"


def test_builtin_clash_is_renamed_by_the_bridge_itself() -> None:
    def read(path: str) -> str:
        """Clashes with a harness built-in."""
        return f"contents of {path}"

    bridge = MCPBridge([read, sample_tools.echo], builtin_names={"read"}, prefix="env_")
    assert [spec.name for spec in bridge.list_tools()] == ["env_read", "echo"]
    assert bridge.call_tool("env_read", {"path": "/b"}).text == "contents of /b"
    with pytest.raises(ToolConflictError, match="taken"):
        MCPBridge([read], builtin_names={"read", "x_read"}, prefix="x_").list_tools()


def test_offered_tools_list_only_what_is_offered_at_each_listing() -> None:
    def read(path: str) -> str:
        """Clashes with a harness built-in; served as env_read."""
        return f"contents of {path}"

    offer: list[set[str] | None] = [{"echo"}]
    spec = OfferedTools([read, sample_tools.echo, sample_tools.add], lambda: offer[0])
    bridge = MCPBridge(spec, builtin_names={"read"})

    async def listed() -> list[str]:
        async with _client(bridge) as client:
            return [t.name for t in await client.list_tools()]

    with bridge:
        assert [t.name for t in bridge.list_tools()] == ["echo"]
        assert asyncio.run(listed()) == ["echo"]
        offer[0] = {"add", "read"}  # by original name; the listing shows the served one
        assert asyncio.run(listed()) == ["env_read", "add"]
        offer[0] = None
        assert asyncio.run(listed()) == ["env_read", "echo", "add"]
        offer[0] = set()
        assert asyncio.run(listed()) == []
        # The offer governs listings only: a tool that must refuse calls checks it itself.
        assert bridge.call_tool("add", {"a": 1, "b": 2}).text == "3"


def test_twenty_concurrent_calls() -> None:
    active, peak, guard = [0], [0], threading.Lock()

    def slow_echo(text: str) -> str:
        """Echo after a pause, recording how many run at once."""
        with guard:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        with guard:
            active[0] -= 1
        return text

    async def go(bridge: MCPBridge) -> list[Any]:
        async with _client(bridge) as client:
            calls = [client.call_tool("slow_echo", {"text": str(i)}) for i in range(20)]
            return [r.data for r in await asyncio.gather(*calls)]

    with MCPBridge([slow_echo]) as bridge:
        assert asyncio.run(go(bridge)) == [str(i) for i in range(20)]
        assert bridge.tool_calls == 20
    assert peak[0] > 1  # sync tools ran in worker threads, not one after another


def test_locked_tools_hold_the_env_lock() -> None:
    lock = threading.Lock()
    active, peak = [0], [0]

    def touch_state() -> bool:
        """Touch env state; must run under the env lock."""
        held = lock.locked()
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        active[0] -= 1
        return held

    def free() -> bool:
        """Does not ask for the lock."""
        return lock.locked()

    async def go(bridge: MCPBridge) -> list[Any]:
        async with _client(bridge) as client:
            calls = [client.call_tool("touch_state", {}) for _ in range(6)]
            return [r.data for r in await asyncio.gather(*calls)]

    with MCPBridge([tool_tagged(touch_state), free], lock=lock) as bridge:
        assert asyncio.run(go(bridge)) == [True] * 6
        assert bridge.call_tool("free").text == "false"
    assert peak[0] == 1
    assert not lock.locked()


def tool_tagged(fn: Any) -> Any:
    from gym_harness.bridge.tools import tool_tags

    return tool_tags(LOCKED_TAG)(fn)


def test_raising_tool_is_a_tool_error_and_bridge_survives(bridge: MCPBridge) -> None:
    async def go() -> None:
        async with _client(bridge) as client:
            result = await client.call_tool("boom", {"reason": "disk full"}, raise_on_error=False)
            assert result.is_error
            assert "tool failed: disk full" in result.content[0].text  # type: ignore[union-attr]
            assert (await client.call_tool("add", {"a": 1, "b": 1})).data == 2

    asyncio.run(go())


def test_hanging_tool_times_out_and_bridge_survives(bridge: MCPBridge, gate: Gate) -> None:
    async def go() -> None:
        async with _client(bridge) as client:
            result = await client.call_tool("hang", {}, raise_on_error=False)
            assert result.is_error
            assert "did not finish within 1.0s" in result.content[0].text  # type: ignore[union-attr]
            assert (await client.call_tool("echo", {"text": "alive"})).data == "alive"

    asyncio.run(go())
    assert bridge.call_tool("hang").is_error
    bridge.stop()  # with two hung calls still in worker threads
    assert not [t for t in threading.enumerate() if t.name == "gym-harness-bridge"]
    gate.event.set()  # the hung threads now finish against a closed loop, quietly
    _settled_counts(threading.active_count() - 2)


def test_start_failure_is_a_bridge_error(tmp_path: Path) -> None:
    script = tmp_path / "no_fds.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, resource, sys
            sys.path.insert(0, sys.argv[1])
            from support import sample_tools
            from gym_harness.bridge.server import MCPBridge
            from gym_harness.errors import BridgeError
            bridge = MCPBridge(sample_tools.TOOLS)
            bridge.list_tools()  # load the tools while files can still be opened
            in_use = len(os.listdir("/proc/self/fd"))
            resource.setrlimit(resource.RLIMIT_NOFILE, (in_use, in_use))
            try:
                bridge.start()
            except BridgeError as exc:
                print("BridgeError:", exc, "| cause:", type(exc.__cause__).__name__)
            """
        )
    )
    tests_dir = str(Path(__file__).parents[1])
    done = subprocess.run(
        [sys.executable, str(script), tests_dir], capture_output=True, text=True, timeout=60
    )
    assert "BridgeError: cannot open the bridge's socket" in done.stdout, done.stderr
    assert "cause: OSError" in done.stdout


def test_five_megabyte_result(bridge: MCPBridge) -> None:
    size = 5 * 1024 * 1024

    async def go() -> str:
        async with _client(bridge) as client:
            return (await client.call_tool("big", {"size": size})).data  # type: ignore[no-any-return]

    assert asyncio.run(go()) == "x" * size


def test_accepted_connections_have_tcp_nodelay(bridge: MCPBridge) -> None:
    async def go() -> list[bool]:
        async with _client(bridge) as client:
            await client.call_tool("echo", {"text": "x"})
            server = bridge._server
            assert server is not None and server.loop is not None

            async def probe() -> list[bool]:  # on the bridge loop, which owns the connections
                socks = [conn.transport.get_extra_info("socket") for conn in server.connections]
                return [bool(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)) for s in socks]

            return asyncio.run_coroutine_threadsafe(probe(), server.loop).result(5.0)

    flags = asyncio.run(go())
    assert flags and all(flags)


def test_activity_and_call_counts(bridge: MCPBridge) -> None:
    before = bridge.last_activity
    assert bridge.call_tool("echo", {"text": "orchestrator"}).text == "orchestrator"
    assert bridge.tool_calls == 0  # in-process calls are not harness tool calls
    assert bridge.in_flight == 0 and not bridge.busy
    _raw_post(bridge.url, {})  # unauthenticated: not a sign of life
    assert bridge.last_activity == before
    mark = bridge.last_activity
    time.sleep(0.01)
    _raw_post(bridge.url, {"authorization": f"Bearer {bridge.token}"})
    assert bridge.last_activity > mark


def test_orchestrator_calls_without_start_and_unknown_names() -> None:
    bridge = MCPBridge(sample_tools.TOOLS)
    assert [s.name for s in bridge.list_tools()] == ["echo", "add"]
    result = bridge.call_tool("add", {"a": 3, "b": 4})
    assert (result.text, result.is_error, result.structured) == ("7", False, {"result": 7})
    with pytest.raises(ConfigError, match="peek_answer"):
        bridge.call_tool("peek_answer")
    assert bridge.state is Lifecycle.NEW


def test_reentrant_lock_and_bad_timeout_are_rejected() -> None:
    with pytest.raises(ConfigError):
        MCPBridge([], lock=threading.RLock())  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        MCPBridge([], tool_timeout_s=0)


def _port_refuses(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((parts.hostname or "", parts.port or 0)) != 0


def test_stop_with_open_session_is_idempotent_and_frees_the_port(bridge: MCPBridge) -> None:
    url = bridge.url

    async def go() -> None:
        async with _client(bridge) as client:
            await client.call_tool("echo", {"text": "x"})
            bridge.stop()  # session still open
            bridge.stop()

    asyncio.run(go())
    assert bridge.state is Lifecycle.STOPPED and bridge.url == ""
    assert _port_refuses(url)
    assert not [t for t in threading.enumerate() if t.name == "gym-harness-bridge"]


def _settled_counts(expected_threads: int) -> tuple[int, int]:
    me = psutil.Process()
    deadline = time.monotonic() + 5.0  # idle AnyIO workers exit shortly after their loop
    while threading.active_count() > expected_threads and time.monotonic() < deadline:
        time.sleep(0.02)
    return threading.active_count(), me.num_fds()


def test_start_stop_cycles_leave_nothing_behind() -> None:
    bridge = MCPBridge(sample_tools.TOOLS)
    bridge.start()
    bridge.call_tool("echo", {"text": "warm"})  # load fastmcp and friends once
    bridge.stop()
    threads, fds = _settled_counts(threading.active_count())
    threads, fds = _settled_counts(threads - 1)
    ports = set()
    for i in range(50):
        with MCPBridge(sample_tools.TOOLS) as fresh:
            ports.add(fresh.url)
        bridge.start()
        assert bridge.call_tool("add", {"a": i, "b": 1}).text == str(i + 1)
        bridge.stop()
    assert len(ports) > 1
    after_threads, after_fds = _settled_counts(threads)
    assert after_threads <= threads
    assert after_fds <= fds


def test_sync_api_from_inside_a_running_loop() -> None:
    async def notebook_cell() -> tuple[list[str], str]:
        bridge = MCPBridge(sample_tools.TOOLS)
        bridge.start()
        try:
            names = [s.name for s in bridge.list_tools()]
            return names, bridge.call_tool("echo", {"text": "from a loop"}).text
        finally:
            bridge.stop()

    assert asyncio.run(notebook_cell()) == (["echo", "add"], "from a loop")
