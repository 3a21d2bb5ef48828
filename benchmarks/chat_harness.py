"""The minimal harness of the latency benchmarks: sequential Chat Completions calls, nothing else.

Line protocol v1 (run by path; the standard library only, so any interpreter runs it). Per
user message it calls ``$GYM_HARNESS_MODEL_BASE_URL/v1/chat/completions`` (key
``$GYM_HARNESS_MODEL_API_KEY``) with its whole conversation, over one keep-alive
connection, until an answer has no tool call. Each tool call gets a fixed result of
:data:`RESULT_BYTES` bytes (no tool runs), so the conversation grows by two messages a
call. ``turn_complete``'s ``response`` is the JSON list of each call's seconds, timed
here: from the request's first byte sent to the answer's last byte read.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
import urllib.parse
from typing import Any

RESULT_BYTES = 200
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Model:
    """One keep-alive connection to the model endpoint."""

    def __init__(self) -> None:
        base = urllib.parse.urlsplit(os.environ["GYM_HARNESS_MODEL_BASE_URL"].rstrip("/"))
        self.netloc, self.path = base.netloc, base.path + "/v1/chat/completions"
        key = os.environ.get("GYM_HARNESS_MODEL_API_KEY", "")
        self.headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        self.conn = http.client.HTTPConnection(self.netloc, timeout=600)

    def call(self, body: bytes) -> dict[str, Any]:
        for attempt in (0, 1):  # a keep-alive connection the server closed: once more
            try:
                self.conn.request("POST", self.path, body, self.headers)
                reply = self.conn.getresponse()
                data = reply.read()
                break
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = http.client.HTTPConnection(self.netloc, timeout=600)
                if attempt:
                    raise
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {data[:300]!r}")
        answer: dict[str, Any] = json.loads(data)["choices"][0]["message"]
        return answer


def turn(model: Model, content: str) -> list[float]:
    """One turn, a conversation of its own: the user message, then the calls."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": content}]
    times = []
    while True:
        body = json.dumps({"model": "m", "messages": messages, "tools": TOOLS}).encode()
        start = time.perf_counter()
        answer = model.call(body)
        times.append(time.perf_counter() - start)
        calls = answer.get("tool_calls") or []
        messages.append(
            {"role": "assistant", "content": answer.get("content") or "", "tool_calls": calls}
        )
        if not calls:
            return times
        for call in calls:
            result = ("5 " + "." * RESULT_BYTES)[:RESULT_BYTES]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})


def main() -> None:
    emit({"type": "ready"})
    model = Model()
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("type") != "message":
            continue
        try:
            times = turn(model, str(message["content"]))
        except Exception as exc:  # the turn fails; the driver reads why
            emit({"type": "turn_complete", "response": f"error: {exc}", "done": True})
            continue
        emit({"type": "turn_complete", "response": json.dumps(times), "done": False})


if __name__ == "__main__":
    main()
