"""ClaudeCodeHarness: one long-lived ``claude -p`` process speaking stream-json.

Per episode the adapter writes a private MCP config (mode 0600, in the episode's
home; the bridge token never reaches argv) and starts::

    claude -p --input-format stream-json --output-format stream-json --verbose
           --mcp-config HOME/mcp.json --strict-mcp-config --allowedTools mcp__env__NAME,...

with HOME and CLAUDE_CONFIG_DIR inside the episode's home and telemetry,
error reporting and auto-update off. Each turn is one ``{"type":"user",...}``
line; the ``result`` line ends it. ``claude -p`` prints nothing until the first
message arrives, so the process counts as ready at once and the tool check
(every env tool listed in the first ``system/init`` line, the server
connected) happens on the first turn: a failure ends it as ``startup_failed``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from gym_harness.config import HarnessConfig
from gym_harness.errors import ForkUnsupported
from gym_harness.harnesses._common import (
    api_ports,
    content_text,
    json_line,
    not_json,
    parse_object,
    policy_wait_ms,
    present,
    private_home_env,
    require_executable,
    require_key,
    scrub_inherit,
    tools_not_loaded,
    turn_failed,
    write_private,
)
from gym_harness.harnesses.base import (
    SIDE_MODEL,
    EpisodeContext,
    Feed,
    Harness,
    HarnessSession,
    Launch,
)
from gym_harness.outcome import Outcome
from gym_harness.records.events import EventType, HarnessEvent

__all__ = ["TELEMETRY_OFF", "ClaudeCodeHarness", "ClaudeCodeSession"]

#: How long a fork waits for Claude Code to save the turn it last printed (seconds).
SAVE_WAIT_S = 10.0
#: How much of the end of the session file that wait reads (bytes).
SAVE_TAIL_BYTES = 4 * 1024 * 1024

#: Variables that stop Claude Code phoning home (telemetry, error reports, updates).
TELEMETRY_OFF: dict[str, str] = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
}
#: Provider variables let through from the user's environment when set.
PROVIDER_VARS = (
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_MODEL",
)
#: Inherited variables that would make the child think it runs inside another Claude Code.
NESTING_VARS = ("CLAUDECODE", "CLAUDE_CODE_*", "CLAUDE_CONFIG_DIR")


class ClaudeCodeHarness(Harness):
    """Claude Code (``claude -p``, stream-json in and out) as a harness.

    Args:
        executable: The ``claude`` command or a path to it.
        model: ``--model`` value; ``None`` keeps Claude Code's choice (or ``ANTHROPIC_MODEL``).
        base_url: The Anthropic-compatible endpoint (``ANTHROPIC_BASE_URL``); ``None``
            passes the user's ``ANTHROPIC_BASE_URL`` through when set.
        api_key_env: The variable in the user's environment holding the API key;
            its value reaches Claude Code as ``ANTHROPIC_API_KEY``.
            ``ANTHROPIC_AUTH_TOKEN`` passes through as well when set.
        builtin_tools: ``True`` keeps Claude Code's built-in tools, ``False``
            hides them all (``--tools ""``), a list keeps only those names.
        allowed_tools: Extra ``--allowedTools`` entries (``"Bash(git *)"``, ``"Edit"``);
            the env tools are always allowed.
        permission_mode: ``--permission-mode`` (``"acceptEdits"`` ...); ``None`` keeps the default.
        extra_args: More arguments, appended as given.

    Example:
        >>> import gymnasium
        >>> env = gymnasium.make("gym_harness/ClaudeCode-v0", model="sonnet")  # doctest: +SKIP
    """

    name: ClassVar[str] = "claude_code"

    def __init__(
        self,
        *,
        executable: str = "claude",
        model: str | None = None,
        base_url: str | None = None,
        api_key_env: str = "ANTHROPIC_API_KEY",
        builtin_tools: bool | Sequence[str] = True,
        allowed_tools: Sequence[str] = (),
        permission_mode: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.executable = executable
        self.model = model
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.use_builtin_tools = (
            builtin_tools if isinstance(builtin_tools, bool) else tuple(builtin_tools)
        )
        self.allowed_tools = tuple(allowed_tools)
        self.permission_mode = permission_mode
        self.extra_args = tuple(extra_args)

    def preflight(self, config: HarnessConfig, *, captured: bool = False) -> None:
        """``claude`` is found, and an API key is set unless the capture proxy gives one."""
        require_executable(self.executable, config, "Claude Code", "claude")
        if not captured:
            names = dict.fromkeys((self.api_key_env, "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"))
            require_key("Claude Code", list(names), config, "api_key_env")

    def mcp_config(self, ctx: EpisodeContext) -> dict[str, Any]:
        """The ``--mcp-config`` document for ``ctx`` (holds the bridge token)."""
        return {
            "mcpServers": {
                ctx.server_name: {
                    "type": "http",
                    "url": ctx.bridge_url,
                    "headers": {"Authorization": f"Bearer {ctx.bridge_token}"},
                }
            }
        }

    def fork_session(self, session: HarnessSession | None) -> dict[str, str]:
        """Claude Code resumes a fork of the session its ``init`` line named
        (``--resume ID --fork-session``), from a copy of its config directory."""
        if isinstance(session, ClaudeCodeSession) and session.session_id:
            session.wait_saved(SAVE_WAIT_S)
            return {"session_id": session.session_id}
        raise ForkUnsupported(
            f"the {self.name!r} harness cannot fork this episode yet: Claude Code has not named "
            "its session (its init line comes with the first turn). Step once, then fork."
        )

    def launch(self, ctx: EpisodeContext, config: HarnessConfig) -> Launch:
        """Write the private MCP config; return the ``claude -p`` command, env and session."""
        origin = self.resume_copy(ctx)
        mcp_path = write_private(ctx.home / "mcp.json", json.dumps(self.mcp_config(ctx)))
        allowed = [f"mcp__{ctx.server_name}__{name}" for name in ctx.tool_names]
        allowed += self.allowed_tools
        command = [
            self.executable,
            "-p",
            "--input-format", "stream-json",
            "--output-format", "stream-json",
            "--verbose",
            "--mcp-config", str(mcp_path),
            "--strict-mcp-config",
        ]  # fmt: skip
        if allowed:
            command += ["--allowedTools", ",".join(allowed)]
        if self.use_builtin_tools is False:
            command += ["--tools", ""]
        elif self.use_builtin_tools is not True:
            command += ["--tools", ",".join(self.use_builtin_tools)]
        if self.model:
            command += ["--model", self.model]
        if self.permission_mode:
            command += ["--permission-mode", self.permission_mode]
        if origin is not None:
            move_project(ctx.home / ".claude" / "projects", origin.directory / "workspace", ctx)
            command += ["--resume", origin.session["session_id"], "--fork-session"]
        command += self.extra_args

        env = {
            **private_home_env(ctx.home),
            "CLAUDE_CONFIG_DIR": str(ctx.home / ".claude"),
            **TELEMETRY_OFF,
            # By default Claude Code connects --mcp-config servers in the background and may
            # send its first model call without them (init: server "pending"): a loaded
            # machine loses the env tools. Blocking mode waits MCP_CONNECT_TIMEOUT_MS (default
            # 5 s) for them first: let it wait as long as startup may take.
            "MCP_CONNECTION_NONBLOCKING": "0",
            "MCP_CONNECT_TIMEOUT_MS": str(int(config.startup_timeout_s * 1000)),
        }
        drop: tuple[str, ...] = NESTING_VARS
        passthrough = present(PROVIDER_VARS)
        if ctx.model_base_url:
            # The capture proxy stands in for the provider: no real credential reaches the CLI.
            env["ANTHROPIC_BASE_URL"] = ctx.model_base_url
            env["ANTHROPIC_API_KEY"] = ctx.model_api_key or ""
            env.update(claude_model_mode_env(ctx))
            drop += ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
        else:
            if self.base_url:
                env["ANTHROPIC_BASE_URL"] = self.base_url
            if self.api_key_env != "ANTHROPIC_API_KEY" and os.environ.get(self.api_key_env):
                env["ANTHROPIC_API_KEY"] = os.environ[self.api_key_env]
        inherit = scrub_inherit(config.inherit_env, drop=drop, add=passthrough)
        # A user's explicit config.env wins; the nesting markers never pass through inheritance.
        config = config.replace(command=command, env={**env, **config.env}, inherit_env=inherit)
        session = ClaudeCodeSession(ctx, plain_text=config.allow_plain_text)
        return Launch(config, session, connect_ports=api_ports(ctx, self.base_url))


def move_project(projects: Path, parent: Path, ctx: EpisodeContext) -> None:
    """Rename the copied home's project directory (Claude Code files a session under its
    cwd, every character but letters and digits made a dash) to the child's workspace."""

    def dashed(path: Path) -> str:
        return re.sub("[^A-Za-z0-9]", "-", str(path))

    source = projects / dashed(parent)
    if source.is_dir():
        source.rename(projects / dashed(ctx.workspace))


def claude_model_mode_env(ctx: EpisodeContext) -> dict[str, str]:
    """In model mode: outwait the policy, and send small-model calls as ``SIDE_MODEL``.

    Claude Code's SDK request timeout is ``API_TIMEOUT_MS``; its stream watchdog waits
    ``CLAUDE_STREAM_IDLE_TIMEOUT_MS`` (at least 300 s) between events, and the endpoint's
    pings feed only its byte watchdog (see docs/model-mode.md).
    """
    wait_ms = policy_wait_ms(ctx)
    if wait_ms is None:
        return {}
    return {
        "API_TIMEOUT_MS": str(wait_ms),
        "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(wait_ms),
        "ANTHROPIC_SMALL_FAST_MODEL": SIDE_MODEL,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": SIDE_MODEL,
    }


class ClaudeCodeSession(HarnessSession):
    """One episode of ``claude -p``: ready at spawn, the tool check on the first ``init``.

    Args:
        ctx: The episode (its env tools and MCP server name).
        plain_text: Take a line that is not JSON as reply text, not a protocol error.
    """

    def __init__(self, ctx: EpisodeContext, *, plain_text: bool = False) -> None:
        self.ctx = ctx
        self.session_id: str | None = None
        self.last_uuid: str | None = None  # of the last assistant message printed
        self._plain_text = plain_text
        self._checked = False
        self._calls: dict[str, str] = {}  # tool_use id -> name, to label results
        self._interrupts = 0

    @property
    def ready_at_spawn(self) -> bool:
        """``claude -p`` prints nothing before the first message: ready at once."""
        return True

    def wait_saved(self, timeout_s: float) -> None:
        """Return once Claude Code's session file holds the last assistant message printed.

        Claude Code appends its session file from a queue it drains every 100 ms, after the
        turn's ``result`` line: a copy taken at once can lack the last turn, or the file.

        Raises:
            ForkUnsupported: The session id is not one Claude Code makes, or the message
                was not saved within ``timeout_s``.
        """
        session_id = self.session_id or ""
        if not re.fullmatch(r"[A-Za-z0-9-]{1,64}", session_id):
            raise ForkUnsupported(f"Claude Code named its session {session_id!r}: not a session id")
        mark = f'"uuid":"{self.last_uuid}"'.encode() if self.last_uuid else b""
        projects = self.ctx.home / ".claude" / "projects"
        deadline = time.monotonic() + timeout_s
        while True:
            for path in projects.glob(f"*/{session_id}.jsonl"):
                with contextlib.suppress(OSError), path.open("rb") as file:
                    # An entry's uuid follows its message, and only a few small entries
                    # follow the turn's last message: the tail holds it, and a session file
                    # grown huge is never read whole.
                    file.seek(max(0, file.seek(0, os.SEEK_END) - SAVE_TAIL_BYTES))
                    if mark in file.read(SAVE_TAIL_BYTES):
                        return
            if time.monotonic() >= deadline:
                raise ForkUnsupported(
                    f"Claude Code had not saved its session {session_id}'s last message to "
                    f"{projects} within {timeout_s:g} s: nothing was forked; fork again."
                )
            time.sleep(0.01)

    # ----------------------------------------------------------------- lines out

    def message_lines(self, text: str) -> list[str]:
        """One stream-json user message."""
        content = [{"type": "text", "text": text}]
        return [json_line({"type": "user", "message": {"role": "user", "content": content}})]

    def interrupt_lines(self) -> list[str]:
        """The control request that stops the running turn and keeps the process."""
        self._interrupts += 1
        request = {"subtype": "interrupt"}
        return [
            json_line(
                {
                    "type": "control_request",
                    "request_id": f"gym-int-{self._interrupts}",
                    "request": request,
                }
            )
        ]

    # ----------------------------------------------------------------- lines in

    def feed(self, line: str) -> Feed:
        """Map one stream-json line to events; ``result`` ends the turn."""
        if not line.strip():
            return Feed()
        obj, why = parse_object(line)
        if obj is None:
            if self._plain_text:
                return Feed(events=[HarnessEvent(EventType.TEXT, {"text": line})])
            raise not_json("claude", line, why)
        kind = obj.get("type")
        if kind == "system" and obj.get("subtype") == "init":
            return self._init(obj)
        if kind == "assistant":
            if isinstance(uuid := obj.get("uuid"), str):
                self.last_uuid = uuid
            return Feed(events=self._assistant(obj))
        if kind == "user":
            return Feed(events=self._tool_results(obj))
        if kind == "result":
            return self._result(obj)
        return Feed(events=[HarnessEvent(EventType.OTHER, obj)])

    def _init(self, obj: dict[str, Any]) -> Feed:
        if self._checked:  # repeated before every turn; the first one was checked
            return Feed()
        self._checked = True
        self.session_id = obj.get("session_id")
        event = HarnessEvent(
            EventType.OTHER,
            {
                "kind": "init",
                "session_id": self.session_id,
                "model": obj.get("model"),
                "tools": obj.get("tools", []),
                "mcp_servers": obj.get("mcp_servers", []),
            },
        )
        problem = self._tool_check(obj)
        if problem:
            return Feed(events=[event], error_type=Outcome.STARTUP_FAILED, error=problem)
        return Feed(events=[event])

    def _tool_check(self, obj: dict[str, Any]) -> str:
        server = self.ctx.server_name
        servers = {
            s.get("name"): s.get("status")
            for s in obj.get("mcp_servers", [])
            if isinstance(s, dict)
        }
        tools = set(obj.get("tools", []))
        missing = [n for n in self.ctx.tool_names if f"mcp__{server}__{n}" not in tools]
        status = servers.get(server)
        if not missing and status == "connected":
            return ""
        why = f"the server is {status or 'absent'} (expected tools named mcp__{server}__NAME)"
        return tools_not_loaded("Claude Code", self.ctx, missing, why)

    def _short(self, name: str) -> str:
        prefix = f"mcp__{self.ctx.server_name}__"
        return name[len(prefix) :] if name.startswith(prefix) else name

    def _assistant(self, obj: dict[str, Any]) -> list[HarnessEvent]:
        events = []
        for block in obj.get("message", {}).get("content", []) or []:
            kind = block.get("type")
            if kind == "text":
                events.append(HarnessEvent(EventType.TEXT, {"text": block.get("text", "")}))
            elif kind == "tool_use":
                full = str(block.get("name", ""))
                self._calls[str(block.get("id"))] = full
                data = {
                    "name": self._short(full),
                    "arguments": block.get("input", {}),
                    "id": block.get("id"),
                }
                if full != data["name"]:
                    data["server"] = self.ctx.server_name
                events.append(HarnessEvent(EventType.TOOL_CALL, data))
            else:
                events.append(
                    HarnessEvent(EventType.OTHER, {"kind": f"assistant_{kind}", "block": block})
                )
        return events

    def _tool_results(self, obj: dict[str, Any]) -> list[HarnessEvent]:
        content = obj.get("message", {}).get("content", [])
        if not isinstance(content, list):
            return []
        events = []
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            full = self._calls.get(str(block.get("tool_use_id")), "")
            events.append(
                HarnessEvent(
                    EventType.TOOL_RESULT,
                    {
                        "name": self._short(full),
                        "content": content_text(block.get("content")),
                        "is_error": bool(block.get("is_error", False)),
                        "id": block.get("tool_use_id"),
                    },
                )
            )
        return events

    def _result(self, obj: dict[str, Any]) -> Feed:
        usage = dict(obj.get("usage") or {})
        usage_data = {
            "input_tokens": usage.get("input_tokens", 0),
            "output_tokens": usage.get("output_tokens", 0),
            "cache_read_input_tokens": usage.get("cache_read_input_tokens", 0),
            "cache_creation_input_tokens": usage.get("cache_creation_input_tokens", 0),
            "total_cost_usd": obj.get("total_cost_usd"),
            "num_turns": obj.get("num_turns"),
            "duration_ms": obj.get("duration_ms"),
        }
        events = [HarnessEvent(EventType.LLM_USAGE, usage_data)]
        denials = obj.get("permission_denials") or []
        if denials:
            events.append(
                HarnessEvent(EventType.OTHER, {"kind": "permission_denials", "denials": denials})
            )
        response = obj.get("result")
        response = response if isinstance(response, str) else ""
        if obj.get("is_error") or obj.get("subtype") != "success":
            errors = obj.get("errors") or []
            message = response or "; ".join(map(str, errors)) or str(obj.get("subtype"))
            error = f"Claude Code ended the turn with {obj.get('subtype')}: {message}"
            return turn_failed(response, message, error, events)
        return Feed(events=events, turn_complete=True, response=response)
