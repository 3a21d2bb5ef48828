"""The MCP bridge: the env's own tools served to the harness over loopback HTTP.

* :mod:`~gym_harness.bridge.tools`: ``ToolSpec``, loading tools, reserved names and
  conflicts with the harness's built-ins (cheap; ``import gym_harness`` loads it).
* :mod:`~gym_harness.bridge.server`: ``MCPBridge`` (lifecycle, tokens, sessions).
* :mod:`~gym_harness.bridge.http`: its HTTP front end (streamable HTTP, JSON answers).
* :mod:`~gym_harness.bridge.tool_runner`: running one tool call within its bounds.

Imports ``loopback`` below it; never capture, model, processes, adapters or the env.
Nothing is imported here: fastmcp and asyncio load only when a bridge starts.
"""
