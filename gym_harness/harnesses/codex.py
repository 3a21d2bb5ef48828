"""CodexHarness: one long-lived ``codex app-server`` speaking JSON-RPC on stdio.

Per episode the adapter writes a private ``CODEX_HOME/config.toml`` (model
provider with our base URL, no retries, approvals never, telemetry off; see
``codex_config``) and starts ``codex app-server``. The handshake runs through
``startup_lines``/``feed``::

    initialize -> initialized + thread/start (env MCP server in the thread's config)
    -> mcpServer/startupStatus/updated "ready" -> mcpServerStatus/list (the tool check)

and the episode is ready once the env server lists every env tool. The bridge
token reaches Codex through an environment variable named by the server
entry's ``bearer_token_env_var``: never argv, never a file. Each turn is a
``turn/start``; ``turn/completed`` ends it; ``turn/interrupt`` stops it.

npm installs ``codex`` as a node launcher (``@openai/codex/bin/codex.js``) that
starts the native binary of a platform package. The adapter starts that binary
directly when it finds it (``native_codex``): the pid the env watches is then
Codex itself, not a launcher whose death the binary would outlive, and a node
process and its start-up are saved.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from gym_harness.config import HarnessConfig
from gym_harness.errors import ForkUnsupported
from gym_harness.harnesses._common import (
    MODEL_KEY_VAR,
    RpcIds,
    api_ports,
    content_text,
    not_json,
    openai_base,
    parse_object,
    policy_wait_ms,
    present,
    private_home_env,
    require_executable,
    require_key,
    tools_not_loaded,
    turn_failed,
    usage_data,
    write_private,
)
from gym_harness.harnesses.base import EpisodeContext, Feed, Harness, HarnessSession, Launch
from gym_harness.harnesses.codex_config import (
    DEFAULT_OPENAI_BASE,
    KNOWN_MODELS,
    catalog_entry,
    codex_config,
    native_codex,
)
from gym_harness.outcome import Outcome
from gym_harness.records.events import EventType, HarnessEvent

if TYPE_CHECKING:
    from gym_harness.model.request import ModelRequest

__all__ = ["CodexHarness", "CodexSession", "native_codex"]

#: The variable holding the bridge token (named by the MCP entry's ``bearer_token_env_var``).
TOKEN_VAR = "GYM_HARNESS_MCP_TOKEN"
#: How each approval request is answered (env tools are approved up front).
_DECLINE: dict[str, Any] = {
    "item/commandExecution/requestApproval": {"decision": "decline"},
    "item/fileChange/requestApproval": {"decision": "decline"},
    "execCommandApproval": {"decision": "denied"},
    "applyPatchApproval": {"decision": "denied"},
    "item/permissions/requestApproval": {"permissions": {}, "scope": "turn"},
    "item/tool/requestUserInput": {"answers": {}},
}
#: The kind of a model call in Codex's ``x-codex-turn-metadata`` header ("turn": the agent's).
_REQUEST_KIND = re.compile(r'"request_kind"\s*:\s*"([^"]*)"')
#: Thread items that are tool calls, and the name an event gives them.
_TOOL_ITEMS = {"commandExecution": "shell", "fileChange": "apply_patch", "webSearch": "web_search"}


class CodexHarness(Harness):
    """OpenAI Codex (``codex app-server``) as a harness.

    Args:
        executable: The ``codex`` command or a path to it.
        model: The model name; ``None`` keeps Codex's default.
        base_url: An OpenAI-Responses-compatible endpoint (``.../v1``); ``None``
            uses ``OPENAI_BASE_URL`` from the user's environment, else OpenAI's.
        api_key_env: The variable in the user's environment holding the API key
            (passed through by name: its value is never copied into the config).
        sandbox: ``"read-only"``, ``"workspace-write"`` or ``"danger-full-access"``.
        model_catalog: A ``model_catalog_json`` entry: ``None`` writes one only for
            a model name this Codex version does not know, ``False`` never, or a
            dict (an entry from ``codex debug models``) used as given.
        extra_config: More ``config.toml`` keys, merged over ours (nested dicts are tables).
        extra_args: More ``codex`` arguments, placed before ``app-server``
            (``["-c", "key=value"]``).
        native: When ``executable`` is npm's node launcher, start the native binary
            it would start instead (when it can be found; see ``native_codex``).

    Example:
        >>> import gymnasium
        >>> env = gymnasium.make("gym_harness/Codex-v0", model="gpt-5.5")  # doctest: +SKIP
    """

    name: ClassVar[str] = "codex"
    #: Codex reports each tool call's wall time in its result.
    replay_noise: ClassVar[tuple[str, ...]] = (r"Wall time: [0-9.]+ seconds",)

    def __init__(
        self,
        *,
        executable: str = "codex",
        model: str | None = None,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        sandbox: str = "workspace-write",
        model_catalog: bool | Mapping[str, Any] | None = None,
        extra_config: Mapping[str, Any] | None = None,
        extra_args: Sequence[str] = (),
        native: bool = True,
    ) -> None:
        self.executable = executable
        self.native = native
        self.model = model
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.sandbox = sandbox
        self.model_catalog: bool | dict[str, Any] | None = (
            dict(model_catalog) if isinstance(model_catalog, Mapping) else model_catalog
        )
        self.extra_config = dict(extra_config or {})
        self.extra_args = tuple(extra_args)

    def side_call(self, request: ModelRequest, headers: Mapping[str, str]) -> bool:
        """Codex marks its agent's calls ``"request_kind":"turn"`` (x-codex-turn-metadata);
        a subagent's (reviews, compaction) carry ``x-openai-subagent`` or another kind."""
        if "x-openai-subagent" in headers:
            return True
        kind = _REQUEST_KIND.search(headers.get("x-codex-turn-metadata", ""))
        return kind is not None and kind.group(1) != "turn"

    def preflight(self, config: HarnessConfig, *, captured: bool = False) -> None:
        """``codex`` is found, and its API key is set unless the capture proxy gives one."""
        require_executable(self.executable, config, "Codex", "codex")
        if not captured:
            require_key("Codex", [self.api_key_env], config, "api_key_env")

    def mcp_server_entry(self, ctx: EpisodeContext) -> dict[str, Any]:
        """The thread's ``mcp_servers.<name>`` entry for the bridge (token by env var)."""
        return {
            "url": ctx.bridge_url,
            "bearer_token_env_var": TOKEN_VAR,
            "default_tools_approval_mode": "approve",
        }

    def thread_params(self, ctx: EpisodeContext) -> dict[str, Any]:
        """The ``thread/start`` parameters: the workspace, no approvals, the env MCP server."""
        return {
            "cwd": str(ctx.workspace),
            "approvalPolicy": "never",
            "sandbox": self.sandbox,
            "config": {"mcp_servers": {ctx.server_name: self.mcp_server_entry(ctx)}},
        }

    def fork_session(self, session: HarnessSession | None) -> dict[str, str]:
        """Codex forks the thread its session started (``thread/fork``), from a copy of
        ``CODEX_HOME``, where the thread's rollout is kept."""
        if isinstance(session, CodexSession) and session.thread_id:
            return {"thread_id": session.thread_id}
        raise ForkUnsupported(
            f"the {self.name!r} harness cannot fork this episode: Codex has no thread yet "
            "(its handshake did not finish); reset, then fork."
        )

    def launch(self, ctx: EpisodeContext, config: HarnessConfig) -> Launch:
        """Write ``CODEX_HOME/config.toml``; return the ``codex app-server`` command and session."""
        origin = self.resume_copy(ctx)
        codex_home = ctx.home / "codex"
        codex_home.mkdir(mode=0o700, exist_ok=True)
        if origin is not None:  # its databases name the parent's paths: the rollouts tell
            for state in codex_home.glob("*.sqlite*"):
                state.unlink()
        env = {**private_home_env(ctx.home), "CODEX_HOME": str(codex_home)}
        env[TOKEN_VAR] = ctx.bridge_token
        inherit = tuple(n for n in config.inherit_env if n not in ("CODEX_HOME", TOKEN_VAR))
        if ctx.model_base_url:
            base_url = openai_base(ctx.model_base_url)
            key_var = MODEL_KEY_VAR
            env[MODEL_KEY_VAR] = ctx.model_api_key or ""
        else:
            base_url = self.base_url or os.environ.get("OPENAI_BASE_URL") or ""
            key_var = self.api_key_env
            inherit += tuple(n for n in present([key_var]) if n not in inherit)
        catalog_path = None
        entry = self._catalog()
        if entry is not None:
            catalog_path = write_private(
                codex_home / "model_catalog.json", json.dumps({"models": [entry]})
            )
        toml = codex_config(
            model=self.model,
            base_url=base_url or DEFAULT_OPENAI_BASE,
            key_var=key_var,
            sandbox=self.sandbox,
            catalog_path=catalog_path,
            extra=self.extra_config,
            stream_idle_timeout_ms=policy_wait_ms(ctx),
        )
        write_private(codex_home / "config.toml", toml)
        executable = self.executable
        if self.native:
            path = config.env.get("PATH") or os.environ.get("PATH", os.defpath)
            native = native_codex(executable, path)
            if native is not None:
                executable, package = native
                # What the launcher itself sets for the binary (update hints).
                env["CODEX_MANAGED_PACKAGE_ROOT"] = package
                env["CODEX_MANAGED_BY_NPM"] = "1"
        command = [executable, *self.extra_args, "app-server"]
        config = config.replace(command=command, env={**env, **config.env}, inherit_env=inherit)
        ports = api_ports(ctx, base_url or DEFAULT_OPENAI_BASE)
        params = self.thread_params(ctx)
        if origin is not None:  # a fork of the parent's thread instead of a new one
            params["threadId"] = origin.session["thread_id"]
        return Launch(config, CodexSession(ctx, params), connect_ports=ports)

    def _catalog(self) -> dict[str, Any] | None:
        if isinstance(self.model_catalog, dict):
            return {**self.model_catalog, "slug": self.model or self.model_catalog["slug"]}
        if self.model_catalog is False or not self.model or self.model in KNOWN_MODELS:
            return None
        return catalog_entry(self.model)


class CodexSession(HarnessSession):
    """One episode of ``codex app-server``: the handshake, the tool check, turns by JSON-RPC.

    Args:
        ctx: The episode (its env tools and MCP server name).
        thread_params: The ``thread/start`` parameters (``CodexHarness.thread_params``);
            with a ``threadId``, the ``thread/fork`` parameters of a fork of that thread.
    """

    def __init__(self, ctx: EpisodeContext, thread_params: Mapping[str, Any]) -> None:
        self.ctx = ctx
        self._thread_params = dict(thread_params)
        self._rpc = RpcIds()
        self.thread_id: str | None = None
        self.turn_id: str | None = None
        self._mcp_ready = False
        self._listed = False
        self._turn_texts: list[str] = []

    # ----------------------------------------------------------------- lines out

    def startup_lines(self) -> list[str]:
        """The ``initialize`` request; the rest of the handshake follows its answers."""
        return [
            self._rpc.request("initialize", {"clientInfo": {"name": "gym_harness", "version": "1"}})
        ]

    def message_lines(self, text: str) -> list[str]:
        """A ``turn/start`` with ``text`` as the user input."""
        self._turn_texts = []
        self.turn_id = None
        params = {"threadId": self.thread_id, "input": [{"type": "text", "text": text}]}
        return [self._rpc.request("turn/start", params)]

    def interrupt_lines(self) -> list[str]:
        """A ``turn/interrupt`` for the running turn (none before its id is known)."""
        if not self.thread_id or not self.turn_id:
            return []
        return [
            self._rpc.request(
                "turn/interrupt", {"threadId": self.thread_id, "turnId": self.turn_id}
            )
        ]

    # ----------------------------------------------------------------- lines in

    def feed(self, line: str) -> Feed:
        """Map one JSON-RPC message to events, replies, readiness or the end of a turn."""
        if not line.strip():
            return Feed()
        msg, why = parse_object(line)
        if msg is None:
            raise not_json("codex", line, why)
        if "method" in msg and "id" in msg:
            return self._server_request(msg)
        if "method" in msg:
            return self._notification(msg["method"], msg.get("params") or {})
        if "id" in msg:
            return self._response(msg)
        return Feed(events=[HarnessEvent(EventType.OTHER, msg)])

    def _response(self, msg: dict[str, Any]) -> Feed:
        method = self._rpc.settle(msg.get("id"))
        if "error" in msg:
            error = (
                msg["error"].get("message", msg["error"])
                if isinstance(msg["error"], dict)
                else msg["error"]
            )
            kind = (
                Outcome.PROTOCOL_ERROR
                if method in ("turn/start", "turn/interrupt")
                else Outcome.STARTUP_FAILED
            )
            return Feed(error_type=kind, error=f"codex answered {method} with an error: {error}")
        result = msg.get("result") or {}
        if method == "initialize":
            return Feed(
                replies=[
                    self._rpc.notification("initialized"),
                    self._rpc.request(
                        "thread/fork" if "threadId" in self._thread_params else "thread/start",
                        self._thread_params,
                    ),
                ]
            )
        if method in ("thread/start", "thread/fork"):
            self.thread_id = result.get("thread", {}).get("id")
            return self._maybe_list()
        if method == "mcpServerStatus/list":
            return self._tool_check(result)
        if method == "turn/start":
            self.turn_id = result.get("turn", {}).get("id") or self.turn_id
        return Feed()

    def _maybe_list(self) -> Feed:
        if self.thread_id and self._mcp_ready and not self._listed:
            self._listed = True
            params = {
                "threadId": self.thread_id,
                "serverName": self.ctx.server_name,
                "detail": "toolsAndAuthOnly",
            }
            return Feed(replies=[self._rpc.request("mcpServerStatus/list", params)])
        return Feed()

    def _tool_check(self, result: dict[str, Any]) -> Feed:
        server = self.ctx.server_name
        entries = [e for e in result.get("data", []) if e.get("name") == server]
        tools = set(entries[0].get("tools", {})) if entries else set()
        missing = [n for n in self.ctx.tool_names if n not in tools]
        if not missing and entries:
            return Feed(ready=True)
        why = entries[0].get("toolsError") if entries else "not listed"
        return Feed(error_type=Outcome.STARTUP_FAILED, error=self._missing(missing, why))

    def _missing(self, missing: Sequence[str], why: Any) -> str:
        return tools_not_loaded("Codex", self.ctx, missing, str(why))

    def _server_request(self, msg: dict[str, Any]) -> Feed:
        method, params = msg["method"], msg.get("params") or {}
        event = HarnessEvent(
            EventType.OTHER, {"kind": "server_request", "method": method, "params": params}
        )
        if method == "mcpServer/elicitation/request":
            ours = params.get("serverName") == self.ctx.server_name
            answer: dict[str, Any] = (
                {"action": "accept", "content": {}} if ours else {"action": "decline"}
            )
            return Feed(events=[event], replies=[self._rpc.result(msg["id"], answer)])
        if method in _DECLINE:
            return Feed(events=[event], replies=[self._rpc.result(msg["id"], _DECLINE[method])])
        reply = self._rpc.error(msg["id"], -32601, f"gym_harness does not handle {method}")
        return Feed(events=[event], replies=[reply])

    def _notification(self, method: str, params: dict[str, Any]) -> Feed:
        if method == "mcpServer/startupStatus/updated":
            return self._mcp_status(params)
        if method == "turn/started":
            self.turn_id = params.get("turn", {}).get("id") or self.turn_id
            return Feed()
        if method in ("item/started", "item/completed"):
            return Feed(events=self._item(params.get("item") or {}, method == "item/completed"))
        if method == "item/agentMessage/delta":
            data = {
                "kind": "text_delta",
                "item_id": params.get("itemId"),
                "delta": params.get("delta", ""),
            }
            return Feed(events=[HarnessEvent(EventType.OTHER, data)])
        if method == "thread/tokenUsage/updated":
            last = (params.get("tokenUsage") or {}).get("last") or {}
            return Feed(events=[HarnessEvent(EventType.LLM_USAGE, _usage(last))])
        if method == "turn/completed":
            return self._turn_completed(params.get("turn") or {})
        if method == "error":
            return Feed(events=[HarnessEvent(EventType.ERROR, params)])
        return Feed(events=[HarnessEvent(EventType.OTHER, {"kind": method, "params": params})])

    def _mcp_status(self, params: dict[str, Any]) -> Feed:
        if params.get("name") != self.ctx.server_name:
            return Feed()
        status = params.get("status")
        if status == "ready":
            self._mcp_ready = True
            return self._maybe_list()
        if status in ("failed", "cancelled"):
            return Feed(
                error_type=Outcome.STARTUP_FAILED,
                error=self._missing((), params.get("error") or status),
            )
        return Feed()

    def _item(self, item: dict[str, Any], completed: bool) -> list[HarnessEvent]:
        kind = item.get("type")
        if kind == "mcpToolCall":
            name = str(item.get("tool", ""))
            if not completed:
                data = {
                    "name": name,
                    "arguments": item.get("arguments"),
                    "server": item.get("server"),
                    "id": item.get("id"),
                }
                return [HarnessEvent(EventType.TOOL_CALL, data)]
            result = item.get("result") or {}
            error = (item.get("error") or {}).get("message")
            content = error or content_text(result.get("content"))
            is_error = bool(error) or item.get("status") == "failed" or bool(result.get("isError"))
            data = {"name": name, "content": content, "is_error": is_error, "id": item.get("id")}
            return [HarnessEvent(EventType.TOOL_RESULT, data)]
        if kind in _TOOL_ITEMS:
            name = _TOOL_ITEMS[str(kind)]
            if not completed:
                args = {
                    k: v for k, v in item.items() if k in ("command", "cwd", "changes", "query")
                }
                return [
                    HarnessEvent(
                        EventType.TOOL_CALL, {"name": name, "arguments": args, "id": item.get("id")}
                    )
                ]
            output = item.get("aggregatedOutput") or item.get("status") or ""
            failed = item.get("status") in ("failed", "declined")
            return [
                HarnessEvent(
                    EventType.TOOL_RESULT,
                    {
                        "name": name,
                        "content": str(output),
                        "is_error": failed,
                        "id": item.get("id"),
                    },
                )
            ]
        if kind == "agentMessage" and completed:
            text = str(item.get("text", ""))
            self._turn_texts.append(text)
            return [HarnessEvent(EventType.TEXT, {"text": text})]
        if kind in ("agentMessage", "userMessage") and not completed:
            return []
        return [
            HarnessEvent(
                EventType.OTHER, {"kind": f"item_{kind}", "completed": completed, "item": item}
            )
        ]

    def _turn_completed(self, turn: dict[str, Any]) -> Feed:
        if not self._turn_texts:  # fall back to the turn's own summary
            self._turn_texts = [
                str(i.get("text", ""))
                for i in turn.get("items", [])
                if i.get("type") == "agentMessage"
            ]
        response = self._turn_texts[-1] if self._turn_texts else ""
        status = turn.get("status")
        if status == "failed":
            message = (turn.get("error") or {}).get("message", "the turn failed")
            return turn_failed(response, message, f"Codex failed the turn: {message}")
        return Feed(turn_complete=True, response=response)


def _usage(last: Mapping[str, Any]) -> dict[str, Any]:
    return usage_data(
        last,
        (
            "inputTokens",
            "outputTokens",
            "cachedInputTokens",
            "reasoningOutputTokens",
            "totalTokens",
        ),
    )
