"""Agents that ship with gym_harness.

* :mod:`gym_harness.agents.reference`: the embedded default harness, a small agent
  speaking line protocol v1 (run ``python -m gym_harness.agents.reference --help``);
  its MCP client (``MCPTools``) lives in the sibling ``_mcp_tools``.

Nothing is imported here, so starting an agent with ``python -m`` stays fast.
"""
