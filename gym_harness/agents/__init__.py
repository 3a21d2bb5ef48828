"""The agent and demo that ship with gym_harness (``gym_harness/Reference-v0``).

* :mod:`gym_harness.agents.reference`: the embedded default harness, a small agent
  speaking line protocol v1 (run ``python -m gym_harness.agents.reference --help``);
  its MCP client (``MCPTools``) lives in the sibling ``_mcp_tools``.
* :mod:`gym_harness.agents.demo`: the demo tools, tasks and reward of ``Reference-v0``.

The agent runs as the harness, in a process of its own: it imports nothing of the
env's side. Nothing is imported here, so starting an agent with ``python -m`` stays fast.
"""
