"""Presets of ``ACPHarness`` for the ACP agents seen working here.

Each preset builds the agent's argv, environment and config files (written
into the episode's private home, strictly before start). All take
``executable=``, ``model=``, ``base_url=``, ``api_key_env=`` and ``extra_args=``.
When the env captures model traffic (``ctx.model_base_url``), the preset points
the agent at the proxy with ``ctx.model_api_key`` instead.

Where each agent gets the env MCP server, and why:

* OpenCode: ``session/new`` (it connects before answering; a failure is silent).
* Qwen Code: ``session/new``; ``tool_search`` is excluded in its settings, or
  MCP tools hide behind it and the model must search before it can call them.
* Gemini CLI: its ``settings.json`` (0600, holds the token), with
  ``GEMINI_CLI_TRUST_WORKSPACE=true``: an untrusted workspace starts no MCP server.
* claude-agent-acp (0.101.0), codex-acp (0.16.0): ``session/new``; both ask permission
  for every MCP call, which the client grants for env tools.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from gym_harness.config import HarnessConfig
from gym_harness.errors import ConfigError
from gym_harness.harnesses._common import (
    MODEL_KEY_VAR,
    api_ports,
    openai_base,
    policy_wait_ms,
    require_executable,
    require_key,
    write_private,
)
from gym_harness.harnesses.acp import ACPHarness
from gym_harness.harnesses.base import SIDE_MODEL, EpisodeContext
from gym_harness.harnesses.codex_config import DEFAULT_OPENAI_BASE, codex_config

if TYPE_CHECKING:
    from gym_harness.model.request import ModelRequest

__all__ = [
    "ClaudeAgentACPHarness",
    "CodexACPHarness",
    "GeminiCLIHarness",
    "OpenCodeHarness",
    "QwenCodeHarness",
]


class _Preset(ACPHarness):
    """Shared options of the presets; subclasses say which variables mean what.

    Args:
        executable: The agent's command, a name looked up on the harness's ``PATH`` or a
            path; empty for the preset's own command name.
        model: The model name the agent asks for; ``None`` for the agent's default.
        base_url: The model API's base URL; ``None`` for the agent's default (or the
            variable it reads).
        api_key_env: The variable holding the model API's key; ``None`` for the agent's own.
        extra_args: Arguments appended to the agent's argv.
    """

    #: The agent's own API-key variable.
    key_var: ClassVar[str] = ""
    #: The agent as error messages name it.
    who: ClassVar[str] = ""
    #: Whether OpenAI-compatible URLs get ``/v1`` appended to the capture proxy's base.
    openai_style: ClassVar[bool] = True

    def __init__(
        self,
        *,
        executable: str = "",
        model: str | None = None,
        base_url: str | None = None,
        api_key_env: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(extra_args=extra_args)
        self.executable = executable or self.default_executable()
        self.model = model
        self.base_url = base_url
        self.api_key_env = api_key_env or self.key_var

    def default_executable(self) -> str:
        return ""

    def preflight(self, config: HarnessConfig, *, captured: bool = False) -> None:
        """The agent's command is found, and its API key is set unless the proxy gives one."""
        require_executable(self.executable, config, self.who, self.default_executable())
        if not captured:
            require_key(self.who, [self.api_key_env], config, "api_key_env")

    def endpoint(self, ctx: EpisodeContext) -> tuple[str | None, str | None]:
        """The (base URL, API key) the agent must use this episode, ``None`` for its own."""
        if ctx.model_base_url:
            base = ctx.model_base_url.rstrip("/")
            return (openai_base(base) if self.openai_style else base), ctx.model_api_key or ""
        return self.base_url, os.environ.get(self.api_key_env) or None

    def api_ports(self, ctx: EpisodeContext) -> tuple[int, ...]:
        return api_ports(ctx, self.base_url)


class OpenCodeHarness(_Preset):
    """OpenCode (``opencode acp --pure``).

    With a ``base_url`` (an OpenAI-compatible endpoint ending in ``/v1``) the
    preset writes an ``opencode.json`` provider ``gym`` on the bundled
    ``@ai-sdk/openai-compatible`` SDK and runs ``gym/<model>``; without one,
    ``model`` is OpenCode's own ``provider/model`` and its usual variables apply.

    Args:
        builtin_tools: ``True`` allows OpenCode's tools too (``permission *: allow``);
            ``False`` denies them, which also hides them from the model.
    """

    name: ClassVar[str] = "opencode"
    who: ClassVar[str] = "OpenCode"
    key_var: ClassVar[str] = "OPENAI_API_KEY"

    def __init__(
        self,
        *,
        executable: str = "opencode",
        model: str | None = None,
        base_url: str | None = None,
        api_key_env: str | None = None,
        extra_args: Sequence[str] = (),
        builtin_tools: bool = True,
    ) -> None:
        super().__init__(
            executable=executable,
            model=model,
            base_url=base_url,
            api_key_env=api_key_env,
            extra_args=extra_args,
        )
        self.use_builtin_tools = builtin_tools

    def default_executable(self) -> str:
        return "opencode"

    def preflight(self, config: HarnessConfig, *, captured: bool = False) -> None:
        """Without ``base_url`` OpenCode runs its own ``provider/model`` with its own keys."""
        if captured or self.base_url:
            super().preflight(config, captured=captured)
            return
        require_executable(self.executable, config, self.who, "opencode")
        if not self.model:
            raise ConfigError(
                "OpenCode needs a model: base_url='http://HOST/v1' (any OpenAI-compatible "
                "endpoint) with model='NAME' and its key in OPENAI_API_KEY (or api_key_env="
                "'MY_VAR'), or model='provider/model' of OpenCode's own with that provider's "
                "key in env={...}."
            )

    def agent_command(self, ctx: EpisodeContext) -> Sequence[str]:
        base, _ = self.endpoint(ctx)
        allow_env = f"{ctx.server_name}_*"
        permission = {"*": "allow"} if self.use_builtin_tools else {"*": "deny", allow_env: "allow"}
        config: dict[str, Any] = {
            "autoupdate": False,
            "share": "disabled",
            "permission": permission,
        }
        if base:
            model = self.model or "default"
            options: dict[str, Any] = {"baseURL": base, "apiKey": "{env:" + MODEL_KEY_VAR + "}"}
            small = model
            if (wait_ms := policy_wait_ms(ctx)) is not None:
                # Model mode: wait out the policy, and send title calls as the side model.
                options.update(headerTimeout=wait_ms, chunkTimeout=wait_ms, timeout=wait_ms)
                small = SIDE_MODEL
            config["provider"] = {
                "gym": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "gym",
                    "options": options,
                    "models": {m: {"name": m, "tool_call": True} for m in (model, small)},
                }
            }
            config["model"], config["small_model"] = f"gym/{model}", f"gym/{small}"
        elif self.model:
            config["model"] = self.model
        write_private(ctx.home / ".config" / "opencode" / "opencode.json", json.dumps(config))
        # On a fresh config dir OpenCode tries an npm install; a dead loopback registry stops it.
        write_private(ctx.home / ".npmrc", "registry=http://127.0.0.1:9/\n")
        port = ["--port", str(ctx.serve_port)] if ctx.serve_port else []  # its own server's
        return [self.executable, "acp", "--pure", *port]

    def agent_env(self, ctx: EpisodeContext) -> dict[str, str]:
        _, key = self.endpoint(ctx)
        env = {
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_SHARE": "1",
        }
        if key is not None:
            env[MODEL_KEY_VAR] = key
        return env


class QwenCodeHarness(_Preset):
    """Qwen Code (``qwen --acp --auth-type openai``) on an OpenAI-compatible endpoint."""

    name: ClassVar[str] = "qwen_code"
    who: ClassVar[str] = "Qwen Code"
    key_var: ClassVar[str] = "OPENAI_API_KEY"

    def default_executable(self) -> str:
        return "qwen"

    def agent_command(self, ctx: EpisodeContext) -> Sequence[str]:
        settings = {
            "telemetry": {"enabled": False},
            "privacy": {"usageStatisticsEnabled": False},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "security": {"auth": {"selectedType": "openai"}},
            # Without tool_search, Qwen Code puts MCP tools straight into the model's tool list.
            "tools": {"exclude": ["tool_search"]},
        }
        write_private(ctx.home / ".qwen" / "settings.json", json.dumps(settings))
        command = [self.executable, "--acp", "--auth-type", "openai"]
        if self.model:
            command += ["--model", self.model]
        return command

    def agent_env(self, ctx: EpisodeContext) -> dict[str, str]:
        base, key = self.endpoint(ctx)
        # Without it Qwen Code relaunches itself, and the child survives SIGTERM.
        env = {"QWEN_CODE_NO_RELAUNCH": "true"}
        if base:
            env["OPENAI_BASE_URL"] = base
        if key is not None:
            env["OPENAI_API_KEY"] = key
        if self.model:
            env["OPENAI_MODEL"] = self.model
        if (wait_ms := policy_wait_ms(ctx)) is not None:  # its default is 120 s
            env["QWEN_CODE_API_TIMEOUT_MS"] = str(wait_ms)
        return env


class GeminiCLIHarness(_Preset):
    """Gemini CLI (``gemini --experimental-acp``) with API-key auth."""

    name: ClassVar[str] = "gemini_cli"
    who: ClassVar[str] = "Gemini CLI"
    #: Gemini CLI may declare MCP tools under their bare names when they do not clash.
    builtin_tools: ClassVar[frozenset[str]] = frozenset(
        {
            "list_directory", "read_file", "grep_search", "glob", "replace", "write_file",
            "web_fetch", "run_shell_command", "google_web_search", "save_memory",
            "read_many_files", "write_todos", "activate_skill", "enter_plan_mode",
        }
    )  # fmt: skip
    key_var: ClassVar[str] = "GEMINI_API_KEY"
    openai_style: ClassVar[bool] = False
    mcp_via_session: ClassVar[bool] = False

    def default_executable(self) -> str:
        return "gemini"

    def side_call(self, request: ModelRequest, headers: Mapping[str, str]) -> bool:
        """The agent streams (``streamGenerateContent``); Gemini CLI's utility calls
        (routing, loop checks, summaries: ``generateJson``) do not, and time out in 40 s."""
        return not request.stream

    def agent_command(self, ctx: EpisodeContext) -> Sequence[str]:
        server = {
            "httpUrl": ctx.bridge_url,
            "headers": {"Authorization": f"Bearer {ctx.bridge_token}"},
            "trust": True,
        }
        settings = {
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "telemetry": {"enabled": False},
            "privacy": {"usageStatisticsEnabled": False},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "mcpServers": {ctx.server_name: server},
        }
        write_private(ctx.home / ".gemini" / "settings.json", json.dumps(settings))
        command = [self.executable, "--experimental-acp"]
        if self.model:
            command += ["--model", self.model]
        return command

    def agent_env(self, ctx: EpisodeContext) -> dict[str, str]:
        base, key = self.endpoint(ctx)
        env = {"GEMINI_CLI_NO_RELAUNCH": "true", "GEMINI_CLI_TRUST_WORKSPACE": "true"}
        if base:
            env["GOOGLE_GEMINI_BASE_URL"] = base
        if key is not None:
            env["GEMINI_API_KEY"] = key
        return env


class ClaudeAgentACPHarness(_Preset):
    """claude-agent-acp (Claude Code behind ACP, ``@agentclientprotocol/claude-agent-acp``).

    Its session starts in the ``default`` permission mode (not ``auto``, whose
    classifier blocks tool calls) and with tool search off (MCP tools offered directly).
    """

    name: ClassVar[str] = "claude_agent_acp"
    who: ClassVar[str] = "claude-agent-acp"
    key_var: ClassVar[str] = "ANTHROPIC_API_KEY"
    openai_style: ClassVar[bool] = False

    def default_executable(self) -> str:
        return "claude-agent-acp"

    def agent_env(self, ctx: EpisodeContext) -> dict[str, str]:
        from gym_harness.harnesses.claude_code import TELEMETRY_OFF, claude_model_mode_env

        base, key = self.endpoint(ctx)
        env = {
            **TELEMETRY_OFF,
            "CLAUDE_CONFIG_DIR": str(ctx.home / ".claude"),
            # Else MCP tools hide behind a ToolSearch tool the model must call first.
            "ENABLE_TOOL_SEARCH": "false",
        }
        if os.geteuid() == 0:
            env["IS_SANDBOX"] = "1"  # else bypass-permission modes are refused as root
        if base:
            env["ANTHROPIC_BASE_URL"] = base
        if key is not None:
            env["ANTHROPIC_API_KEY"] = key
        if self.model:
            env["ANTHROPIC_MODEL"] = self.model
        return {**env, **claude_model_mode_env(ctx)}

    def agent_command(self, ctx: EpisodeContext) -> Sequence[str]:
        # Without a defaultMode the session starts in "auto", whose classifier (a model
        # call of its own) blocks tool calls; "default" asks the client, which grants
        # the env tools only.
        settings = {"permissions": {"defaultMode": "default"}}
        write_private(ctx.home / ".claude" / "settings.json", json.dumps(settings))
        return [self.executable]


class CodexACPHarness(_Preset):
    """codex-acp (Codex behind ACP, ``@zed-industries/codex-acp``).

    Point ``executable`` at the native binary of its platform package: the JS
    wrapper does not forward SIGTERM.
    """

    name: ClassVar[str] = "codex_acp"
    who: ClassVar[str] = "codex-acp"
    key_var: ClassVar[str] = "OPENAI_API_KEY"

    def default_executable(self) -> str:
        return "codex-acp"

    def agent_command(self, ctx: EpisodeContext) -> Sequence[str]:
        base, _ = self.endpoint(ctx)
        toml = codex_config(
            model=self.model,
            base_url=base or DEFAULT_OPENAI_BASE,
            key_var=MODEL_KEY_VAR,
            sandbox="workspace-write",
            stream_idle_timeout_ms=policy_wait_ms(ctx),
        )
        write_private(ctx.home / ".codex" / "config.toml", toml)
        return [self.executable]

    def agent_env(self, ctx: EpisodeContext) -> dict[str, str]:
        _, key = self.endpoint(ctx)
        env = {"CODEX_HOME": str(ctx.home / ".codex")}
        if key is not None:
            env[MODEL_KEY_VAR] = key
        return env
