"""A line-protocol harness whose model is the env (the Command harness of the model-mode tests).

Usage: ``python model_agent.py [--ask-at-start]``. Each user message runs a ReAct loop:
a Chat Completions call to ``$GYM_HARNESS_MODEL_BASE_URL/v1/chat/completions`` (key
``$GYM_HARNESS_MODEL_API_KEY``, model ``main``) offering the bridge's tools; each tool
call of the answer runs over the MCP bridge (``gym_harness.agents._mcp_tools``, the
reference agent's client) and its result goes back as a ``tool`` message; a text
answer ends the turn. Words in the user message ask for more:

    "side"   first make a side call (model ``gym-side``, no tools), as a title call would;
             its answer, or "failed STATUS", is shown as ``[title: ...]``
    "stall"  after the first answer, go silent forever (a harness stuck after the answer)
    "retry"  on an API error, send the same call again (up to 5 times, 0.1 s apart), then
             end the turn as if done, saying so (as Gemini CLI does after its retries)
    "compact" once a tool result is in, send the first user message rewritten as a summary
             (a history the harness compacted between two calls)

With ``--ask-at-start`` it makes one main call before it says ``ready``; when that call
fails, every turn ends at once, as if done, with the status as its reply.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from gym_harness.agents._mcp_tools import MCPTools


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Agent:
    def __init__(self) -> None:
        import httpx2

        base = os.environ["GYM_HARNESS_MODEL_BASE_URL"].rstrip("/")
        self.url = base + "/v1/chat/completions"
        key = os.environ.get("GYM_HARNESS_MODEL_API_KEY", "")
        # Longer than any policy the tests run: the env, not this client, bounds the wait.
        self.http = httpx2.Client(headers={"Authorization": f"Bearer {key}"}, timeout=700.0)
        self.tools = MCPTools(
            os.environ.get("GYM_HARNESS_MCP_URL", ""),
            os.environ.get("GYM_HARNESS_MCP_TOKEN", ""),
            60.0,
        )
        self.messages: list[dict[str, Any]] = []
        self.functions: list[dict[str, Any]] | None = None

    def complete(self, body: dict[str, Any], retries: int = 0) -> dict[str, Any] | None:
        """The answer's message; ``None`` once ``retries`` retries failed too."""
        for attempt in range(retries + 1):
            reply = self.http.post(self.url, json=body)
            if reply.status_code == 200 or attempt == retries:
                break
            time.sleep(0.1)
        if reply.status_code != 200 and retries:
            return None
        reply.raise_for_status()
        message: dict[str, Any] = reply.json()["choices"][0]["message"]
        return message

    def tool_functions(self) -> list[dict[str, Any]]:
        if self.functions is None:
            self.functions = [
                {
                    "type": "function",
                    "function": {
                        "name": t["name"],
                        "description": t["description"],
                        "parameters": t["input_schema"] or {"type": "object", "properties": {}},
                    },
                }
                for t in self.tools.list_tools()
            ]
        return self.functions

    def turn(self, content: str) -> None:
        if "side" in content:
            ask = [{"role": "user", "content": "title: " + content}]
            reply = self.http.post(self.url, json={"model": "gym-side", "messages": ask})
            title = (  # a failed title call is no failed turn (as in the real CLIs)
                reply.json()["choices"][0]["message"].get("content")
                if reply.status_code == 200
                else f"failed {reply.status_code}"
            )
            emit({"type": "text", "text": f"[title: {title}] "})
        self.messages.append({"role": "user", "content": content})
        body = {"model": "main", "messages": self.messages, "tools": self.tool_functions()}
        while True:
            if "compact" in content and any(m["role"] == "tool" for m in self.messages):
                self.messages[0] = {"role": "user", "content": "summary: " + content}
            message = self.complete(body, retries=5 if "retry" in content else 0)
            if message is None:
                emit({"type": "turn_complete", "response": "the model failed", "done": False})
                return
            if "stall" in content:
                time.sleep(3600)
            calls = message.get("tool_calls") or []
            self.messages.append(
                {"role": "assistant", "content": message.get("content") or "", "tool_calls": calls}
                if calls
                else {"role": "assistant", "content": message.get("content") or ""}
            )
            if not calls:
                text = message.get("content") or ""
                emit({"type": "turn_complete", "response": text, "done": False})
                return
            for call in calls:
                name = call["function"]["name"]
                arguments = json.loads(call["function"]["arguments"] or "{}")
                emit({"type": "tool_call", "name": name, "arguments": arguments})
                text, is_error = self.tools.call(name, arguments)
                emit({"type": "tool_result", "name": name, "content": text, "is_error": is_error})
                self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})


def main() -> int:
    agent = Agent()
    status = 200
    if "--ask-at-start" in sys.argv[1:]:
        warm_up = {"model": "main", "messages": [{"role": "user", "content": "warm up"}]}
        status = agent.http.post(agent.url, json=warm_up).status_code
    emit({"type": "ready"})
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            if status != 200:
                emit({"type": "turn_complete", "response": f"model error {status}", "done": False})
                continue
            agent.turn(json.loads(line)["content"])
    finally:
        agent.tools.close()
        agent.http.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
