"""The reference harness: a small agent that speaks gym_harness line protocol v1.

Run it as ``python -m gym_harness.agents.reference [--policy scripted|openai]``.
It prints ``{"type":"ready"}`` at once, then answers every
``{"type":"message","content":...}`` line on stdin with events and one
``{"type":"turn_complete","response":...,"done":...}`` line on stdout. It exits 0
at end of input (closing its MCP session first) and at once on SIGTERM.

The env's tools are reached through the MCP bridge named by the environment
variables ``GYM_HARNESS_MCP_URL`` and ``GYM_HARNESS_MCP_TOKEN`` (sent as
``Authorization: Bearer``), with the MCP SDK's client over streamable HTTP. One
session is opened at the first tool use and kept for the whole process.

Policies:

``scripted`` (default; deterministic, no network but the bridge). Each line of a
message is read in order:

* ``/call NAME {json}`` calls tool NAME with the JSON object as arguments
  (``{}`` if omitted), emitting ``tool_call`` and ``tool_result`` events; the
  response gets ``NAME -> RESULT`` (or ``NAME failed: ERROR``).
* ``/tools`` lists the bridge's tools; the response gets ``tools: a, b, c``.
* ``/done [TEXT]`` ends the turn with ``done: true``; TEXT joins the response.
* Any other line is echoed: a run of such lines becomes ``You said: TEXT``.

The response is these parts joined by newlines, in line order, so a reward can
check tool results in it; it is also sent as one ``text`` event. A message with
nothing in it (or a bare ``/done``) gets an empty response.

``openai``: any OpenAI-compatible chat-completions endpoint, given by
``--base-url`` (or ``OPENAI_BASE_URL``; requests go to ``BASE_URL/chat/completions``,
so include ``/v1`` where the server wants it), ``--model`` (or ``OPENAI_MODEL``) and
``--api-key-env NAME`` (the variable holding the key, default ``OPENAI_API_KEY``; no
key, no Authorization header). A ReAct loop with function calling over the bridge's
tools, listed afresh at each turn's start (an env may offer other tools from one turn to
the next): at most ``--max-tool-calls`` tool calls per turn (further calls are refused
and the model is asked to answer), history kept across turns, one ``llm_usage``
event per model reply. A failing model endpoint gives an ``error`` event and a
``turn_complete`` carrying the error text; that turn is dropped from the history.

Input that is not JSON gets an ``error`` event and is otherwise ignored, as are
objects whose type is not ``message``.

Forking: the ready line says ``"fork": true``. The ``openai`` policy keeps its history
in ``$HOME/.gym_harness/reference-history.json`` after every turn, and a process started
with ``GYM_HARNESS_FORKED_FROM`` set (its home a copy of the parent episode's) goes on
from that history; the ``scripted`` policy keeps no state between turns.

Startup time matters (a reset waits for ``ready``), and so does the first tool call:
the agent imports the standard library alone (its MCP and model clients are plain
JSON over ``http.client``). Nothing is imported from gym_harness, so the file also
runs as a plain script.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:
    from gym_harness.agents._mcp_tools import KeptConnection, MCPTools, describe
else:  # run by path, as the env runs it: the sibling module, and gym_harness stays unimported
    from _mcp_tools import KeptConnection, MCPTools, describe

if TYPE_CHECKING:
    import argparse

__all__ = ["main"]


class _StdoutClosed(Exception):
    """The env closed our stdout: nobody is listening, so stop as at end of input."""


class _ModelError(Exception):
    """The model endpoint failed or answered something we cannot use."""


def _history_path() -> str:
    return os.path.join(os.path.expanduser("~"), ".gym_harness", "reference-history.json")


def _saved_history() -> list[dict[str, Any]]:
    """The history a forked process goes on from (``GYM_HARNESS_FORKED_FROM`` is set)."""
    if not os.environ.get("GYM_HARNESS_FORKED_FROM"):
        return []
    try:
        with open(_history_path(), encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return []  # the parent had no turn of the openai policy yet
    return [m for m in saved if isinstance(m, dict)] if isinstance(saved, list) else []


def _save_history(messages: list[dict[str, Any]]) -> None:
    """Keep the history where a fork's copy of the home finds it (written whole)."""
    path = _history_path()
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(messages, f)
        os.replace(path + ".tmp", path)
    except OSError as exc:
        _emit({"type": "error", "message": f"could not save the history for forks: {exc}"})


def _emit(event: dict[str, Any]) -> None:
    # ASCII-only JSON: no locale or stray surrogate can make the write fail.
    try:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError) as exc:
        raise _StdoutClosed(str(exc)) from exc


class ScriptedPolicy:
    """The deterministic policy (see the module docstring)."""

    def __init__(self, tools: MCPTools) -> None:
        self._tools = tools

    def turn(self, content: str) -> None:
        """Run one turn: emit its events and the ``turn_complete`` line."""
        parts: list[str] = []
        said: list[str] = []
        done = False

        def flush_said() -> None:
            if said:
                parts.append("You said: " + "\n".join(said))
                said.clear()

        for line in content.splitlines():
            command, _, rest = line.strip().partition(" ")
            if command not in ("/call", "/tools", "/done"):
                said.append(line)
                continue
            flush_said()
            if command == "/call":
                parts.append(self._call(rest.strip()))
            elif command == "/tools":
                parts.append(self._list())
            else:
                done = True
                if rest.strip():
                    parts.append(rest.strip())
        flush_said()
        response = "\n".join(parts)
        _emit({"type": "text", "text": response})
        _emit({"type": "turn_complete", "response": response, "done": done})

    def _call(self, spec: str) -> str:
        name, _, raw_args = spec.partition(" ")
        try:
            arguments = json.loads(raw_args) if raw_args.strip() else {}
        except ValueError as exc:
            arguments = exc
        if not name or not isinstance(arguments, dict):
            error = f"bad /call line {spec!r}: expected /call NAME {{json object}}"
            _emit({"type": "error", "message": error})
            return f"error: {error}"
        _emit({"type": "tool_call", "name": name, "arguments": arguments})
        text, is_error = self._tools.call(name, arguments)
        _emit({"type": "tool_result", "name": name, "content": text, "is_error": is_error})
        return f"{name} failed: {text}" if is_error else f"{name} -> {text}"

    def _list(self) -> str:
        try:
            names = [tool["name"] for tool in self._tools.list_tools()]
        except RuntimeError as exc:
            _emit({"type": "error", "message": str(exc)})
            return f"error: {exc}"
        return "tools: " + ", ".join(names)


class OpenAIPolicy:
    """A ReAct loop over an OpenAI-compatible chat-completions endpoint.

    Args:
        tools: The bridge's tools.
        args: The parsed command line (base_url, model, api_key_env, ...).
    """

    def __init__(self, tools: MCPTools, args: argparse.Namespace) -> None:
        self._tools = tools
        self._url = args.base_url.rstrip("/") + "/chat/completions"
        self._model = args.model
        self._api_key = os.environ.get(args.api_key_env, "")
        self._max_tool_calls = args.max_tool_calls
        self._timeout_s = args.request_timeout
        self._messages: list[dict[str, Any]] = _saved_history()
        if args.system_prompt and not self._messages:
            self._messages.append({"role": "system", "content": args.system_prompt})
        self._functions: list[dict[str, Any]] | None = None
        self._http = KeptConnection(self._url, self._timeout_s)

    def turn(self, content: str) -> None:
        """Run one turn: emit its events and the ``turn_complete`` line."""
        mark = len(self._messages)
        self._functions = None  # listed afresh: the env may offer other tools this turn
        self._messages.append({"role": "user", "content": content})
        try:
            response = self._react()
        except _ModelError as exc:
            del self._messages[mark:]  # a half-done turn would leave the history invalid
            _emit({"type": "error", "message": str(exc)})
            _emit({"type": "turn_complete", "response": str(exc), "done": False})
            return
        _save_history(self._messages)
        _emit({"type": "turn_complete", "response": response, "done": False})

    def close(self) -> None:
        """Close the HTTP client, if one was opened."""
        self._http.close()

    def _react(self) -> str:
        functions = self._tool_functions()
        calls = 0
        content = ""
        # Every round before the budget is spent uses some of it; then at most two more.
        for _ in range(self._max_tool_calls + 2):
            body: dict[str, Any] = {"model": self._model, "messages": self._messages}
            if functions:
                body["tools"] = functions
                body["tool_choice"] = "auto" if calls < self._max_tool_calls else "none"
            message = self._complete(body)
            content = message.get("content") or ""
            tool_calls = message.get("tool_calls") or []
            assistant: dict[str, Any] = {"role": "assistant", "content": content or None}
            if tool_calls:
                assistant["tool_calls"] = tool_calls
            self._messages.append(assistant)
            if content:
                _emit({"type": "text", "text": content})
            if not tool_calls:
                return str(content)
            for call in tool_calls:
                result, calls = self._run_tool_call(call, calls)
                self._messages.append(
                    {"role": "tool", "tool_call_id": call.get("id", ""), "content": result}
                )
        return content or "stopped: the model kept calling tools past --max-tool-calls"

    def _run_tool_call(self, call: dict[str, Any], calls: int) -> tuple[str, int]:
        function = call.get("function") or {}
        name = str(function.get("name", ""))
        if calls >= self._max_tool_calls:
            return "refused: the tool-call budget of this turn is spent; answer now", calls
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            return f"error: arguments of {name} are not a JSON object", calls
        _emit({"type": "tool_call", "name": name, "arguments": arguments})
        text, is_error = self._tools.call(name, arguments)
        _emit({"type": "tool_result", "name": name, "content": text, "is_error": is_error})
        return text, calls + 1

    def _tool_functions(self) -> list[dict[str, Any]]:
        if self._functions is None:
            try:
                tools = self._tools.list_tools()
            except RuntimeError as exc:
                _emit({"type": "error", "message": f"no tools: {exc}"})
                return []
            self._functions = [
                {
                    "type": "function",
                    "function": {
                        "name": tool["name"],
                        "description": tool["description"],
                        "parameters": tool["input_schema"] or {"type": "object", "properties": {}},
                    },
                }
                for tool in tools
            ]
        return self._functions

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        try:
            status, _, raw = self._http.post(json.dumps(body).encode(), headers)
        except RuntimeError as exc:
            raise _ModelError(f"model endpoint {self._url} failed: {exc}") from exc
        text = raw[:500].decode(errors="replace")
        if status >= 400:
            raise _ModelError(f"model endpoint {self._url} returned HTTP {status}: {text}")
        try:
            data = json.loads(raw)
            message = data["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise _ModelError(f"model endpoint {self._url} sent no usable choice: {text}") from exc
        usage = data.get("usage") or {}
        _emit(
            {
                "type": "llm_usage",
                "model": data.get("model", self._model),
                "input_tokens": usage.get("prompt_tokens", 0),
                "output_tokens": usage.get("completion_tokens", 0),
                "total_tokens": usage.get("total_tokens", 0),
            }
        )
        if not isinstance(message, dict):
            raise _ModelError(f"model endpoint {self._url} sent a message that is not an object")
        return message


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m gym_harness.agents.reference",
        description="gym_harness reference harness (line protocol v1 on stdin/stdout).",
    )
    parser.add_argument("--policy", choices=("scripted", "openai"), default="scripted")
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"))
    parser.add_argument("--model", default=os.environ.get("OPENAI_MODEL"))
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="NAME")
    parser.add_argument("--max-tool-calls", type=int, default=8)
    parser.add_argument("--system-prompt", default=None)
    parser.add_argument("--request-timeout", type=float, default=600.0, metavar="SECONDS")
    parser.add_argument("--tool-timeout", type=float, default=300.0, metavar="SECONDS")
    args = parser.parse_args(argv)
    if args.policy == "openai" and not (args.base_url and args.model):
        parser.error("--policy openai needs --base-url and --model (or OPENAI_BASE_URL/MODEL)")
    if args.max_tool_calls < 0:
        parser.error("--max-tool-calls must be >= 0")
    return args


def _serve(policy: ScriptedPolicy | OpenAIPolicy) -> None:
    while line := sys.stdin.buffer.readline():
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError as exc:
            _emit({"type": "error", "message": f"input line is not JSON ({exc}): {line[:200]!r}"})
            continue
        if not isinstance(message, dict) or message.get("type") != "message":
            continue
        content = message.get("content")
        if not isinstance(content, str):
            error = f"message content must be a string, got {type(content).__name__}"
            _emit({"type": "error", "message": error})
            _emit({"type": "turn_complete", "response": error, "done": False})
            continue
        try:
            policy.turn(content)
        except _StdoutClosed:
            raise
        except Exception as exc:  # a bug here must cost a turn, not the episode
            error = f"reference agent failed: {describe(exc)}"
            _emit({"type": "error", "message": error})
            _emit({"type": "turn_complete", "response": error, "done": False})


def main(argv: list[str] | None = None) -> int:
    """Run the reference harness until end of input.

    Args:
        argv: Command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 at end of input or when stdout was closed.
    """
    args = _parse_args(argv)
    try:
        _emit({"type": "ready", "fork": True})
    except _StdoutClosed:
        return 0
    tools = MCPTools(
        os.environ.get("GYM_HARNESS_MCP_URL", ""),
        os.environ.get("GYM_HARNESS_MCP_TOKEN", ""),
        args.tool_timeout,
    )
    policy = ScriptedPolicy(tools) if args.policy == "scripted" else OpenAIPolicy(tools, args)
    try:
        _serve(policy)
    except _StdoutClosed:
        # Keep interpreter shutdown from failing on the final flush of a closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    finally:
        if isinstance(policy, OpenAIPolicy):
            policy.close()
        tools.close()
    return 0


if __name__ == "__main__":
    exit_code = main()
    # Sessions are closed and lines flushed; skip interpreter teardown, which spends
    # up to a second collecting the MCP client's modules while an env waits for us.
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(exit_code)
