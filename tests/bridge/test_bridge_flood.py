"""Floods against the bridge, all on 127.0.0.1, bounded in count and time.

Idle connections past the open-file limit (in a child process), slowloris headers,
idle keep-alive connections, 100 MB bodies, and 500 episodes of tool calls: the
env's own tool calls and resets keep working, and memory stays flat.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
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
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

from gym_harness.bridge.server import MCPBridge

MB = 1024 * 1024


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture
def bridge_args() -> tuple[Any, dict[str, Any]]:
    return [add], {"header_timeout_s": 1.0, "idle_timeout_s": 1.0}


def _port(bridge: MCPBridge) -> int:
    return urlsplit(bridge.url).port or 0


def _call_add(bridge: MCPBridge, a: int, b: int) -> Any:
    async def go() -> Any:
        client = Client(StreamableHttpTransport(bridge.url, auth=bridge.token), timeout=20)
        async with client:
            return (await client.call_tool("add", {"a": a, "b": b})).data

    return asyncio.run(go())


def _closed_by_peer(sock: socket.socket, timeout_s: float) -> bool:
    """Wait (bounded) until the server closes ``sock``."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:  # reset by the server: closed too
        return True
    return True


def _rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


# -- connections --------------------------------------------------------------------------


_FLOODED_CHILD = textwrap.dedent(
    """
    import json, resource, sys
    sys.path.insert(0, sys.argv[1])
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    from test_bridge_flood import add
    from gym_harness import HarnessEnv

    env = HarnessEnv("reference", tools=[add])
    try:
        env.reset()
        bridge = env._bridge
        print(json.dumps({"port": bridge._server.port, "cap": bridge._server.max_connections}))
        sys.stdout.flush()
        sys.stdin.readline()  # the parent holds its flood open now
        out = {}
        reply, _, _, _, info = env.step('/call add {"a": 2, "b": 3}')
        out["step"] = [reply, info["error_type"]]
        env.reset()
        reply, _, _, _, info = env.step('/call add {"a": 4, "b": 5}')
        out["next_episode"] = [reply, info["error_type"]]
        out["open"] = len(bridge._server.connections)
        print(json.dumps(out))
    finally:
        env.close()
    """
)


def test_idle_connection_flood_under_1024_fds_leaves_tools_and_reset_working(
    tmp_path: Path,
) -> None:
    script = tmp_path / "flooded.py"
    script.write_text(_FLOODED_CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), str(Path(__file__).parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    flood: list[socket.socket] = []
    stop = threading.Event()
    try:
        assert child.stdout is not None and child.stdin is not None
        first = json.loads(child.stdout.readline())
        assert first["cap"] <= 1024 // 8
        for _ in range(1100):
            flood.append(socket.create_connection(("127.0.0.1", first["port"]), timeout=5))

        def keep_flooding() -> None:  # new idle connections while the env works
            deadline = time.monotonic() + 20
            while not stop.is_set() and time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    flood.append(socket.create_connection(("127.0.0.1", first["port"]), 5))
                if len(flood) > 1300:
                    flood.pop(0).close()
                time.sleep(0.002)

        flooder = threading.Thread(target=keep_flooding, daemon=True)
        flooder.start()
        child.stdin.write("go\n")
        child.stdin.flush()
        out = json.loads(child.stdout.readline())
        stop.set()
        flooder.join(5)
        assert out["step"] == ["add -> 5", ""]
        assert out["next_episode"] == ["add -> 9", ""]
        assert out["open"] <= first["cap"]
        assert child.wait(30) == 0
    finally:
        stop.set()
        for sock in flood:
            sock.close()
        if child.poll() is None:
            child.kill()
            child.wait(10)
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()


def test_slowloris_connections_are_closed_and_tools_keep_working(bridge: MCPBridge) -> None:
    port = _port(bridge)
    slow = []
    for _ in range(50):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
        slow.append(sock)
    try:
        for _ in range(3):  # keep trickling header bytes, never finishing them
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.sendall(b"X-Slow: 1\r\n")
            time.sleep(0.3)
        assert _call_add(bridge, 1, 2) == 3
        assert all(_closed_by_peer(sock, 5.0) for sock in slow)
        assert _call_add(bridge, 2, 2) == 4
    finally:
        for sock in slow:
            sock.close()


def test_idle_keep_alive_connection_is_closed(bridge: MCPBridge) -> None:
    port = _port(bridge)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(
            f"GET /nowhere HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {bridge.token}\r\n\r\n".encode()
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 404")
        assert _closed_by_peer(sock, 6.0)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as quiet:
        assert _closed_by_peer(quiet, 5.0)  # never sent a byte


def test_connection_cap_evicts_unauthenticated_first_and_keeps_busy_calls() -> None:
    release = threading.Event()

    def wait() -> str:
        """Hold a call open until released."""
        release.wait(20)
        return "done"

    with MCPBridge([add, wait]) as bridge:
        server = bridge._server
        assert server is not None
        cap = server.max_connections

        async def busy_call() -> Any:
            client = Client(StreamableHttpTransport(bridge.url, auth=bridge.token), timeout=20)
            async with client:
                return (await client.call_tool("wait", {})).data

        holder = threading.Thread(target=lambda: results.append(asyncio.run(busy_call())))
        results: list[Any] = []
        holder.start()
        try:
            deadline = time.monotonic() + 10
            while bridge.in_flight == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert bridge.in_flight == 1 and bridge.busy  # the harness waits on the env
            flood = [
                socket.create_connection(("127.0.0.1", _port(bridge)), timeout=5)
                for _ in range(cap + 100)
            ]
            try:
                assert _call_add(bridge, 3, 4) == 7
                assert sum(_closed_by_peer(s, 0.01) for s in flood[:100]) >= 90  # oldest went
                assert len(server.connections) <= cap
            finally:
                for sock in flood:
                    sock.close()
            release.set()
            holder.join(20)
            assert results == ["done"]  # the busy authenticated call was never evicted
        finally:
            release.set()
            holder.join(20)


# -- bodies -------------------------------------------------------------------------------


def _post_huge(port: int, token: str, size: int, chunked: bool) -> tuple[bytes, int]:
    """Send up to ``size`` body bytes (stopping when the server closes); return answer, sent."""
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
    )
    head += "Transfer-Encoding: chunked\r\n\r\n" if chunked else f"Content-Length: {size}\r\n\r\n"
    block = b"[" * (64 * 1024)
    piece = b"%x\r\n%s\r\n" % (len(block), block) if chunked else block
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode())
        sent = 0
        try:
            while sent < size:
                sock.sendall(piece)
                sent += len(block)
        except OSError:  # the server answered and closed: it reads no further
            pass
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError:
            pass
    return answer, sent


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_hundred_megabyte_body_is_refused_while_read(bridge: MCPBridge, chunked: bool) -> None:
    port = _port(bridge)
    _post_huge(port, bridge.token, 8 * MB, chunked)  # warm the allocator's pools
    before = _rss()
    answer, sent = _post_huge(port, bridge.token, 100 * MB, chunked)
    growth = _rss() - before
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < 50 * MB, "the server read on after the limit"
    assert growth < 5 * MB, f"RSS grew {growth / MB:.1f} MB"
    assert _call_add(bridge, 5, 6) == 11


# -- memory over episodes -----------------------------------------------------------------


def test_five_hundred_episodes_of_three_calls_keep_memory_flat() -> None:
    body = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "add"}}
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "legacy", "version": "0"},
        },
    }

    def episode(bridge: MCPBridge, http: httpx2.Client, n: int) -> None:
        bridge.rotate_token()  # as reset() does; the last harness never said goodbye
        headers = {
            "authorization": f"Bearer {bridge.token}",
            "accept": "application/json, text/event-stream",
        }
        session = http.post(bridge.url, json=init, headers=headers).headers["mcp-session-id"]
        headers |= {"mcp-session-id": session, "mcp-protocol-version": "2025-06-18"}
        for i in range(3):
            call = {**body, "id": i + 1, "params": {"name": "add", "arguments": {"a": n, "b": i}}}
            answer = http.post(bridge.url, json=call, headers=headers).json()
            assert answer["result"]["structuredContent"] == {"result": n + i}

    with MCPBridge([add]) as bridge, httpx2.Client(timeout=10) as http:
        for n in range(50):
            episode(bridge, http, n)
        before = _rss()
        for n in range(500):
            episode(bridge, http, n)
        growth = _rss() - before
        assert bridge._http is not None and len(bridge._http.manager._server_instances) == 1
        assert growth < 10 * MB, f"RSS grew {growth / MB:.1f} MB over 500 episodes"
