"""A line-protocol harness whose model is the env, on the standard library alone.

Usage: ``python light_model_agent.py``. Each user message is a turn of two model calls
(Chat Completions at ``$GYM_HARNESS_MODEL_BASE_URL/v1/chat/completions``, key
``$GYM_HARNESS_MODEL_API_KEY``): the user message, then, after a pause of ``--pause S``
seconds (default 0.3), the conversation so far and "go on". The second answer is the
turn's reply. It starts in a few milliseconds (no MCP client, no HTTP library), for the
tests that start many harnesses.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from typing import Any


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def ask(messages: list[dict[str, Any]]) -> str:
    base = os.environ["GYM_HARNESS_MODEL_BASE_URL"].rstrip("/")
    body = json.dumps({"model": "main", "messages": messages}).encode()
    request = urllib.request.Request(
        base + "/v1/chat/completions",
        data=body,
        headers={
            "Authorization": f"Bearer {os.environ.get('GYM_HARNESS_MODEL_API_KEY', '')}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=700) as response:  # the env bounds the wait
        return str(json.load(response)["choices"][0]["message"]["content"])


def main() -> None:
    pause = float(sys.argv[sys.argv.index("--pause") + 1]) if "--pause" in sys.argv else 0.3
    emit({"type": "ready"})
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("type") != "message":
            continue
        conversation = [{"role": "user", "content": str(message["content"])}]
        conversation.append({"role": "assistant", "content": ask(conversation)})
        time.sleep(pause)
        conversation.append({"role": "user", "content": "go on"})
        emit({"type": "turn_complete", "response": ask(conversation)})


if __name__ == "__main__":
    main()
