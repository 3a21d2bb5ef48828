"""A line-protocol v1 harness that misbehaves on request (tests/env/test_no_escape.py).

Usage: ``python hostile.py [deaf]``. It prints ``{"type":"ready"}``; with ``deaf``
it then never reads its stdin. Otherwise each message's content says what to do:

    "deep"         print a JSON line nested 1,000 deep, then answer
    "stall"        stop reading stdin and go silent
    "forkdie"      fork a child that keeps stdout open, then SIGKILL itself
    "exit <code>"  print a text line, then exit with <code>
    "raw <n> <hex>" write the bytes <hex> to stdout as they are, then answer "reply-<n>"
                   on a line of its own
    "rawexit <n> <hex>" write the bytes, then exit 0 (no newline added)
    "/done"        answer with done=true
    anything else  answer "echo: <content>"
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def emit(obj: dict[str, object]) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def answer(content: str) -> None:
    if content == "deep":
        os.write(1, b'{"type":"text","text":' + b"[" * 1000 + b"]" * 1000 + b"}\n")
    elif content == "stall":
        time.sleep(3600)
    elif content == "forkdie":
        emit({"type": "text", "text": "forking"})
        if os.fork() == 0:  # the child keeps stdout (and stdin) open
            time.sleep(3600)
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL)
    elif content.startswith("exit "):
        emit({"type": "text", "text": "exiting"})
        sys.exit(int(content.split()[1]))
    elif content.startswith(("raw ", "rawexit ")):
        how, n, data = content.split(" ", 2)
        raw = bytes.fromhex(data)
        os.write(1, raw)
        if how == "rawexit":  # the last line may have no newline: it ends at EOF
            sys.exit(0)
        if not raw.endswith(b"\n"):  # keep the answer a line of its own
            os.write(1, b"\n")
        emit({"type": "turn_complete", "response": f"reply-{n}", "done": False})
        return
    emit({"type": "turn_complete", "response": f"echo: {content}", "done": content == "/done"})


def main() -> None:
    emit({"type": "ready"})
    if sys.argv[1:] == ["deaf"]:
        time.sleep(3600)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("type") == "message":
            answer(str(msg["content"]))


if __name__ == "__main__":
    main()
