"""ACPHarness: any Agent Client Protocol agent (JSON-RPC 2.0, one message a line on stdio).

The adapter is the ACP *client*. Startup::

    -> initialize {protocolVersion: 1, clientCapabilities: {fs: off, terminal: off}}
    <- result
    -> session/new {cwd, mcpServers: [{type: "http", name, url, headers: [Authorization]}]}
    <- result {sessionId}                    ready

The bridge token travels in ``session/new`` over the agent's stdin, never argv.
Per turn ``session/prompt``; ``session/update`` notifications become events and
the ``session/prompt`` response (``stopReason``) ends the turn, its reply being
the turn's ``agent_message_chunk`` text. ``session/request_permission`` is
granted only for the env's tools; ``fs/*``, ``terminal/*`` and unknown requests
get a JSON-RPC "method not found" error (the client advertises neither).
``session/cancel`` interrupts a turn.

ACP has no standard way to list an agent's tools, and OpenCode 1.18, Qwen Code
0.15 and Gemini CLI 0.61 show none on stdout (OpenCode drops a failing
ACP-given MCP server silently). The session therefore cannot confirm the env
tools during startup: ``ACPSession.missing_tools`` fails the first turn as
``startup_failed`` unless the bridge saw the agent list them by its end, and the
presets in ``acp_presets`` make the wiring deterministic per agent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from gym_harness.config import HarnessConfig
from gym_harness.errors import ConfigError, ProtocolError
from gym_harness.harnesses._common import (
    RpcIds,
    content_text,
    not_json,
    parse_object,
    private_home_env,
    tools_not_loaded,
    turn_failed,
    usage_data,
)
from gym_harness.harnesses.base import EpisodeContext, Feed, Harness, HarnessSession, Launch
from gym_harness.outcome import Outcome
from gym_harness.records.events import EventType, HarnessEvent
from gym_harness.utils import bounded_json

__all__ = ["PROTOCOL_VERSION", "ACPHarness", "ACPSession"]

_NO_COMMAND = (
    "ACPHarness needs the agent's argv: ACPHarness(command=[...]), "
    "HarnessEnv('acp', command=[...]), or a preset such as 'opencode'."
)

#: The ACP protocol version this client speaks.
PROTOCOL_VERSION = 1
#: JSON-RPC "method not found": our answer to capabilities we did not advertise.
METHOD_NOT_FOUND = -32601


class ACPHarness(Harness):
    """A generic ACP client: runs ``command`` and speaks ACP to it.

    Args:
        command: The agent's argv (e.g. ``["opencode", "acp"]``); when empty,
            ``HarnessConfig.command`` is used. Presets build it.
        env: Extra environment variables for the agent.
        extra_args: Arguments appended to ``command``.

    Example:
        >>> from gym_harness import HarnessEnv
        >>> env = HarnessEnv("acp", command=["my-agent", "--acp"])  # doctest: +SKIP
    """

    name: ClassVar[str] = "acp"
    #: Whether ``session/new`` carries the env MCP server (some agents read it from a file).
    mcp_via_session: ClassVar[bool] = True

    def __init__(
        self,
        *,
        command: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.command = tuple(command)
        self.env = dict(env or {})
        self.extra_args = tuple(extra_args)

    def check_config(self, config: HarnessConfig) -> None:
        """A generic ACP agent needs its argv (presets know theirs)."""
        generic = type(self).agent_command is ACPHarness.agent_command
        if generic and not (self.command or config.command):
            raise ConfigError(_NO_COMMAND)

    def launch(self, ctx: EpisodeContext, config: HarnessConfig) -> Launch:
        """Return the agent's command and environment, and the episode's ``ACPSession``."""
        command = (*(self.agent_command(ctx) or config.command), *self.extra_args)
        if not command:
            raise ConfigError(_NO_COMMAND)
        env = {**private_home_env(ctx.home), **self.agent_env(ctx), **self.env, **config.env}
        session = ACPSession(ctx, self.mcp_servers(ctx))
        config = config.replace(command=list(command), env=env)
        return Launch(config, session, connect_ports=self.api_ports(ctx))

    def agent_command(self, ctx: EpisodeContext) -> Sequence[str]:
        """The agent's argv before ``extra_args``; presets override it (and write files)."""
        return self.command

    def agent_env(self, ctx: EpisodeContext) -> dict[str, str]:
        """Variables the agent needs besides HOME/XDG; presets override it."""
        return {}

    def api_ports(self, ctx: EpisodeContext) -> tuple[int, ...]:
        """TCP ports of the model API the agent calls itself (``Launch.connect_ports``);
        presets name theirs, a bare ACP agent's come from ``HarnessConfig.connect_ports``."""
        return ()

    def mcp_servers(self, ctx: EpisodeContext) -> list[dict[str, Any]]:
        """The ``session/new`` ``mcpServers`` list: the bridge as an HTTP server."""
        if not self.mcp_via_session:
            return []
        header = {"name": "Authorization", "value": f"Bearer {ctx.bridge_token}"}
        return [
            {"type": "http", "name": ctx.server_name, "url": ctx.bridge_url, "headers": [header]}
        ]


class ACPSession(HarnessSession):
    """One episode as the ACP client: ``initialize``, ``session/new``, prompts, permissions.

    ACP shows no tool list, so the tool check asks the bridge (``missing_tools``).

    Args:
        ctx: The episode (workspace, env tools, MCP server name).
        mcp_servers: The ``session/new`` ``mcpServers`` list (``ACPHarness.mcp_servers``).
    """

    def __init__(self, ctx: EpisodeContext, mcp_servers: Sequence[Mapping[str, Any]]) -> None:
        self.ctx = ctx
        self._mcp_servers = [dict(server) for server in mcp_servers]
        self._ids = RpcIds()
        self.session_id: str | None = None
        self.agent_info: dict[str, Any] = {}
        self._chunks: list[str] = []
        self._calls: dict[str, dict[str, Any]] = {}  # toolCallId -> what we know of it
        self._tools_confirmed = not ctx.tool_names

    def missing_tools(self, listed: Callable[[], bool]) -> str:
        """Until the bridge has seen the agent list the env tools: why the turn fails."""
        if self._tools_confirmed or listed():
            self._tools_confirmed = True
            return ""
        why = "it never listed them over MCP during its first turn (its MCP server "
        why += "configuration was dropped or broken)"
        return tools_not_loaded("The ACP agent", self.ctx, (), why)

    # ----------------------------------------------------------------- lines out

    def startup_lines(self) -> list[str]:
        """The ``initialize`` request; ``session/new`` follows its response."""
        capabilities = {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": capabilities,
            "clientInfo": {"name": "gym_harness", "version": "0.1.0"},
        }
        return [self._ids.request("initialize", params)]

    def message_lines(self, text: str) -> list[str]:
        """One ``session/prompt`` request carrying ``text``."""
        self._chunks = []
        prompt = [{"type": "text", "text": text}]
        return [
            self._ids.request("session/prompt", {"sessionId": self.session_id, "prompt": prompt})
        ]

    def interrupt_lines(self) -> list[str]:
        """The ``session/cancel`` notification (the prompt then ends with ``cancelled``)."""
        if self.session_id is None:
            return []
        return [self._ids.notification("session/cancel", {"sessionId": self.session_id})]

    # ----------------------------------------------------------------- lines in

    def feed(self, line: str) -> Feed:
        """Interpret one JSON-RPC message from the agent."""
        if not line.strip():
            return Feed()
        msg, why = parse_object(line)
        if msg is None:
            raise not_json("the ACP agent", line, why)
        method = msg.get("method")
        if isinstance(method, str):
            if "id" in msg:
                return self._request(msg["id"], method, msg.get("params") or {})
            if method == "session/update":
                return Feed(events=self._update(msg.get("params") or {}))
            return Feed(events=[HarnessEvent(EventType.OTHER, {"kind": method, "message": msg})])
        if "id" in msg:
            return self._response(msg)
        return Feed(events=[HarnessEvent(EventType.OTHER, {"kind": "unknown", "message": msg})])

    def _response(self, msg: dict[str, Any]) -> Feed:
        method = self._ids.settle(msg.get("id"))
        error = msg.get("error")
        result = msg.get("result")
        if method == "initialize":
            if error is not None:
                return _failed(Outcome.STARTUP_FAILED, f"the ACP agent refused initialize: {error}")
            self.agent_info = dict((result or {}).get("agentInfo") or {})
            params = {"cwd": str(self.ctx.workspace), "mcpServers": self._mcp_servers}
            event = HarnessEvent(EventType.OTHER, {"kind": "initialize", "result": result})
            return Feed(events=[event], replies=[self._ids.request("session/new", params)])
        if method == "session/new":
            if error is not None or not isinstance(result, dict) or not result.get("sessionId"):
                return _failed(
                    Outcome.STARTUP_FAILED, f"the ACP agent did not open a session: {error}"
                )
            self.session_id = str(result["sessionId"])
            event = HarnessEvent(
                EventType.OTHER, {"kind": "session_new", "session_id": self.session_id}
            )
            return Feed(events=[event], ready=True)
        if method == "session/prompt":
            return self._prompt_done(result, error)
        if method is None:
            raise ProtocolError(f"the ACP agent answered an unknown request: {msg}")
        return Feed(events=[HarnessEvent(EventType.OTHER, {"kind": method, "message": msg})])

    def _prompt_done(self, result: Any, error: Any) -> Feed:
        response = "".join(self._chunks)
        if error is not None:
            message = error.get("message", str(error)) if isinstance(error, dict) else str(error)
            return turn_failed(response, message, f"the ACP agent failed the prompt: {message}")
        events: list[HarnessEvent] = []
        result = result if isinstance(result, dict) else {}
        usage = result.get("usage") or (result.get("_meta") or {}).get("quota", {}).get(
            "token_count"
        )
        if isinstance(usage, dict):
            events.append(HarnessEvent(EventType.LLM_USAGE, _usage(usage)))
        stop = str(result.get("stopReason", ""))
        events.append(HarnessEvent(EventType.OTHER, {"kind": "stop", "stop_reason": stop}))
        return Feed(events=events, turn_complete=True, response=response)

    # ----------------------------------------------------------------- agent -> client requests

    def _request(self, request_id: Any, method: str, params: dict[str, Any]) -> Feed:
        if method == "session/request_permission":
            return self._permission(request_id, params)
        # fs/* and terminal/* were not advertised; anything else is unknown to us.
        reply = self._ids.error(request_id, METHOD_NOT_FOUND, f"{method} is not supported")
        event = HarnessEvent(EventType.OTHER, {"kind": "refused_request", "method": method})
        return Feed(events=[event], replies=[reply])

    def _permission(self, request_id: Any, params: dict[str, Any]) -> Feed:
        tool_call = params.get("toolCall") or {}
        options = [o for o in params.get("options") or [] if isinstance(o, dict)]
        env_tool = self.env_tool_name(tool_call, options)
        call = self._remember(tool_call, permission=True)
        if env_tool:
            call["name"] = env_tool
        elif call["name"] in self.ctx.tool_names:
            env_tool = call["name"]  # named by the call's own update (codex-acp's "Approve Add")
        wanted = ("allow_always", "allow_once") if env_tool else ("reject_once", "reject_always")
        chosen = next((o for kind in wanted for o in options if o.get("kind") == kind), None)
        outcome = (
            {"outcome": "selected", "optionId": chosen["optionId"]}
            if chosen is not None
            else {"outcome": "cancelled"}
        )
        data = {
            "kind": "permission",
            "tool": env_tool or _title(tool_call),
            "granted": bool(env_tool and chosen is not None),
        }
        reply = self._ids.result(request_id, {"outcome": outcome})
        return Feed(events=[HarnessEvent(EventType.OTHER, data)], replies=[reply])

    def env_tool_name(
        self, tool_call: Mapping[str, Any], options: Sequence[Mapping[str, Any]] = ()
    ) -> str:
        """The env tool a ``toolCall`` (or its permission options) names, else ``""``.

        Agents name MCP tools differently: ``mcp__env__NAME`` (Qwen Code, Claude),
        ``env_NAME`` (OpenCode), ``NAME (env MCP Server)`` (Gemini CLI), ``Tool: env/NAME``
        (codex-acp); Qwen Code's permission title is the arguments, so its options
        (``"...: NAME"``) count too.
        """
        server = re.escape(self.ctx.server_name)
        meta = tool_call.get("_meta") or {}
        texts = [str(tool_call.get("title") or "")]
        if isinstance(meta, dict):
            texts += [str(v) for k, v in meta.items() if k.lower().endswith("toolname")]
        for name in self.ctx.tool_names:
            tool = re.escape(name)
            patterns = (
                rf"mcp__{server}__{tool}",
                rf"{server}[_.]{tool}",
                rf"{tool} \({server} MCP Server\)",
                rf"Tool: {server}/{tool}",  # codex-acp
            )
            if any(re.fullmatch(p, t.strip()) for p in patterns for t in texts):
                return name
            if any(str(o.get("name", "")).endswith(f": {name}") for o in options):
                return name
        return ""

    # ----------------------------------------------------------------- session/update

    def _update(self, params: dict[str, Any]) -> list[HarnessEvent]:
        update = params.get("update") or {}
        kind = update.get("sessionUpdate")
        events: list[HarnessEvent] = []
        meta_usage = (update.get("_meta") or {}).get("usage")
        if kind == "agent_message_chunk":
            text = content_text(update.get("content"))
            if text:
                self._chunks.append(text)
                events.append(HarnessEvent(EventType.TEXT, {"text": text}))
        elif kind == "agent_thought_chunk":
            events.append(
                HarnessEvent(
                    EventType.OTHER,
                    {"kind": "thought", "text": content_text(update.get("content"))},
                )
            )
        elif kind in ("tool_call", "tool_call_update"):
            events += self._tool_update(update)
        elif kind == "usage_update":
            events.append(
                HarnessEvent(EventType.OTHER, {"kind": "context_usage", **_plain(update)})
            )
        else:
            events.append(HarnessEvent(EventType.OTHER, {"kind": str(kind), "update": update}))
        if isinstance(meta_usage, dict):
            events.append(HarnessEvent(EventType.LLM_USAGE, _usage(meta_usage)))
        return events

    def _remember(self, tool_call: Mapping[str, Any], permission: bool = False) -> dict[str, Any]:
        call_id = str(tool_call.get("toolCallId", ""))
        call = self._calls.setdefault(
            call_id, {"id": call_id, "name": "", "arguments": {}, "emitted": False}
        )
        name = self.env_tool_name(tool_call)
        if name:
            call["name"] = name
        elif not call["name"] and tool_call.get("title"):
            call["name"] = _title(tool_call)
        arguments = _arguments(tool_call)
        # A finished call's content is its output (claude-agent-acp's JSON results look
        # like arguments), and a permission request's rawInput may be the request itself
        # (codex-acp): once arguments are known, only a call update's rawInput changes them.
        raw = bool(tool_call.get("rawInput"))
        finished = tool_call.get("status") in ("completed", "failed")
        if arguments and ((raw and not permission) if call["arguments"] else (raw or not finished)):
            call["arguments"] = arguments
        return call

    def _tool_update(self, update: dict[str, Any]) -> list[HarnessEvent]:
        call = self._remember(update)
        status = update.get("status")
        events: list[HarnessEvent] = []
        # OpenCode sends the arguments only with in_progress, Qwen Code and Gemini CLI
        # only with the permission request: the call is reported once it is under way.
        if not call["emitted"] and status in ("in_progress", "completed", "failed"):
            call["emitted"] = True
            data = {"name": call["name"], "arguments": call["arguments"], "id": call["id"]}
            if call["name"] in self.ctx.tool_names:
                data["server"] = self.ctx.server_name
            events.append(HarnessEvent(EventType.TOOL_CALL, data))
        if status in ("completed", "failed"):
            content = _tool_content(update)
            events.append(
                HarnessEvent(
                    EventType.TOOL_RESULT,
                    {
                        "name": call["name"],
                        "content": content,
                        "is_error": status == "failed",
                        "id": call["id"],
                    },
                )
            )
        elif not events:
            events.append(
                HarnessEvent(
                    EventType.OTHER, {"kind": str(update.get("sessionUpdate")), "update": update}
                )
            )
        return events


def _failed(error_type: Outcome, error: str) -> Feed:
    event = HarnessEvent(EventType.ERROR, {"error_type": error_type.value, "message": error})
    return Feed(events=[event], error_type=error_type, error=error)


def _title(tool_call: Mapping[str, Any]) -> str:
    return str(tool_call.get("title") or tool_call.get("kind") or "")


def _arguments(tool_call: Mapping[str, Any]) -> dict[str, Any]:
    raw = tool_call.get("rawInput")
    if isinstance(raw, dict) and raw:
        inner = raw.get("arguments")
        if isinstance(inner, dict) and "server" in raw and "tool" in raw:  # codex-acp
            return dict(inner)
        return dict(raw)
    # Gemini CLI shows the arguments only as the permission request's text content.
    text = content_text(tool_call.get("content"))
    if text.startswith("{"):
        try:
            parsed = bounded_json.loads(text)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def _tool_content(update: Mapping[str, Any]) -> str:
    text = content_text(update.get("content"))
    if text:
        return text
    raw = update.get("rawOutput")
    if isinstance(raw, str):
        return raw
    if isinstance(raw, dict) and isinstance(raw.get("output"), str):
        return str(raw["output"])
    return "" if raw is None else json.dumps(raw)


def _usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """ACP usage (camelCase, or Gemini's snake_case quota) as our llm_usage data."""
    return usage_data(
        usage,
        ("inputTokens", "outputTokens"),
        ("totalTokens", "thoughtTokens", "cachedReadTokens", "cachedWriteTokens"),
    )


def _plain(update: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in update.items() if k != "sessionUpdate"}
