"""The harness of ``sandbox_bench.py``: line protocol v1, times bridge tool calls itself.

A message ``N`` makes N calls of the env tool ``add`` over the env's MCP bridge, each
timed in here (inside whatever confinement the harness runs under), and answers with
the median in microseconds.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from gym_harness.agents._mcp_tools import MCPTools


def main() -> None:
    tools = MCPTools(os.environ["GYM_HARNESS_MCP_URL"], os.environ["GYM_HARNESS_MCP_TOKEN"], 30)
    print(json.dumps({"type": "ready"}), flush=True)
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("type") != "message":
            continue
        times = []
        for i in range(int(message["content"])):
            start = time.perf_counter()
            text, failed = tools.call("add", {"a": i, "b": 1})
            times.append(time.perf_counter() - start)
            assert not failed and text == str(i + 1), text
        median = statistics.median(times) * 1e6 if times else 0.0
        print(json.dumps({"type": "turn_complete", "response": f"{median:.1f}"}), flush=True)
    tools.close()


if __name__ == "__main__":
    main()
