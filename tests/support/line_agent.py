"""A line-protocol v1 harness with scripted faults, for the env tests.

Usage: ``python tests/support/line_agent.py [MODE] [--delay S]``. It prints
``{"type":"ready"}`` (unless the mode says otherwise), then answers each
message per MODE; a message's own text can also ask for a fault, so one
process can behave well for some turns and then fail:

    "crash"   exit 3 mid-turn          "hang"    keep writing stderr, never answer
    "stall"   go silent                "garbage" print a line that is not JSON
    "pause"   print {"type":"paused","pid":PID} (an event, mid-turn), then go silent
    "flood"   50 MB to stderr, then answer
    "utf8"    answer with invalid UTF-8 bytes
    "/done"   answer with done=true    anything else: "echo: <message>"

Modes at start: ``never_ready`` (no ready line), ``exit_at_start`` (stderr
message, exit 2), ``ready_then_exit`` (ready, then exit 0 before any message).
"""

from __future__ import annotations

import json
import os
import sys
import time


def emit(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def answer(content: str, delay: float) -> None:
    if content == "crash":
        emit({"type": "text", "text": "about to crash"})
        sys.exit(3)
    if content == "hang":
        while True:
            sys.stderr.write("still thinking\n")
            sys.stderr.flush()
            time.sleep(0.05)
    if content == "stall":
        time.sleep(3600)
    if content == "pause":  # an event the test's on_event sees while the turn runs
        emit({"type": "paused", "pid": os.getpid()})
        time.sleep(3600)
    if content == "garbage":
        sys.stdout.write("this is not json\n")
        sys.stdout.flush()
        time.sleep(3600)
    if content == "flood":
        block = ("x" * 1023 + "\n").encode()
        for _ in range(50 * 1024):
            os.write(2, block)
    if content == "utf8":
        os.write(1, b'{"type":"turn_complete","response":"bad \xff\xfe bytes"}\n')
        return
    if delay:
        time.sleep(delay)
    emit({"type": "text", "text": "echo: "})
    emit({"type": "tool_call", "name": "none", "arguments": {}})
    emit({"type": "mystery", "value": 1})
    emit({"type": "turn_complete", "response": f"echo: {content}", "done": content == "/done"})


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "echo"
    delay = float(sys.argv[sys.argv.index("--delay") + 1]) if "--delay" in sys.argv else 0.0
    if mode == "exit_at_start":
        sys.stderr.write("fatal: no API key configured\n")
        sys.exit(2)
    if mode == "never_ready":
        time.sleep(3600)
    emit({"type": "ready"})
    if mode == "ready_then_exit":
        return
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("type") == "message":
            answer(str(msg["content"]), delay)


if __name__ == "__main__":
    main()
