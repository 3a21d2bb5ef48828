"""The harness of ``sandbox_bench.py``: line protocol v1, times requests to the bridge itself.

Standard library only (it starts in milliseconds, so a reset is mostly our own work). A
message ``N`` sends N HTTP requests to the env's MCP bridge on one kept-alive connection,
each timed in here, inside whatever confinement the harness runs under, and answers with
the median round trip in microseconds. The requests carry no token: the bridge answers
each at once (401), so the figure is the loopback path and the server's front end, where
confinement could add a cost, not a tool's work.
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import sys
import time
from urllib.parse import urlsplit


def main() -> None:
    url = urlsplit(os.environ["GYM_HARNESS_MCP_URL"])
    print(json.dumps({"type": "ready"}), flush=True)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("type") != "message":
            continue
        times = []
        for _ in range(int(message["content"])):
            start = time.perf_counter()
            conn.request("POST", url.path, body=b"{}", headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            times.append(time.perf_counter() - start)
        median = statistics.median(times) * 1e6 if times else 0.0
        print(json.dumps({"type": "turn_complete", "response": f"{median:.1f}"}), flush=True)


if __name__ == "__main__":
    main()
