"""The bridge's short way for the request a harness sends most: one plain ``tools/call``.

mcp's stateless-era (``MCP-Protocol-Version: 2026-07-28``) HTTP entry takes every request
through its transport checks, its inbound classification, pydantic envelopes, the
low-level runner and FastMCP's server middleware before the served server's
``call_tool`` runs the tool; for a small tool that is most of a call's time.
:func:`plain_tool_call` recognises the one shape whose answer this module can write
itself, with the same bytes: a single JSON-RPC request object, method ``tools/call``,
``params`` of only ``name``, ``arguments`` and the standard request ``_meta`` (no
continuation, no task), the routing headers agreeing with the body, JSON accepted, and a
tool whose every parameter is in its schema (no injected ``Context`` or dependency: the
short way binds no MCP request context). Anything else goes the whole way through mcp.

The served server's own ``call_tool`` still runs the tool (tool lookup, error handling
and masking; not its middleware, which watches ``tools/list`` alone). The result is shaped
as FastMCP's ``tools/call`` handler and mcp's runner shape it
(``mcp_types.methods.serialize_server_result``, ``resultType``, the ``serverInfo``
stamp) and written as mcp's stateless entry writes it; the bridge's tests compare the
two ways byte for byte.

Threads: the bridge loop.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from gym_harness.utils import bounded_json

__all__ = ["MODERN_VERSION", "PlainCall", "answer", "eligible_tools", "plain_tool_call"]

#: The stateless-era protocol revision the short way answers.
MODERN_VERSION = "2026-07-28"
_REQUEST_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_PARAM_KEYS = frozenset({"name", "arguments", "_meta"})
_VERSION_META = "io.modelcontextprotocol/protocolVersion"
_META_KEYS = frozenset(
    {
        _VERSION_META,
        "io.modelcontextprotocol/clientInfo",
        "io.modelcontextprotocol/clientCapabilities",
        "io.modelcontextprotocol/logLevel",
        "progressToken",
    }
)
_SERVER_INFO = "io.modelcontextprotocol/serverInfo"

#: ``(request id, tool name, arguments)`` of a plain call.
PlainCall = tuple[int | str, str, dict[str, Any]]


def eligible_tools(originals: Mapping[str, Any]) -> frozenset[str]:
    """The served names whose original tool the short way may call: function tools whose
    function takes only the parameters of their schema (nothing injected)."""
    import inspect

    from fastmcp.tools import FunctionTool

    names = set()
    for served, tool in originals.items():
        fn = getattr(tool, "fn", None)
        if not isinstance(tool, FunctionTool) or fn is None:
            continue
        try:
            parameters = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        schema = set((tool.parameters or {}).get("properties") or {})
        if set(parameters) <= schema:
            names.add(served)
    return frozenset(names)


def plain_tool_call(
    body: bytes, headers: Iterable[tuple[bytes, bytes]], tools: frozenset[str]
) -> PlainCall | None:
    """The call in ``body`` if it is a plain ``tools/call`` of one of ``tools``, else ``None``.

    Args:
        body: The request body.
        headers: The request's headers (lower-case names).
        tools: The tools the short way may call (:func:`eligible_tools`).
    """
    seen: dict[bytes, bytes] = {}
    for key, value in headers:
        if key in (b"mcp-method", b"mcp-name", b"accept", b"mcp-protocol-version"):
            if key in seen:
                return None  # a duplicated routing header: mcp's checks answer it
            seen[key] = value
    if b"application/json" not in seen.get(b"accept", b""):
        return None
    if seen.get(b"mcp-protocol-version") != MODERN_VERSION.encode():
        return None
    if seen.get(b"mcp-method") != b"tools/call":
        return None
    try:
        message = bounded_json.loads(body)
    except ValueError:
        return None
    if type(message) is not dict or message.keys() != _REQUEST_KEYS:
        return None
    request_id, params = message["id"], message["params"]
    if message["jsonrpc"] != "2.0" or message["method"] != "tools/call":
        return None
    if type(request_id) not in (int, str) or type(params) is not dict:
        return None
    if not params.keys() <= _PARAM_KEYS:
        return None
    name, arguments, meta = params.get("name"), params.get("arguments", {}), params.get("_meta")
    if type(name) is not str or name not in tools or seen.get(b"mcp-name") != name.encode():
        return None
    if type(arguments) is not dict or type(meta) is not dict or not meta.keys() <= _META_KEYS:
        return None
    if meta.get(_VERSION_META) != MODERN_VERSION:
        return None
    return request_id, name, arguments


async def answer(server: Any, call: PlainCall) -> tuple[int, bytes]:
    """Run ``call`` on ``server`` (the served FastMCP) and the answer mcp would send.

    Returns:
        ``(HTTP status, JSON body)``.
    """
    import mcp.types as mcp_types
    from fastmcp.exceptions import DisabledError, FastMCPError, NotFoundError
    from fastmcp.tools.base import InputRequiredToolResult
    from mcp.server.runner import modern_error_data
    from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS
    from mcp_types.methods import serialize_server_result

    request_id, name, arguments = call
    try:
        try:
            # The served server's own middleware watches tools/list only (see server.py).
            result: Any = await server.call_tool(name, arguments, run_middleware=False)
        except (DisabledError, NotFoundError):
            result = _error_result(mcp_types, f"Unknown tool: {name!r}")
        except FastMCPError as exc:
            result = _error_result(mcp_types, str(exc))
        else:
            if isinstance(result, InputRequiredToolResult):
                result = result.input_required
            elif hasattr(result, "to_mcp_result"):
                result = _call_tool_result(mcp_types, result.to_mcp_result())
        dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        kind = dumped.get("resultType")
        if not isinstance(kind, str) or kind in ("complete", "input_required"):
            dumped = serialize_server_result("tools/call", MODERN_VERSION, dumped)
        dumped.setdefault("resultType", "complete")
        meta = dumped.get("_meta")
        stamp = server._mcp_server.server_info_stamp
        if meta is None:
            dumped["_meta"] = {_SERVER_INFO: stamp}
        elif isinstance(meta, dict) and meta.get(_SERVER_INFO) is None:
            dumped["_meta"] = {**meta, _SERVER_INFO: stamp}
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "result": dumped}
        status = 200
    except Exception as exc:  # what mcp's modern entry makes of a handler's exception
        error = modern_error_data(exc)
        reply = {
            "jsonrpc": "2.0",
            "id": request_id,
            "error": error.model_dump(by_alias=True, mode="json", exclude_none=True),
        }
        status = ERROR_CODE_HTTP_STATUS.get(error.code, 200)
    return status, json.dumps(reply, separators=(",", ":")).encode()


def _error_result(mcp_types: Any, text: str) -> Any:
    return mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text=text)], is_error=True
    )


def _call_tool_result(mcp_types: Any, result: Any) -> Any:
    """FastMCP's three shapes of ``ToolResult.to_mcp_result()`` as one ``CallToolResult``."""
    if isinstance(result, mcp_types.CallToolResult):
        return result
    if isinstance(result, tuple):
        content, structured = result
        return mcp_types.CallToolResult(content=content, structured_content=structured)
    return mcp_types.CallToolResult(content=result)
