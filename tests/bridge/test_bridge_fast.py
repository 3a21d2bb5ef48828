"""The bridge's short way for a plain ``tools/call``: the same answer as mcp's own, byte for byte.

Each request is sent twice over real loopback HTTP to a real bridge: once plain (the
short way answers it, :attr:`BridgeHTTP.plain_calls` counts it) and once with one more
``_meta`` key (``plain_tool_call`` declines it, so mcp's session manager answers). The
two answers must be the same bytes: the status, the content type, the body. Tools
cover every result shape FastMCP makes: text, structured, ``None``, an error the tool
raises (masked into a result), a ``ToolError``, arguments that fail validation.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastmcp import Context
from fastmcp.exceptions import ToolError

from gym_harness.bridge.fast_call import MODERN_VERSION, plain_tool_call
from gym_harness.bridge.server import MCPBridge


def echo(text: str) -> str:
    """Return the text."""
    return text


def point(x: int, y: int) -> dict[str, int]:
    """A structured result."""
    return {"x": x, "y": y}


def nothing() -> None:
    """No result at all."""


def broken(a: int) -> int:
    """Raises an ordinary exception (FastMCP masks it into an error result)."""
    raise ValueError(f"bad {a}")


def refusing() -> str:
    """Raises a ToolError (its text reaches the client)."""
    raise ToolError("not today")


async def later(text: str) -> str:
    """An async tool."""
    return text.upper()


def with_context(a: int, ctx: Context) -> str:
    """Takes an injected Context: never the short way."""
    return f"{a} {type(ctx).__name__}"


TOOLS = [echo, point, nothing, broken, refusing, later, with_context]
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
    "progressToken": 7,
}


def post(
    bridge: MCPBridge, name: str, arguments: Any, meta: dict[str, Any]
) -> tuple[int, str, bytes]:
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "_meta": meta}}  # fmt: skip
    url = urlsplit(bridge.url)
    conn = http.client.HTTPConnection(url.netloc, timeout=30)
    try:
        conn.request("POST", url.path, json.dumps(body), {
            "Authorization": f"Bearer {bridge.token}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": MODERN_VERSION,
            "Mcp-Method": "tools/call",
            "Mcp-Name": name,
        })  # fmt: skip
        reply = conn.getresponse()
        return reply.status, reply.getheader("content-type", ""), reply.read()
    finally:
        conn.close()


CASES = [
    ("echo", {"text": "hi"}),
    ("echo", {"text": "ünïcode ✓"}),
    ("point", {"x": 1, "y": 2}),
    ("nothing", {}),
    ("broken", {"a": 3}),
    ("refusing", {}),
    ("later", {"text": "abc"}),
    ("echo", {"text": 5}),  # fails validation
    ("echo", {}),  # a required argument missing
]


@pytest.mark.parametrize(("name", "arguments"), CASES)
def test_the_short_way_answers_as_mcp_does(name: str, arguments: dict[str, Any]) -> None:
    with MCPBridge(TOOLS) as bridge:
        http_app = bridge._http
        assert http_app is not None
        short = post(bridge, name, arguments, META)
        assert http_app.plain_calls == 1
        whole = post(bridge, name, arguments, {**META, "io.example/extra": True})
        assert http_app.plain_calls == 1  # declined: mcp answered it
    assert short == whole
    assert short[0] == 200 and short[1] == "application/json"
    result = json.loads(short[2])["result"]
    assert result["resultType"] == "complete"


def test_tools_with_injected_parameters_never_go_the_short_way() -> None:
    with MCPBridge(TOOLS) as bridge:
        http_app = bridge._http
        assert http_app is not None
        assert "with_context" not in http_app.fast_tools
        assert {"echo", "point", "later"} <= http_app.fast_tools
        status, _, body = post(bridge, "with_context", {"a": 5}, META)
        assert status == 200 and b"5 Context" in body
        assert http_app.plain_calls == 0


HEADERS = [
    (b"accept", b"application/json, text/event-stream"),
    (b"mcp-protocol-version", MODERN_VERSION.encode()),
    (b"mcp-method", b"tools/call"),
    (b"mcp-name", b"echo"),
]
PLAIN = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
         "params": {"name": "echo", "arguments": {"text": "x"}, "_meta": META}}  # fmt: skip


def _with(**changes: Any) -> dict[str, Any]:
    message = json.loads(json.dumps(PLAIN))
    for path, value in changes.items():
        where = message
        *parents, last = path.split("__")
        for key in parents:
            where = where[key]
        if value is KeyError:
            del where[last]
        else:
            where[last] = value
    return message


@pytest.mark.parametrize(
    ("message", "headers"),
    [
        (PLAIN, [h for h in HEADERS if h[0] != b"accept"] + [(b"accept", b"text/event-stream")]),
        (PLAIN, [h for h in HEADERS if h[0] != b"mcp-name"] + [(b"mcp-name", b"other")]),
        (PLAIN, [*HEADERS, (b"mcp-name", b"echo")]),  # duplicated
        (PLAIN, [h for h in HEADERS if h[0] != b"mcp-protocol-version"]),
        (_with(method="tools/list"), HEADERS),
        (_with(jsonrpc="1.0"), HEADERS),
        (_with(id=True), HEADERS),
        (_with(id=None), HEADERS),
        (_with(id=KeyError), HEADERS),  # a notification
        (_with(params__name="unknown"), HEADERS),
        (_with(params__arguments=[1]), HEADERS),
        (_with(params__task={"ttl": 1}), HEADERS),
        (_with(params___meta__extra=1), HEADERS),
        (_with(params___meta={}), HEADERS),
        (_with(extra=1), HEADERS),
        ([PLAIN], HEADERS),  # a batch
    ],
)
def test_anything_but_a_plain_call_goes_the_whole_way(
    message: Any, headers: list[tuple[bytes, bytes]]
) -> None:
    assert plain_tool_call(json.dumps(PLAIN).encode(), HEADERS, frozenset({"echo"})) is not None
    assert plain_tool_call(json.dumps(message).encode(), headers, frozenset({"echo"})) is None


def test_a_body_past_the_depth_bound_goes_the_whole_way() -> None:
    deep: Any = 1
    for _ in range(200):
        deep = [deep]
    message = _with(params__arguments={"text": deep})
    assert plain_tool_call(json.dumps(message).encode(), HEADERS, frozenset({"echo"})) is None
    assert plain_tool_call(b"{not json", HEADERS, frozenset({"echo"})) is None


def _raw_request(bridge: MCPBridge, request_id: int, text: str) -> bytes:
    params = {"name": "echo", "arguments": {"text": text}, "_meta": META}
    body = json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    )
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{urlsplit(bridge.url).port}\r\n"
        f"Authorization: Bearer {bridge.token}\r\nAccept: application/json\r\n"
        f"Content-Type: application/json\r\nMCP-Protocol-Version: {MODERN_VERSION}\r\n"
        f"Mcp-Method: tools/call\r\nMcp-Name: echo\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body.encode()


def _read_answers(sock: socket.socket, count: int) -> list[dict[str, Any]]:
    """``count`` whole responses from ``sock`` (bounded by its timeout)."""
    data, answers = b"", []
    while len(answers) < count:
        chunk = sock.recv(65536)
        assert chunk, f"the bridge closed the connection after {len(answers)} answers"
        data += chunk
        while b"\r\n\r\n" in data:
            head, _, rest = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(rest) < length:
                break
            answers.append(json.loads(rest[:length]))
            data = rest[length:]
    return answers


@pytest.mark.parametrize("how", ["whole", "split", "dribbled", "pipelined", "behind"])
def test_plain_calls_however_the_bytes_arrive(how: str) -> None:
    """One write, head and body apart, byte by byte, two requests in one write, and a
    second request sent while the first is answered: every call is answered, in order."""
    with MCPBridge(TOOLS) as bridge:
        http_app = bridge._http
        assert http_app is not None
        first, second = _raw_request(bridge, 1, "one"), _raw_request(bridge, 2, "two")
        with socket.create_connection(("127.0.0.1", urlsplit(bridge.url).port), 10) as sock:
            sock.settimeout(10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if how == "whole":
                sock.sendall(first)
            elif how == "split":
                cut = first.index(b"\r\n\r\n") + 4
                sock.sendall(first[:cut])
                time.sleep(0.05)  # the head alone reaches the bridge first
                sock.sendall(first[cut:])
            elif how == "dribbled":
                for i in range(len(first)):
                    sock.sendall(first[i : i + 1])
            elif how == "pipelined":
                sock.sendall(first + second)
            else:
                sock.sendall(first)
                sock.sendall(second)
            count = 1 if how in ("whole", "split", "dribbled") else 2
            answers = _read_answers(sock, count)
        texts = [a["result"]["structuredContent"]["result"] for a in answers]
        assert texts == ["one", "two"][:count]
        assert [a["id"] for a in answers] == [1, 2][:count]
        assert http_app.plain_calls == count
        # Pipelined bytes go to h11 whole; one request is read without it. The second of
        # "behind" is either (it may reach the bridge in the same read as the first).
        if how != "behind":
            assert http_app.quick_calls == (0 if how == "pipelined" else count)
