"""Latency of one tool call through MCPBridge versus bare fastmcp, and bridge start/stop times.

Run: ``python benchmarks/bridge_bench.py [--calls 1000] [--cycles 20]``

Prints p50/p95 of one ``echo`` call through (a) MCPBridge (bearer token, Host/Origin
guard, timeout wrapper), (b) a bare fastmcp streamable-HTTP app of the same tool
under uvicorn (no auth), (c) fastmcp's in-memory ``Client(server)``, (d) the client
floor: a bare asyncio server that answers each request with canned JSON (the same
answers as bare fastmcp's, no MCP work), what no server can beat with this client; the
ratios; and the bridge's start and stop times. Goal: bridge p50 at most 0.6x bare fastmcp HTTP
(median of per-round ratios).
Calls are interleaved in rounds so machine noise hits all three alike.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from gym_harness.bridge.server import MCPBridge

ROUNDS = 10
GOAL = 0.6


def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


class BareServer:
    """A plain fastmcp HTTP app for the same tool, served by uvicorn in a thread."""

    def __init__(self) -> None:
        import uvicorn
        from fastmcp import FastMCP

        mcp = FastMCP("bare", tools=[echo])
        config = uvicorn.Config(
            mcp.http_app(path="/mcp"), host="127.0.0.1", port=0, log_config=None,
            log_level="warning", access_log=False, lifespan="on", ws="none",
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()))
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.005)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/mcp"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class FloorServer:
    """The client's floor: canned answers (copied from ``bare``), one parse, one write."""

    def __init__(self, bare: BareServer) -> None:
        canned = {m: _bare_result(bare, m) for m in ("server/discover", "tools/list")}
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        server: list[Any] = []

        class Floor(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                self.transport, self.buffer = transport, b""

            def data_received(self, data: bytes) -> None:
                self.buffer += data
                while b"\r\n\r\n" in self.buffer:
                    head, _, rest = self.buffer.partition(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    if len(rest) < length:
                        return
                    message, self.buffer = json.loads(rest[:length]), rest[length:]
                    if message["method"] == "tools/call":
                        text = message["params"]["arguments"]["text"]
                        result: Any = {"content": [{"text": text, "type": "text"}],
                                       "isError": False, "resultType": "complete",
                                       "structuredContent": {"result": text}}  # fmt: skip
                    else:
                        result = canned.get(message["method"], {})
                    body = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
                    self.transport.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(body), body.encode())
                    )

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            server.append(self.loop.run_until_complete(
                self.loop.create_server(Floor, "127.0.0.1", 0)
            ))  # fmt: skip
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait(10)
        self.server = server[0]
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/mcp"

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _bare_result(bare: BareServer, method: str) -> Any:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {}}  # fmt: skip
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"_meta": meta}})
    url = urlsplit(bare.url)
    conn = http.client.HTTPConnection(url.netloc, timeout=10)
    try:
        conn.request("POST", url.path, body, {
            "Accept": "application/json, text/event-stream", "Content-Type": "application/json",
            "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method,
        })  # fmt: skip
        return json.loads(conn.getresponse().read())["result"]
    finally:
        conn.close()


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(0.95 * (len(ordered) - 1))]


async def time_calls(client: Any, n: int, out: list[float]) -> None:
    for i in range(n):
        start = time.perf_counter()
        result = await client.call_tool("echo", {"text": f"ping {i}"})
        out.append(time.perf_counter() - start)
        assert result.data == f"ping {i}"


async def measure_calls(
    bridge: MCPBridge, bare: BareServer, floor: FloorServer, calls: int
) -> dict[str, list[list[float]]]:
    from fastmcp import Client, FastMCP
    from fastmcp.client.transports import StreamableHttpTransport

    clients: dict[str, Callable[[], Any]] = {
        "bridge (HTTP, auth)": lambda: Client(
            StreamableHttpTransport(bridge.url, auth=bridge.token)
        ),
        "bare fastmcp HTTP": lambda: Client(StreamableHttpTransport(bare.url)),
        "in-memory": lambda: Client(FastMCP("memory", tools=[echo])),
        "client floor (canned)": lambda: Client(StreamableHttpTransport(floor.url)),
    }
    rounds: dict[str, list[list[float]]] = {name: [] for name in clients}
    for _ in range(ROUNDS):
        for name, make in clients.items():
            async with make() as client:
                await time_calls(client, 20, [])  # warm the connection and caches
                rounds[name].append([])
                await time_calls(client, calls // ROUNDS, rounds[name][-1])
    return rounds


def measure_lifecycle(cycles: int) -> tuple[float, list[float], list[float]]:
    cold = MCPBridge([echo])
    start = time.perf_counter()
    cold.start()  # first start pays for importing fastmcp and uvicorn
    first = time.perf_counter() - start
    cold.stop()
    starts, stops = [], []
    for _ in range(cycles):
        bridge = MCPBridge([echo])
        bridge.list_tools()  # tool loading is separate from serving; time the server only
        t0 = time.perf_counter()
        bridge.start()
        t1 = time.perf_counter()
        bridge.stop()
        starts.append(t1 - t0)
        stops.append(time.perf_counter() - t1)
    return first, starts, stops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per path")
    parser.add_argument("--cycles", type=int, default=20, help="start/stop cycles")
    args = parser.parse_args()

    first, starts, stops = measure_lifecycle(args.cycles)
    bare = BareServer()
    floor = None
    try:
        floor = FloorServer(bare)
        with MCPBridge([echo]) as bridge:
            rounds = asyncio.run(measure_calls(bridge, bare, floor, args.calls))
    finally:
        bare.stop()
        if floor is not None:
            floor.stop()

    samples = {name: [x for r in per_round for x in r] for name, per_round in rounds.items()}
    p50 = {name: percentiles(s)[0] for name, s in samples.items()}

    def round_ratio(a: str, b: str) -> float:  # robust to a noisy round hitting one path
        return statistics.median(
            statistics.median(x) / statistics.median(y)
            for x, y in zip(rounds[a], rounds[b], strict=True)
        )

    print(f"one tool call, {args.calls} calls per path in {ROUNDS} interleaved rounds")
    for name, s in samples.items():
        lo, hi = percentiles(s)
        print(f"  {name:22s} p50 {lo * 1e3:7.3f} ms   p95 {hi * 1e3:7.3f} ms")
    bridge_p50 = p50["bridge (HTTP, auth)"]
    for other in ("bare fastmcp HTTP", "in-memory"):
        pooled = bridge_p50 / p50[other]
        per_round = round_ratio("bridge (HTTP, auth)", other)
        print(
            f"  ratio bridge / {other} (p50): pooled {pooled:.2f}x, "
            f"median of per-round ratios {per_round:.2f}x"
        )
    floor_ratio = round_ratio("client floor (canned)", "bare fastmcp HTTP")
    print(f"  ratio client floor / bare fastmcp HTTP: {floor_ratio:.2f}x (no server does better)")
    goal = round_ratio("bridge (HTTP, auth)", "bare fastmcp HTTP")
    print(f"  goal bridge / bare fastmcp HTTP <= {GOAL:g}x: {'PASS' if goal <= GOAL else 'MISS'}")
    print(f"bridge start: first (cold imports) {first * 1e3:.0f} ms; ", end="")
    s50, s95 = percentiles(starts)
    print(f"warm p50 {s50 * 1e3:.1f} ms p95 {s95 * 1e3:.1f} ms over {args.cycles}")
    t50, t95 = percentiles(stops)
    print(
        f"bridge stop: p50 {t50 * 1e3:.1f} ms p95 {t95 * 1e3:.1f} ms, max {max(stops) * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
