"""ACPHarness: the protocol against a tiny ACP agent script, then the real ACP CLIs.

The fast tests run a real subprocess (a script written to ``tmp_path``) that
speaks ACP, so handshake, permissions, refused requests, events, cancel and
crashes are covered without a CLI. The ``cli`` tests drive OpenCode, Qwen Code
and Gemini CLI against the scripted model server and the env's MCP bridge.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest
from support.cli import (
    Calls,
    assert_gone,
    cli_env,
    cli_path,
    first_turn,
    killed_turn,
    real_cli,
    stalled_turn,
    tier_settings,
    two_turns,
)
from support.model_server import ScriptedModelServer

from gym_harness.env import HarnessEnv
from gym_harness.harnesses import EpisodeContext
from gym_harness.harnesses.registry import harness_class

FAKE_AGENT = textwrap.dedent(
    """
    import json, sys, urllib.request
    def mcp_list(server):
        # A real MCP exchange over streamable HTTP, as an agent that loads the server does.
        headers = {h["name"]: h["value"] for h in server.get("headers", [])}
        headers.update({"Content-Type": "application/json",
                        "Accept": "application/json, text/event-stream"})
        session = []
        def post(body):
            req = urllib.request.Request(server["url"], json.dumps(body).encode(),
                                         dict(headers, **{"Mcp-Session-Id": s for s in session}))
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read().decode()
                if not session and resp.headers.get("Mcp-Session-Id"):
                    session.append(resp.headers["Mcp-Session-Id"])
            data = [line[5:] for line in raw.splitlines() if line.startswith("data:")]
            return json.loads(data[-1] if data else raw) if raw.strip() else None
        post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "fake-acp", "version": "0"}}})
        post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return [t["name"] for t in post({"jsonrpc": "2.0", "id": 2,
                                         "method": "tools/list"})["result"]["tools"]]
    def send(obj):
        sys.stdout.write(json.dumps(obj) + "\\n"); sys.stdout.flush()
    def read():
        line = sys.stdin.readline()
        if not line:
            sys.exit(0)
        return json.loads(line)
    def ask(req_id, method, params):
        send({"jsonrpc": "2.0", "id": req_id, "method": method, "params": params})
        reply = read()
        assert reply.get("id") == req_id, reply
        return reply
    options = [
        {"optionId": "always", "name": "Always", "kind": "allow_always"},
        {"optionId": "once", "name": "Allow", "kind": "allow_once"},
        {"optionId": "no", "name": "Reject", "kind": "reject_once"},
    ]
    sid = "s-1"
    history = []
    while True:
        msg = read()
        method, mid, params = msg.get("method"), msg.get("id"), msg.get("params", {})
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": 1}})
        elif method == "session/new":
            servers = params["mcpServers"]
            history.append("servers=" + json.dumps(servers))
            if servers and "--no-mcp" not in sys.argv:
                mcp_list(servers[0])
            send({"jsonrpc": "2.0", "id": mid, "result": {"sessionId": sid}})
        elif method == "session/cancel":
            continue
        elif method == "session/prompt":
            text = params["prompt"][0]["text"]
            history.append(text)
            if text == "hang":
                while read().get("method") != "session/cancel":
                    pass
                send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "cancelled"}})
                continue
            if text == "die":
                sys.exit(3)
            env_call = {"toolCallId": "t1", "title": "mcp__env__echo", "rawInput": {"text": "hi"}}
            allow = ask(100, "session/request_permission",
                        {"sessionId": sid, "toolCall": env_call, "options": options})
            deny = ask(101, "session/request_permission",
                       {"sessionId": sid, "toolCall": {"toolCallId": "t2", "title": "bash"},
                        "options": options})
            fs = ask(102, "fs/read_text_file", {"sessionId": sid, "path": "/etc/passwd"})
            def update(u):
                send({"jsonrpc": "2.0", "method": "session/update",
                      "params": {"sessionId": sid, "update": u}})
            update({"sessionUpdate": "tool_call", "status": "pending", **env_call})
            update({"sessionUpdate": "tool_call_update", "toolCallId": "t1",
                    "status": "completed",
                    "content": [{"type": "content", "content": {"type": "text", "text": "hi"}}]})
            update({"sessionUpdate": "agent_thought_chunk",
                    "content": {"type": "text", "text": "hmm"}})
            summary = "allow=%s deny=%s fs=%s turns=%s %s" % (
                allow["result"]["outcome"].get("optionId"),
                deny["result"]["outcome"].get("optionId"),
                fs["error"]["code"], "|".join(history[1:]), history[0])
            for piece in (summary[:10], summary[10:]):
                update({"sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": piece}})
            send({"jsonrpc": "2.0", "id": mid, "result": {"stopReason": "end_turn",
                  "usage": {"inputTokens": 7, "outputTokens": 3}}})
    """
)


def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@pytest.fixture
def fake_agent(tmp_path: Path) -> list[str]:
    script = tmp_path / "fake_acp_agent.py"
    script.write_text(FAKE_AGENT)
    return [sys.executable, str(script)]


@pytest.mark.timeout(60)
def test_acp_client_against_script(fake_agent: list[str]) -> None:
    env = HarnessEnv("acp", command=fake_agent, tools=[echo], turn_timeout_s=20)
    try:
        _, info = env.reset()
        assert info["error_type"] == ""
        obs, _, terminated, truncated, info = env.step("first")
        assert (terminated, truncated, info["error_type"]) == (False, False, "")
        # Env tool granted (allow_always preferred), bash rejected, fs refused (-32601).
        assert obs.startswith("allow=always deny=no fs=-32601 turns=first")
        kinds = [e["type"] for e in info["events"]]
        assert kinds.count("tool_call") == 1 and info["tool_calls"] == 1
        call = next(e["data"] for e in info["events"] if e["type"] == "tool_call")
        assert call["name"] == "echo" and call["arguments"] == {"text": "hi"}
        result = next(e["data"] for e in info["events"] if e["type"] == "tool_result")
        assert result == {"name": "echo", "content": "hi", "is_error": False, "id": "t1"}
        usage = next(e["data"] for e in info["events"] if e["type"] == "llm_usage")
        assert usage == {"input_tokens": 7, "output_tokens": 3}
        obs, *_ = env.step("second")
        assert "turns=first|second" in obs
    finally:
        env.close()


@pytest.mark.timeout(60)
def test_acp_agent_that_never_lists_the_env_tools_fails_startup(fake_agent: list[str]) -> None:
    env = HarnessEnv("acp", command=[*fake_agent, "--no-mcp"], tools=[echo], turn_timeout_s=20)
    turn = first_turn(env, "first")
    assert turn.reset_info["error_type"] == ""  # nothing to see yet: ACP shows no tool list
    assert turn.outcome == (True, False, "startup_failed")
    assert "['echo']" in turn.info["error"]


@pytest.mark.timeout(60)
def test_acp_session_new_carries_bridge_with_token(fake_agent: list[str]) -> None:
    argv: list[str] = []

    def read_argv() -> None:
        assert env.process is not None and env.process.pid is not None
        argv.extend(psutil.Process(env.process.pid).cmdline())

    env = HarnessEnv("acp", command=fake_agent, tools=[echo], turn_timeout_s=20)
    turn = first_turn(env, "x", before=read_argv)
    # The token travels over stdin (session/new), never argv.
    assert argv and not any("Bearer" in arg for arg in argv)
    assert '"name": "env"' in turn.reply and '"value": "Bearer ' in turn.reply


@pytest.mark.timeout(60)
def test_acp_hang_is_cancelled_and_truncated(fake_agent: list[str]) -> None:
    env = HarnessEnv("acp", command=fake_agent, turn_timeout_s=30, idle_timeout_s=1.0)
    turn = first_turn(env, "hang")
    assert turn.outcome == (False, True, "idle_timeout")


@pytest.mark.timeout(60)
def test_acp_agent_exit_mid_turn_is_a_crash(fake_agent: list[str]) -> None:
    turn = first_turn(HarnessEnv("acp", command=fake_agent, turn_timeout_s=20), "die")
    assert turn.terminated and turn.info["error_type"] == "harness_crashed"


# --------------------------------------------------------------------------- real CLIs


def _cli_kwargs(name: str, srv: ScriptedModelServer) -> dict[str, Any]:
    if name == "opencode":
        return {"executable": cli_path("opencode"), "base_url": srv.openai_base_url}
    if name == "qwen_code":
        return {"executable": cli_path("qwen"), "base_url": srv.openai_base_url}
    if name == "claude_agent_acp":
        return {"executable": cli_path("claude-agent-acp"), "base_url": srv.base_url}
    if name == "codex_acp":
        # The native binary: its npm wrapper does not forward signals.
        return {"executable": cli_path("codex-acp-linux-x64"), "base_url": srv.openai_base_url}
    return {"executable": cli_path("gemini"), "base_url": srv.base_url}


AGENTS = ["opencode", "qwen_code", "gemini_cli", "claude_agent_acp", "codex_acp"]
#: The API-key variable each agent's preset reads.
KEY_VARS = {"gemini_cli": "GEMINI_API_KEY", "claude_agent_acp": "ANTHROPIC_API_KEY"}
#: The agents of the stall, crash and broken-config tests (all but Gemini CLI).
OPENAI_AGENTS = ["opencode", "qwen_code", "claude_agent_acp", "codex_acp"]


@pytest.fixture
def model_key(name: str) -> str:
    """The key variable of the agent ``name``: its preset copies it into the agent's env."""
    return KEY_VARS.get(name, "OPENAI_API_KEY")


def agent_env(
    name: str, srv: ScriptedModelServer, calls: Calls | None = None, **config: Any
) -> HarnessEnv:
    config.setdefault("startup_timeout_s", 60)
    return cli_env(
        name, calls or Calls(), model="scripted-model", **_cli_kwargs(name, srv), **config
    )


@real_cli(timeout=150)
@pytest.mark.parametrize("name", AGENTS)
@pytest.mark.parametrize("tier", ["auto", "strict"])
def test_real_agent_two_turns(tier: str, name: str, model: ScriptedModelServer) -> None:
    calls = Calls()
    first = two_turns(agent_env(name, model, calls, **tier_settings(tier, model)), calls, model)
    assert "tool said:" in first.reply


@real_cli(timeout=150)
@pytest.mark.parametrize("name", OPENAI_AGENTS)
def test_real_agent_stalled_model_truncates(name: str, model: ScriptedModelServer) -> None:
    turn = stalled_turn(agent_env(name, model, turn_timeout_s=4, idle_timeout_s=60), model)
    assert (turn.terminated, turn.truncated) == (False, True)
    assert turn.info["error_type"] in ("turn_timeout", "idle_timeout")


@real_cli(timeout=150)
@pytest.mark.parametrize("name", AGENTS)
def test_real_agent_killed_mid_turn_crashes(name: str, model: ScriptedModelServer) -> None:
    # Only the pid we started: a child of it that keeps stdout open does not hide the crash.
    turn, killed = killed_turn(agent_env(name, model), model)
    assert turn.terminated and turn.info["error_type"] == "harness_crashed", turn.info
    assert turn.info["exit_code"] == -9
    assert_gone(killed)


@real_cli(timeout=150)
@pytest.mark.parametrize("name", OPENAI_AGENTS)
def test_real_agent_with_broken_mcp_config_fails_startup(
    name: str, model: ScriptedModelServer
) -> None:
    base = harness_class(name)

    class WrongToken(base):  # type: ignore[valid-type,misc]
        """Test-only: hands the agent a bridge entry the bridge refuses."""

        def mcp_servers(self, ctx: EpisodeContext) -> list[dict[str, Any]]:
            servers: list[dict[str, Any]] = super().mcp_servers(ctx)
            for server in servers:
                server["headers"] = [{"name": "Authorization", "value": "Bearer wrong"}]
            return servers

    harness = WrongToken(model="scripted-model", **_cli_kwargs(name, model))
    turn = first_turn(cli_env(harness, Calls(), startup_timeout_s=60), "hello")
    assert turn.terminated and turn.info["error_type"] == "startup_failed", turn.info
    assert "['add']" in turn.info["error"]
