"""Stopping a loopback server with a request in flight prints nothing to the terminal."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A bridge whose one tool blocks until released; a client calls it, and the bridge is
# stopped while the call is in flight (as when an episode ends during a harness's call).
SCRIPT = textwrap.dedent(
    """
    import asyncio, os, sys, threading, time
    from gym_harness.bridge.server import MCPBridge

    release = threading.Event()

    def hold() -> str:
        \"\"\"Answer once released.\"\"\"
        release.wait(20)
        return "late"

    bridge = MCPBridge([hold])
    bridge.start()
    outcome = []

    def client() -> None:
        from fastmcp import Client

        async def call() -> None:
            async with Client(bridge.url, auth=bridge.token) as c:
                await c.call_tool("hold", {})

        try:
            asyncio.run(call())
        except BaseException as exc:
            outcome.append(type(exc).__name__)

    caller = threading.Thread(target=client)
    caller.start()
    deadline = time.monotonic() + 30
    while bridge.in_flight == 0:
        assert time.monotonic() < deadline, "the call never arrived"
        time.sleep(0.02)
    bridge.stop()
    release.set()
    caller.join(20)
    print("client:", outcome, flush=True)
    sys.stderr.flush()
    # The abandoned tool's worker thread outlives the bridge's loop; interpreter teardown
    # with such a thread is CPython's hazard, not what this test is about.
    os._exit(0)
    """
)


@pytest.mark.timeout(90)
def test_stopping_with_a_call_in_flight_prints_no_traceback() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=80, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "client: ['" in done.stdout  # the call was cut by the stop, not answered
    assert done.stderr == ""
