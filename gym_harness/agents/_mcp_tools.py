"""The reference agent's MCP client: the bridge's tools over plain HTTP requests.

A sibling of ``reference.py``, imported by it both as ``gym_harness.agents._mcp_tools``
and, when the agent runs as a plain script, as the top-level module ``_mcp_tools``:
so it imports nothing from gym_harness.

The bridge speaks MCP's stateless revision (``MCP-Protocol-Version: 2026-07-28``): every
request stands alone, carrying the protocol version and client info in ``_meta``, with no
``initialize`` handshake and no session to keep. So the client is a JSON-RPC POST over the
standard library's ``http.client`` on one kept-alive connection: the first tool call of an
episode costs what the others cost. (The ``mcp`` client package, with the ``jsonschema``
and ``httpcore2`` it pulls in, took 1.5 s to import on an idle machine and over 10 s on a
loaded one: each episode's first tool call paid it.)
"""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import SplitResult, urlsplit

__all__ = ["PROTOCOL_VERSION", "KeptConnection", "MCPTools", "describe"]

#: The MCP revision every request names (the bridge's stateless one).
PROTOCOL_VERSION = "2026-07-28"
#: Longest MCP answer read (a bigger one is an error for that call).
MAX_ANSWER_BYTES = 64 * 1024 * 1024
#: Pages of ``tools/list`` followed at most.
MAX_PAGES = 100
#: How a POST on a kept-alive connection the server closed while it idled fails: the
#: request cannot be written, or the connection ends with no byte of an answer.
_STALE = (BrokenPipeError, ConnectionResetError)  # http.client.RemoteDisconnected is one
_META = {
    "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
    "io.modelcontextprotocol/clientInfo": {"name": "gym-harness-reference", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def describe(exc: BaseException) -> str:
    """``"Type: message"`` of ``exc``, or of the first error inside its exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class KeptConnection:
    """POSTs to one origin on one kept-alive HTTP(S) connection, opened again when needed.

    Threads: one at a time (the agent's main thread).

    Args:
        url: Where every POST goes (``http://`` or ``https://``).
        timeout_s: Longest wait for one answer.
        max_bytes: Longest answer read; a longer one is an error.
    """

    def __init__(self, url: str, timeout_s: float, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.url: SplitResult = urlsplit(url)
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
        """POST ``body``; return ``(status, content type, body)``.

        Raises:
            RuntimeError: No answer (in time), or one over ``max_bytes``.
        """
        target = self.url.path or "/"
        if self.url.query:
            target += "?" + self.url.query
        while True:
            kept = self._conn is not None
            if self._conn is None:
                kind = (
                    http.client.HTTPSConnection
                    if self.url.scheme == "https"
                    else http.client.HTTPConnection
                )
                self._conn = kind(self.url.netloc, timeout=self._timeout_s)
            try:
                self._conn.request("POST", target, body, headers)
                reply = self._conn.getresponse()
                data = reply.read(self._max_bytes + 1)
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                # A kept-alive connection the server closed while it idled fails before
                # any answer: one try on a fresh one. Any other failure may come after the
                # server acted on the POST (a tool call is not to be run twice), and a
                # timeout is an answer: no second try.
                if kept and isinstance(exc, _STALE):
                    continue
                raise RuntimeError(f"no answer from {self.url.netloc}: {describe(exc)}") from exc
            if len(data) > self._max_bytes:
                self.close()
                raise RuntimeError(f"an answer over {self._max_bytes} bytes")
            if (reply.getheader("connection") or "").lower() == "close":
                self.close()
            return reply.status, reply.getheader("content-type") or "", data

    def close(self) -> None:
        """Close the connection, if open. Idempotent."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class MCPTools:
    """The bridge's tools through JSON-RPC requests on one kept-alive HTTP connection.

    Threads: the agent's main thread only.

    Args:
        url: The bridge's streamable-HTTP URL ("" when there is no bridge).
        token: The bearer token.
        call_timeout_s: Longest wait for one request's answer.
    """

    def __init__(self, url: str, token: str, call_timeout_s: float) -> None:
        self._conn = KeptConnection(url, call_timeout_s) if url else None
        self._token = token
        self._next_id = 0

    def list_tools(self) -> list[dict[str, Any]]:
        """Return ``{"name", "description", "input_schema"}`` for every tool.

        Raises:
            RuntimeError: There is no bridge, or listing failed.
        """
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            params: dict[str, Any] = {"cursor": cursor} if cursor else {}
            page = self._request("tools/list", None, params)
            for tool in page.get("tools") or []:
                tools.append(
                    {
                        "name": tool.get("name", ""),
                        "description": tool.get("description") or "",
                        "input_schema": tool.get("inputSchema") or {},
                    }
                )
            cursor = page.get("nextCursor")
            if not cursor:
                break
        return tools

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Call one tool; return ``(content text, is_error)``. Never raises."""
        try:
            result = self._request("tools/call", name, {"name": name, "arguments": arguments})
        except RuntimeError as exc:
            return str(exc), True
        parts = []
        for block in result.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            else:
                parts.append(json.dumps(block))
        if not parts and result.get("structuredContent") is not None:
            parts.append(json.dumps(result["structuredContent"]))
        return "\n".join(parts), bool(result.get("isError"))

    def close(self) -> None:
        """Close the connection (nothing else to end: the protocol keeps no session)."""
        if self._conn is not None:
            self._conn.close()

    def _request(self, method: str, name: str | None, params: dict[str, Any]) -> dict[str, Any]:
        """POST one JSON-RPC request; return its ``result``.

        Raises:
            RuntimeError: No bridge, no answer in time, an HTTP error or a JSON-RPC error.
        """
        if self._conn is None:
            raise RuntimeError("no MCP bridge: GYM_HARNESS_MCP_URL is not set")
        self._next_id += 1
        request_id = self._next_id
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": method,
                "params": {**params, "_meta": _META},
            }
        ).encode()
        headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": PROTOCOL_VERSION,
            "Mcp-Method": method,
        }
        if name is not None:
            headers["Mcp-Name"] = name
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        status, kind, data = self._conn.post(body, headers)
        if status != 200:
            said = data[:300].decode(errors="replace")
            raise RuntimeError(f"the MCP bridge refused the request (HTTP {status}): {said}")
        answer = _answer(kind, data, request_id)
        if "error" in answer:
            error = answer["error"] if isinstance(answer["error"], dict) else {}
            raise RuntimeError(f"MCP error {error.get('code')}: {error.get('message', '')}")
        result = answer.get("result")
        if not isinstance(result, dict):
            raise RuntimeError(f"MCP answer has no result: {data[:300]!r}")
        return result


def _answer(kind: str, data: bytes, request_id: int) -> dict[str, Any]:
    """The JSON-RPC answer to ``request_id`` in a JSON body or an SSE stream."""
    try:
        if kind.startswith("text/event-stream"):
            for line in data.decode().splitlines():
                if line.startswith("data:"):
                    message = json.loads(line[5:])
                    if isinstance(message, dict) and message.get("id") == request_id:
                        return message
            raise RuntimeError("the MCP event stream held no answer to the request")
        message = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RuntimeError(f"MCP answer is not JSON: {data[:300]!r}") from exc
    if not isinstance(message, dict):
        raise RuntimeError(f"MCP answer is not a JSON object: {data[:300]!r}")
    return message
