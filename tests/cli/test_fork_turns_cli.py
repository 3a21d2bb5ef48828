"""HarnessEnv.fork in turn mode with the real CLIs: the child resumes a fork of the session.

A scripted model server on 127.0.0.1 answers every request with every user message the
conversation holds, so each reply tells which turns the CLI's session carried: the
child's third turn sees the parent's first two, and the parent's third turn does not see
the child's. The CLIs run in the loopback-only namespace, one at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.cli import Calls, cli_env, cli_path, real_cli
from support.model_server import ScriptedModelServer

from gym_harness import HarnessEnv
from gym_harness.harnesses.claude_code import ClaudeCodeHarness
from gym_harness.harnesses.codex import CodexHarness


@pytest.fixture
def recalling_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedModelServer]:
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.setenv(name, "test-key")
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with ScriptedModelServer(recall=True) as server:
        yield server


def session_env(cli: str, server: ScriptedModelServer) -> HarnessEnv:
    harness: Any
    if cli == "claude_code":
        harness = ClaudeCodeHarness(
            executable=cli_path("claude"), model="scripted-model", base_url=server.base_url
        )
    else:
        harness = CodexHarness(
            executable=cli_path("codex"), model="scripted-model", base_url=server.openai_base_url
        )
    return cli_env(harness, Calls(), turn_timeout_s=120, idle_timeout_s=90)


def in_order(seen: list[str], *wanted: str) -> bool:
    """``wanted`` are among ``seen`` in that order, the last of them last (a CLI may add
    user messages of its own between turns: Codex tells a forked thread its new cwd)."""
    rest = iter(seen)
    return seen[-1] == wanted[-1] and all(any(w == s for s in rest) for w in wanted)


def said(reply: str) -> list[str]:
    """The user messages the model saw, from its "you said: a | b" reply."""
    assert "you said: " in reply, reply
    return [part.strip() for part in reply.split("you said: ", 1)[1].split(" | ")]


@real_cli(timeout=600)
@pytest.mark.parametrize("cli", ["claude_code", "codex"])
def test_a_forked_cli_session_carries_the_first_two_turns_and_no_more(
    cli: str, recalling_model: ScriptedModelServer
) -> None:
    env = session_env(cli, recalling_model)
    child = None
    try:
        env.reset(seed=0)
        assert in_order(said(env.step("first apple")[0]), "first apple")
        reply, _, _, _, info = env.step("second banana")
        assert info["error_type"] == "", info
        assert in_order(said(reply), "first apple", "second banana")

        child, obs, info = env.fork()
        assert info["error_type"] == "", info["error"]
        assert obs == reply and info["fork"]["method"] == "native"
        child_reply, _, _, _, info = child.step("child cherry")
        assert info["error_type"] == "", info
        assert in_order(said(child_reply), "first apple", "second banana", "child cherry")

        parent_reply, _, _, _, info = env.step("parent date")
        assert info["error_type"] == "", info
        assert in_order(said(parent_reply), "first apple", "second banana", "parent date")
        assert "child cherry" not in parent_reply
    finally:
        if child is not None:
            child.close()
        env.close()
