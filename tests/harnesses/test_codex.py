"""CodexHarness: the adapter offline (config.toml, env, handshake, line mapping) and
the real ``codex app-server`` through HarnessEnv against the scripted model server."""

from __future__ import annotations

import json
import platform
import stat
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from support.cli import (
    TOKEN,
    Calls,
    assert_gone,
    cli_env,
    cli_path,
    first_turn,
    killed_turn,
    real_cli,
    stalled_turn,
    tier_settings,
    tree_after_close,
    two_turns,
)
from support.cli import episode_ctx as make_ctx
from support.model_server import ScriptedModelServer

from gym_harness import HarnessEnv
from gym_harness.config import HarnessConfig
from gym_harness.harnesses.base import EpisodeContext, Launch
from gym_harness.harnesses.codex import CodexHarness, CodexSession, native_codex
from gym_harness.harnesses.codex_config import _NATIVE, POLICY_MODEL
from gym_harness.records.events import EventType

# ---------------------------------------------------------------- offline


def test_launch_writes_a_private_quiet_config(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    harness = CodexHarness(
        executable="codex", model="local-model", base_url="http://127.0.0.1:5/v1"
    )
    config = harness.launch(ctx, HarnessConfig()).config
    assert config.command == ("codex", "app-server")
    assert not any(TOKEN in arg for arg in config.command)
    codex_home = Path(config.env["CODEX_HOME"])
    assert codex_home.parent == ctx.home
    toml_path = codex_home / "config.toml"
    assert stat.S_IMODE(toml_path.stat().st_mode) == 0o600
    assert TOKEN not in toml_path.read_text()
    doc = tomllib.loads(toml_path.read_text())
    provider = doc["model_providers"][doc["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:5/v1"
    assert provider["wire_api"] == "responses"
    assert provider["env_key"] == "OPENAI_API_KEY"
    assert provider["request_max_retries"] == 0 and provider["stream_max_retries"] == 0
    assert doc["approval_policy"] == "never"
    assert doc["features"]["plugins"] is False
    assert doc["analytics"]["enabled"] is False
    catalog = json.loads(Path(doc["model_catalog_json"]).read_text())
    (entry,) = catalog["models"]
    assert entry["slug"] == "local-model" and entry["supports_search_tool"] is False


def test_known_model_gets_no_catalog(tmp_path: Path) -> None:
    config = CodexHarness(model="gpt-5.5").launch(make_ctx(tmp_path), HarnessConfig()).config
    doc = tomllib.loads((Path(config.env["CODEX_HOME"]) / "config.toml").read_text())
    assert "model_catalog_json" not in doc


@pytest.mark.parametrize("model", [None, "gpt-5.5", "gpt-6.2-sol"])
def test_model_mode_names_a_catalog_model_whatever_the_name(
    tmp_path: Path, model: str | None
) -> None:
    """In model mode the env is the model: the catalog entry offers the env tools as
    functions (Codex's default model would hide them inside its ``exec`` tool)."""
    ctx = make_ctx(tmp_path, model_base_url="http://127.0.0.1:7", policy_timeout_s=30.0)
    config = CodexHarness(model=model).launch(ctx, HarnessConfig()).config
    doc = tomllib.loads((Path(config.env["CODEX_HOME"]) / "config.toml").read_text())
    assert doc["model"] == (model or POLICY_MODEL)
    (entry,) = json.loads(Path(doc["model_catalog_json"]).read_text())["models"]
    assert entry["slug"] == doc["model"] and entry["supports_search_tool"] is False


def test_capture_proxy_replaces_provider(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, model_base_url="http://127.0.0.1:7", model_api_key="proxy-key")
    config = CodexHarness(base_url="http://127.0.0.1:5/v1").launch(ctx, HarnessConfig()).config
    doc = tomllib.loads((Path(config.env["CODEX_HOME"]) / "config.toml").read_text())
    provider = doc["model_providers"][doc["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:7/v1"
    assert config.env[provider["env_key"]] == "proxy-key"


def new_session(tmp_path: Path, **ctx: Any) -> CodexSession:
    """A fresh episode's session, as ``launch`` makes it."""
    launched = CodexHarness().launch(make_ctx(tmp_path, **ctx), HarnessConfig()).session
    assert isinstance(launched, CodexSession)
    return launched


def handshake(session: CodexSession, tools: dict[str, Any]) -> list[Any]:
    """Run the startup handshake with scripted server lines; return every Feed."""
    feeds = []
    (init,) = session.startup_lines()
    assert json.loads(init)["method"] == "initialize"
    feeds.append(session.feed(json.dumps({"id": 1, "result": {}})))
    initialized, start = (json.loads(r) for r in feeds[-1].replies)
    assert initialized["method"] == "initialized"
    assert start["method"] == "thread/start"
    server = start["params"]["config"]["mcp_servers"]["env"]
    assert server["bearer_token_env_var"] and TOKEN not in json.dumps(start)
    assert server["default_tools_approval_mode"] == "approve"
    feeds.append(session.feed(json.dumps({"id": start["id"], "result": {"thread": {"id": "t1"}}})))
    status = {"name": "env", "status": "ready", "threadId": "t1"}
    feeds.append(
        session.feed(json.dumps({"method": "mcpServer/startupStatus/updated", "params": status}))
    )
    (listing,) = (json.loads(r) for r in feeds[-1].replies)
    assert listing["method"] == "mcpServerStatus/list"
    result = {"data": [{"name": "env", "tools": tools}]}
    feeds.append(session.feed(json.dumps({"id": listing["id"], "result": result})))
    return feeds


def test_handshake_ready_when_env_tools_listed(tmp_path: Path) -> None:
    session = new_session(tmp_path)
    feeds = handshake(session, {"add": {"name": "add"}})
    assert feeds[-1].ready and not feeds[-1].error_type
    assert session.thread_id == "t1"


def test_handshake_missing_tool_is_startup_failed(tmp_path: Path) -> None:
    session = new_session(tmp_path, tool_names=("add", "echo"))
    feeds = handshake(session, {"add": {"name": "add"}})
    assert feeds[-1].error_type == "startup_failed"
    assert "echo" in feeds[-1].error


def test_turn_maps_items_and_ends_on_turn_completed(tmp_path: Path) -> None:
    session = new_session(tmp_path)
    handshake(session, {"add": {}})
    (start,) = (json.loads(line) for line in session.message_lines("hi"))
    assert start["method"] == "turn/start" and start["params"]["threadId"] == "t1"
    session.feed(json.dumps({"id": start["id"], "result": {"turn": {"id": "u1"}}}))
    call = {
        "type": "mcpToolCall",
        "id": "c1",
        "server": "env",
        "tool": "add",
        "arguments": {"a": 1},
    }
    started = session.feed(json.dumps({"method": "item/started", "params": {"item": call}}))
    assert started.events[0].type is EventType.TOOL_CALL
    assert started.events[0].data["name"] == "add"
    done = {**call, "status": "completed", "result": {"content": [{"type": "text", "text": "2"}]}}
    completed = session.feed(json.dumps({"method": "item/completed", "params": {"item": done}}))
    assert completed.events[0].type is EventType.TOOL_RESULT
    assert completed.events[0].data["content"] == "2"
    message = {"type": "agentMessage", "id": "m1", "text": "the sum is 2"}
    session.feed(json.dumps({"method": "item/completed", "params": {"item": message}}))
    usage = {"tokenUsage": {"last": {"inputTokens": 5, "outputTokens": 2}}}
    used = session.feed(json.dumps({"method": "thread/tokenUsage/updated", "params": usage}))
    assert used.events[0].type is EventType.LLM_USAGE
    assert used.events[0].data["input_tokens"] == 5
    (interrupt,) = (json.loads(line) for line in session.interrupt_lines())
    assert interrupt["method"] == "turn/interrupt"
    assert interrupt["params"] == {"threadId": "t1", "turnId": "u1"}
    turn = {"id": "u1", "status": "completed", "items": []}
    end = session.feed(json.dumps({"method": "turn/completed", "params": {"turn": turn}}))
    assert end.turn_complete and end.response == "the sum is 2"


def test_failed_turn_is_an_outcome(tmp_path: Path) -> None:
    session = new_session(tmp_path)
    turn = {"id": "u1", "status": "failed", "items": [], "error": {"message": "boom"}}
    end = session.feed(json.dumps({"method": "turn/completed", "params": {"turn": turn}}))
    assert end.turn_complete and end.error_type == "harness_error" and "boom" in end.error


def test_approval_requests_are_answered(tmp_path: Path) -> None:
    session = new_session(tmp_path)
    cmd = {"id": 7, "method": "item/commandExecution/requestApproval", "params": {}}
    (reply,) = (json.loads(r) for r in session.feed(json.dumps(cmd)).replies)
    assert reply["id"] == 7 and reply["result"] == {"decision": "decline"}
    ours = {"id": 8, "method": "mcpServer/elicitation/request", "params": {"serverName": "env"}}
    (reply,) = (json.loads(r) for r in session.feed(json.dumps(ours)).replies)
    assert reply["result"]["action"] == "accept"
    other = {"id": 9, "method": "mcpServer/elicitation/request", "params": {"serverName": "x"}}
    (reply,) = (json.loads(r) for r in session.feed(json.dumps(other)).replies)
    assert reply["result"]["action"] == "decline"
    unknown = {"id": 10, "method": "something/new", "params": {}}
    (reply,) = (json.loads(r) for r in session.feed(json.dumps(unknown)).replies)
    assert reply["error"]["code"] == -32601


# ---------------------------------------------------------------- the real CLI


def codex_env(
    model: ScriptedModelServer,
    calls: Calls | None = None,
    harness: CodexHarness | None = None,
    **config: Any,
) -> HarnessEnv:
    harness = harness or CodexHarness(
        executable=cli_path("codex"), model="scripted-model", base_url=model.openai_base_url
    )
    return cli_env(harness, calls or Calls(), startup_timeout_s=30, **config)


@real_cli(timeout=90)
@pytest.mark.parametrize("tier", ["auto", "strict"])
def test_two_turns_call_a_tool_and_keep_context(tier: str, model: ScriptedModelServer) -> None:
    calls = Calls()
    first = two_turns(
        codex_env(model, calls, **tier_settings(tier, model, "OPENAI_API_KEY")),
        calls,
        model,
        "responses",
    )
    kinds = [e["type"] for e in first.info["events"]]
    assert "tool_result" in kinds and "llm_usage" in kinds
    assert first.last_request.headers["authorization"] == "Bearer test-key"


@real_cli(timeout=90)
def test_a_stalled_model_truncates_the_turn(model: ScriptedModelServer) -> None:
    turn = stalled_turn(codex_env(model, turn_timeout_s=6, idle_timeout_s=3), model)
    assert turn.reset_info["error_type"] == "", turn.reset_info
    assert turn.truncated and not turn.terminated
    assert turn.info["error_type"] in ("idle_timeout", "turn_timeout")


@real_cli(timeout=90)
@pytest.mark.parametrize("native", [True, False], ids=["native", "npm-launcher"])
def test_killing_the_cli_mid_turn_is_a_crash(model: ScriptedModelServer, native: bool) -> None:
    # Only the pid we started: with native=False that is npm's node launcher, whose
    # native child keeps stdout open; the turn must still end as a crash.
    harness = CodexHarness(
        executable=cli_path("codex"),
        model="scripted-model",
        base_url=model.openai_base_url,
        native=native,
    )
    env = codex_env(model, harness=harness)
    turn, killed = killed_turn(env, model)
    assert turn.reset_info["error_type"] == "", turn.reset_info
    assert turn.terminated and not turn.truncated
    assert turn.info["error_type"] == "harness_crashed", turn.info
    assert turn.info["exit_code"] == -9
    assert_gone(killed)


def test_the_native_binary_is_started_when_found(tmp_path: Path) -> None:
    package = tmp_path / "node_modules" / "@openai" / "codex"
    (package / "bin").mkdir(parents=True)
    (package / "package.json").write_text('{"name": "@openai/codex"}')
    launcher = package / "bin" / "codex.js"
    launcher.write_text("#!/usr/bin/env node\n")
    launcher.chmod(0o755)
    assert native_codex(str(launcher)) is None  # no platform package yet: the launcher runs
    config = (
        CodexHarness(executable=str(launcher)).launch(make_ctx(tmp_path), HarnessConfig()).config
    )
    assert config.command[0] == str(launcher)
    key = (sys.platform, platform.machine())
    if key not in _NATIVE:
        pytest.skip(f"no Codex platform package for {key}")
    name, triple = _NATIVE[key]
    binary = tmp_path / "node_modules" / "@openai" / name / "vendor" / triple / "bin" / "codex"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert native_codex(str(launcher)) == (str(binary), str(package))
    config = (
        CodexHarness(executable=str(launcher)).launch(make_ctx(tmp_path), HarnessConfig()).config
    )
    assert config.command == (str(binary), "app-server")
    assert config.env["CODEX_MANAGED_PACKAGE_ROOT"] == str(package)
    off = CodexHarness(executable=str(launcher), native=False)
    assert off.launch(make_ctx(tmp_path), HarnessConfig()).config.command[0] == str(launcher)
    assert native_codex(str(binary)) is None  # already native


@real_cli(timeout=90)
def test_close_leaves_no_process(model: ScriptedModelServer) -> None:
    assert_gone(tree_after_close(codex_env(model)))


class WrongTokenCodex(CodexHarness):
    """Test-only: points the MCP entry at a variable holding a token the bridge rejects."""

    def mcp_server_entry(self, ctx: EpisodeContext) -> dict[str, Any]:
        return {**super().mcp_server_entry(ctx), "bearer_token_env_var": "WRONG_TOKEN"}

    def launch(self, ctx: EpisodeContext, config: HarnessConfig) -> Launch:
        launch = super().launch(ctx, config)
        env = {**launch.config.env, "WRONG_TOKEN": "wrong"}
        return Launch(launch.config.replace(env=env), launch.session)


@real_cli(timeout=90)
def test_broken_mcp_config_fails_as_startup_failed(model: ScriptedModelServer) -> None:
    harness = WrongTokenCodex(
        executable=cli_path("codex"), model="scripted-model", base_url=model.openai_base_url
    )
    turn = first_turn(codex_env(model, harness=harness), "please add")
    assert turn.reset_info["error_type"] == "startup_failed"
    assert "add" in turn.reset_info["error"]
    assert turn.terminated and turn.info["error_type"] == "startup_failed"
