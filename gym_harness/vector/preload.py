"""Import the bridge's server stack once, before vector workers are made.

A vector worker's first reset used to spend about a second importing fastmcp,
mcp, uvicorn and starlette, in every worker, each with its own private copy of
those modules (tens of MB per worker). :func:`preload_server_stack` imports the
whole stack in the parent; workers forked from it start with it imported and
share its pages copy-on-write. With the forkserver start method, the forkserver
imports :mod:`gym_harness.vector.forkserver_preload`, which calls it.

The ``mcp`` package's ``__init__`` imports its client (``mcp.client``: session,
stdio, streamable-HTTP transports), which a server never uses.
:func:`install_lazy_mcp` puts a lazy ``mcp`` package in ``sys.modules`` first:
its submodules import as usual, and a name taken from the package itself
(``from mcp import ServerSession``) imports only the submodule it comes from.
"""

from __future__ import annotations

import ast
import gc
import http.client
import importlib
import importlib.util
import json
import sys
import threading
import types
import urllib.parse
from typing import Any

__all__ = ["install_lazy_mcp", "preload_server_stack"]

_LOCK = threading.Lock()
_PRELOADED = False
_CALL_TIMEOUT_S = 10.0


def install_lazy_mcp() -> bool:
    """Register a lazy ``mcp`` package unless ``mcp`` is imported already.

    Returns:
        True when the lazy package was installed.
    """
    with _LOCK:
        if "mcp" in sys.modules:
            return False
        spec = importlib.util.find_spec("mcp")
        if spec is None or spec.origin is None or spec.loader is None:
            return False
        try:
            with open(spec.origin, encoding="utf-8") as file:
                sources = _name_sources(file.read())
        except (OSError, SyntaxError, UnicodeDecodeError):
            return False  # an mcp we cannot read: let it import the ordinary way
        module = importlib.util.module_from_spec(spec)
        module.__getattr__ = _resolver(module, spec, sources)  # type: ignore[method-assign]
        sys.modules["mcp"] = module
        return True


def _name_sources(source: str) -> dict[str, tuple[str, str]]:
    """Map each name the package's ``__init__`` imports to (module, attribute)."""
    sources: dict[str, tuple[str, str]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ImportFrom) or node.level > 1:
            continue
        if node.level == 1:
            module = "mcp" + (f".{node.module}" if node.module else "")
        else:
            module = node.module or ""
        for alias in node.names:
            if alias.name != "*":
                sources[alias.asname or alias.name] = (module, alias.name)
    return sources


def _resolver(module: types.ModuleType, spec: Any, sources: dict[str, tuple[str, str]]) -> Any:
    loaded_whole: list[bool] = []

    def __getattr__(name: str) -> Any:
        if name in sources:
            where, attr = sources[name]
            if where == "mcp":  # ``from . import types``: a submodule
                value: Any = importlib.import_module(f"mcp.{attr}")
            else:
                value = getattr(importlib.import_module(where), attr)
            setattr(module, name, value)
            return value
        if name.startswith("__") or loaded_whole:
            raise AttributeError(f"module 'mcp' has no attribute {name!r}")
        # A name the package makes some other way (``__all__`` aside): run it whole.
        loaded_whole.append(True)
        spec.loader.exec_module(module)
        return getattr(module, name)

    return __getattr__


def preload_server_stack() -> None:
    """Import everything the bridge's server imports by its first tool call (once).

    Serves one throwaway bridge on 127.0.0.1 and makes one real MCP tool call to it
    over HTTP with the standard library's client (so the modules that fastmcp,
    mcp, starlette and uvicorn import lazily, on a first request, are loaded too),
    stops it, then freezes the garbage collector's view of what is loaded:
    collections in a forked worker then leave those pages shared with the parent.

    Raises:
        HarnessError: The throwaway bridge failed (the caller may go on without).
    """
    global _PRELOADED
    with _LOCK:
        if _PRELOADED:
            return
        _PRELOADED = True
    install_lazy_mcp()
    import gym_harness.process.harness_process  # noqa: F401  (the worker's harness side)
    from gym_harness.bridge.server import MCPBridge
    from gym_harness.errors import BridgeError

    async def echo(text: str) -> str:  # async: no worker thread is left behind to fork
        """Return the text."""
        return text

    with MCPBridge([echo]) as bridge:
        try:
            _one_http_call(bridge.url, bridge.token)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise BridgeError(f"the preload bridge did not answer a tool call: {exc}") from exc
    gc.freeze()  # no collect first: on this heap it costs ~0.2 s and frees little


def _one_http_call(url: str, token: str) -> None:
    """initialize, initialized, tools/call ``echo`` over streamable HTTP (bounded)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=_CALL_TIMEOUT_S)
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    messages = (
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "gym-harness-preload", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "echo", "arguments": {"text": "preload"}}},
    )  # fmt: skip
    try:
        for message in messages:
            conn.request("POST", parts.path, json.dumps(message), headers)
            response = conn.getresponse()
            body = response.read()
            if response.status >= 300:
                raise ValueError(f"HTTP {response.status}: {body[:200]!r}")
            session = response.getheader("mcp-session-id")
            if session:
                headers["mcp-session-id"] = session
        if b"preload" not in body:
            raise ValueError(f"unexpected tool result {body[:200]!r}")
    finally:
        conn.close()
