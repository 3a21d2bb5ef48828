"""ClaudeCodeHarness: the adapter offline (argv, env, files, line mapping) and the
real ``claude`` CLI through HarnessEnv against the scripted model server."""

from __future__ import annotations

import functools
import json
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from support.cli import (
    TOKEN,
    Calls,
    assert_gone,
    cli_env,
    cli_path,
    episode_ctx,
    first_turn,
    killed_turn,
    real_cli,
    stalled_turn,
    tier_settings,
    tree_after_close,
    two_turns,
)
from support.model_server import ScriptedModelServer

from gym_harness import HarnessEnv
from gym_harness.config import HarnessConfig
from gym_harness.errors import ForkUnsupported, ProtocolError
from gym_harness.harnesses import claude_code
from gym_harness.harnesses.base import EpisodeContext
from gym_harness.harnesses.claude_code import ClaudeCodeHarness, ClaudeCodeSession
from gym_harness.records.events import EventType

make_ctx = functools.partial(episode_ctx, tool_names=("add", "echo"))


# ---------------------------------------------------------------- offline: launch


def test_launch_keeps_the_token_off_argv_in_a_private_file(tmp_path: Path) -> None:
    harness = ClaudeCodeHarness(executable="claude", model="m1")
    config = harness.launch(make_ctx(tmp_path), HarnessConfig()).config
    assert not any(TOKEN in arg for arg in config.command)
    assert not any(TOKEN in value for value in config.env.values())
    mcp_file = Path(config.command[config.command.index("--mcp-config") + 1])
    assert stat.S_IMODE(mcp_file.stat().st_mode) == 0o600
    server = json.loads(mcp_file.read_text())["mcpServers"]["env"]
    assert server == {
        "type": "http",
        "url": "http://127.0.0.1:9/mcp",
        "headers": {"Authorization": f"Bearer {TOKEN}"},
    }
    assert "--strict-mcp-config" in config.command
    allowed = config.command[config.command.index("--allowedTools") + 1]
    assert allowed.split(",") == ["mcp__env__add", "mcp__env__echo"]
    assert config.command[config.command.index("--model") + 1] == "m1"
    assert "--tools" not in config.command  # built-in tools on by default


def test_launch_env_is_private_and_quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAUDECODE", "1")
    monkeypatch.setenv("CLAUDE_CODE_ENTRYPOINT", "cli")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "user-key")
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    ctx = make_ctx(tmp_path)
    inherit = (*HarnessConfig().inherit_env, "CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT")
    config = ClaudeCodeHarness().launch(ctx, HarnessConfig(inherit_env=inherit)).config
    assert config.env["HOME"] == str(ctx.home)
    assert config.env["CLAUDE_CONFIG_DIR"] == str(ctx.home / ".claude")
    for name in ("DISABLE_TELEMETRY", "DISABLE_AUTOUPDATER", "DISABLE_ERROR_REPORTING"):
        assert config.env[name] == "1"
    assert config.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert "CLAUDECODE" not in config.inherit_env
    assert "CLAUDE_CODE_ENTRYPOINT" not in config.inherit_env
    assert "ANTHROPIC_API_KEY" in config.inherit_env  # by name: the value is not copied
    assert "ANTHROPIC_API_KEY" not in config.env


def test_launch_uses_the_capture_proxy_instead_of_the_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "user-key")
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "user-token")
    ctx = make_ctx(tmp_path, model_base_url="http://127.0.0.1:7/", model_api_key="proxy-key")
    harness = ClaudeCodeHarness(base_url="http://127.0.0.1:8/")
    config = harness.launch(ctx, HarnessConfig()).config
    assert config.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:7/"
    assert config.env["ANTHROPIC_API_KEY"] == "proxy-key"
    assert "ANTHROPIC_AUTH_TOKEN" not in config.inherit_env
    assert "ANTHROPIC_API_KEY" not in config.inherit_env


def test_builtin_tools_off_and_selected(tmp_path: Path) -> None:
    off = ClaudeCodeHarness(builtin_tools=False).launch(make_ctx(tmp_path), HarnessConfig()).config
    assert off.command[off.command.index("--tools") + 1] == ""
    some = (
        ClaudeCodeHarness(builtin_tools=["Read", "Bash"])
        .launch(make_ctx(tmp_path), HarnessConfig())
        .config
    )
    assert some.command[some.command.index("--tools") + 1] == "Read,Bash"


# ---------------------------------------------------------------- offline: feed


def new_session(tmp_path: Path) -> ClaudeCodeSession:
    """A fresh episode's session, as ``launch`` makes it."""
    launched = ClaudeCodeHarness().launch(make_ctx(tmp_path), HarnessConfig()).session
    assert isinstance(launched, ClaudeCodeSession) and launched.ready_at_spawn
    return launched


def init_line(tools: list[str], status: str = "connected") -> str:
    return json.dumps(
        {
            "type": "system",
            "subtype": "init",
            "session_id": "s1",
            "tools": ["Bash", *tools],
            "mcp_servers": [{"name": "env", "status": status}],
        }
    )


def test_feed_maps_a_turn_to_events(tmp_path: Path) -> None:
    session = new_session(tmp_path)
    assert session.feed(init_line(["mcp__env__add", "mcp__env__echo"])).error_type == ""
    assert session.session_id == "s1"
    call = session.feed(
        json.dumps(
            {
                "type": "assistant",
                "message": {
                    "content": [
                        {"type": "text", "text": "calling"},
                        {
                            "type": "tool_use",
                            "id": "t1",
                            "name": "mcp__env__add",
                            "input": {"a": 1},
                        },
                    ]
                },
            }
        )
    )
    assert [e.type for e in call.events] == [EventType.TEXT, EventType.TOOL_CALL]
    assert call.events[1].data["name"] == "add"
    assert call.events[1].data["arguments"] == {"a": 1}
    result = session.feed(
        json.dumps(
            {
                "type": "user",
                "message": {
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "2"}]
                },
            }
        )
    )
    assert result.events[0].type is EventType.TOOL_RESULT
    assert result.events[0].data == {"name": "add", "content": "2", "is_error": False, "id": "t1"}
    end = session.feed(
        json.dumps(
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "result": "done",
                "usage": {"input_tokens": 3, "output_tokens": 4},
            }
        )
    )
    assert end.turn_complete and end.response == "done" and not end.error_type
    assert end.events[0].type is EventType.LLM_USAGE
    assert end.events[0].data["output_tokens"] == 4


def test_feed_reports_missing_env_tools_as_startup_failed(tmp_path: Path) -> None:
    session = new_session(tmp_path)
    feed = session.feed(init_line([], status="failed"))
    assert feed.error_type == "startup_failed"
    assert "add" in feed.error and "echo" in feed.error and "failed" in feed.error


def test_feed_error_result_is_an_outcome(tmp_path: Path) -> None:
    session = new_session(tmp_path)
    line = {"type": "result", "subtype": "success", "is_error": True, "result": "API Error: 500"}
    feed = session.feed(json.dumps(line))
    assert feed.turn_complete
    assert feed.error_type == "harness_error"
    assert "API Error: 500" in feed.error


def test_feed_non_json_is_a_protocol_error(tmp_path: Path) -> None:
    session = new_session(tmp_path)
    with pytest.raises(ProtocolError, match="not one JSON object"):
        session.feed("not json")
    assert session.feed("").error_type == ""


def test_interrupt_line_is_a_control_request(tmp_path: Path) -> None:
    session = new_session(tmp_path)
    first, second = (
        json.loads(line) for line in [*session.interrupt_lines(), *session.interrupt_lines()]
    )
    assert first["type"] == "control_request"
    assert first["request"] == {"subtype": "interrupt"}
    assert first["request_id"] != second["request_id"]


def assistant_line(uuid: str) -> str:
    content = [{"type": "text", "text": "hi"}]
    return json.dumps({"type": "assistant", "uuid": uuid, "message": {"content": content}})


def saved_session(tmp_path: Path, *uuids: str) -> tuple[ClaudeCodeSession, Path]:
    """A session that printed an assistant message ``u2``, and its session file holding
    entries ``uuids`` (Claude Code files it under its dashed cwd)."""
    session = new_session(tmp_path)
    session.feed(init_line(["mcp__env__add", "mcp__env__echo"]))
    session.feed(assistant_line("u2"))
    path = session.ctx.home / ".claude" / "projects" / "-tmp-workspace" / "s1.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps({"uuid": u}, separators=(",", ":")) + "\n" for u in uuids))
    return session, path


def test_a_fork_waits_until_the_last_message_printed_is_saved(tmp_path: Path) -> None:
    session, path = saved_session(tmp_path, "u1")
    written = threading.Event()

    def save() -> None:  # Claude Code drains its write queue after the result line
        with path.open("a") as file:
            file.write(json.dumps({"uuid": "u2"}, separators=(",", ":")) + "\n")
        written.set()

    saver = threading.Timer(0.3, save)
    saver.start()
    try:
        assert ClaudeCodeHarness().fork_session(session) == {"session_id": "s1"}
        assert written.is_set()
    finally:
        saver.cancel()
        saver.join(timeout=5)


def test_a_session_that_is_never_saved_does_not_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claude_code, "SAVE_WAIT_S", 0.2)
    session, _ = saved_session(tmp_path, "u1")
    with pytest.raises(ForkUnsupported, match="had not saved its session s1's last message"):
        ClaudeCodeHarness().fork_session(session)


def test_a_fork_reads_only_the_end_of_a_large_session_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claude_code, "SAVE_WAIT_S", 0.2)
    filler = json.dumps({"uuid": "f", "pad": "x" * 1024}) + "\n"
    session, path = saved_session(tmp_path, "u1")
    with path.open("a") as file:
        file.write(filler * 8192 + json.dumps({"uuid": "u2"}, separators=(",", ":")) + "\n")
    assert ClaudeCodeHarness().fork_session(session) == {"session_id": "s1"}
    with path.open("a") as file:  # 8 MiB after the message: past the tail the wait reads
        file.write(filler * 8192)
    with pytest.raises(ForkUnsupported, match="had not saved"):
        ClaudeCodeHarness().fork_session(session)


def test_a_session_id_that_is_a_path_does_not_fork(tmp_path: Path) -> None:
    session, _ = saved_session(tmp_path, "u1", "u2")
    assert ClaudeCodeHarness().fork_session(session) == {"session_id": "s1"}
    session.session_id = "../../etc/passwd"
    with pytest.raises(ForkUnsupported, match="not a session id"):
        ClaudeCodeHarness().fork_session(session)


# ---------------------------------------------------------------- the real CLI


@pytest.fixture
def model_key() -> str:
    return "ANTHROPIC_API_KEY"


def claude_env(
    model: ScriptedModelServer,
    calls: Calls | None = None,
    harness: ClaudeCodeHarness | None = None,
    **config: Any,
) -> HarnessEnv:
    harness = harness or ClaudeCodeHarness(
        executable=cli_path("claude"), model="scripted-model", base_url=model.base_url
    )
    return cli_env(harness, calls or Calls(), **config)


@real_cli(timeout=90)
@pytest.mark.parametrize("tier", ["auto", "strict"])
def test_two_turns_call_a_tool_and_keep_context(tier: str, model: ScriptedModelServer) -> None:
    calls = Calls()
    first = two_turns(
        claude_env(model, calls, **tier_settings(tier, model, "ANTHROPIC_API_KEY")),
        calls,
        model,
        "anthropic",
    )
    kinds = [e["type"] for e in first.info["events"]]
    assert "tool_call" in kinds and "tool_result" in kinds and "llm_usage" in kinds
    assert first.last_request.headers["x-api-key"] == "test-key"


@real_cli(timeout=90)
def test_a_stalled_model_truncates_the_turn(model: ScriptedModelServer) -> None:
    turn = stalled_turn(claude_env(model, turn_timeout_s=6, idle_timeout_s=3), model)
    assert turn.truncated and not turn.terminated
    assert turn.info["error_type"] in ("idle_timeout", "turn_timeout")


@real_cli(timeout=90)
def test_killing_the_cli_mid_turn_is_a_crash(model: ScriptedModelServer) -> None:
    turn, killed = killed_turn(claude_env(model), model)  # only the pid we started
    assert turn.terminated and not turn.truncated
    assert turn.info["error_type"] == "harness_crashed", turn.info
    assert turn.info["exit_code"] == -9
    assert_gone(killed)


@real_cli(timeout=90)
def test_close_leaves_no_process(model: ScriptedModelServer) -> None:
    assert_gone(tree_after_close(claude_env(model)))


class WrongTokenClaude(ClaudeCodeHarness):
    """Test-only: writes an MCP config the bridge rejects."""

    def mcp_config(self, ctx: EpisodeContext) -> dict[str, Any]:
        config = super().mcp_config(ctx)
        config["mcpServers"][ctx.server_name]["headers"]["Authorization"] = "Bearer wrong"
        return config


@real_cli(timeout=90)
def test_broken_mcp_config_fails_as_startup_failed(model: ScriptedModelServer) -> None:
    harness = WrongTokenClaude(
        executable=cli_path("claude"), model="scripted-model", base_url=model.base_url
    )
    turn = first_turn(claude_env(model, harness=harness), "please add")
    assert turn.terminated
    assert turn.info["error_type"] == "startup_failed"
    assert "add" in turn.info["error"]
