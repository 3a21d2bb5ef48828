"""Real CLIs accept answers written by ``gym_harness.model``.

Each CLI runs one turn (mode "turns", today's adapters) against ``ModelEndpoint``,
whose answers come from a policy through ``read_request`` -> ``parse_action`` ->
``AnswerWriter``, streamed with keep-alive events before the answer. The policy calls
the env tool, the CLI runs it over the bridge, and the policy's text answer ends the
turn. No scripted model server is involved.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from support.cli import (
    PROMPT,
    Calls,
    adding_policy,
    cli_env,
    cli_path,
    env_tool,
    harness_for,
    real_cli,
)
from support.model_endpoint import ModelEndpoint

KEY_VAR = {"claude": "ANTHROPIC_API_KEY", "gemini_cli": "GEMINI_API_KEY"}


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch, cli: str) -> Iterator[ModelEndpoint]:
    monkeypatch.setenv(KEY_VAR.get(cli, "OPENAI_API_KEY"), "test-key")
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with ModelEndpoint(adding_policy, keepalives=2, pause_s=0.2) as served:
        yield served


def acp_kwargs(cli: str, base_url: str) -> dict[str, Any]:
    if cli == "opencode":
        return {"executable": cli_path("opencode"), "base_url": base_url + "/v1"}
    if cli == "qwen_code":
        return {"executable": cli_path("qwen"), "base_url": base_url + "/v1"}
    return {"executable": cli_path("gemini"), "base_url": base_url}


@real_cli(timeout=150)
@pytest.mark.parametrize("cli", ["claude", "codex", "opencode", "qwen_code", "gemini_cli"])
def test_cli_runs_the_tool_call_we_wrote_and_takes_our_text(
    cli: str, endpoint: ModelEndpoint
) -> None:
    calls = Calls()
    if cli in ("claude", "codex"):
        env = cli_env(harness_for(cli, endpoint.base_url), calls, startup_timeout_s=60)
    else:
        kwargs = acp_kwargs(cli, endpoint.base_url)
        env = cli_env(cli, calls, model="m1", startup_timeout_s=60, **kwargs)
    try:
        _, info = env.reset()
        assert info["error_type"] == "", info
        reply, _, terminated, truncated, info = env.step(PROMPT)
    finally:
        env.close()
    assert (terminated, truncated, info["error_type"]) == (False, False, ""), info
    assert calls.seen == [(20, 22)]  # the CLI ran our tool call over the bridge
    assert "the sum is" in reply and "42" in reply  # and took our text as its answer

    served = [c for c in endpoint.calls() if env_tool(c.observation)]
    assert served and all(c.observation["stream"] for c in served)  # keep-alives went out
    first = next(c for c in served if c.completion is not None and c.completion.tool_calls)
    assert PROMPT in json.dumps(first.observation["messages"])
    assert first.completion is not None
    (sent,) = first.completion.tool_calls
    # A later request holds our call (same id) and the tool's result as a tool message.
    after = next(
        c.observation["messages"]
        for c in served
        if any(m.get("tool_call_id") == sent.id for m in c.observation["messages"])
    )
    assert any(
        c["id"] == sent.id for m in after if m["role"] == "assistant" for c in m["tool_calls"]
    )
    (result,) = [m for m in after if m["role"] == "tool"]
    assert "42" in result["content"]
    last = served[-1]
    assert last.completion is not None and not last.completion.tool_calls


def failing_first(observation: dict[str, Any], seen: list[int]) -> str:
    """An action naming a tool nobody offered on the first main call, then the adding policy."""
    if env_tool(observation) and not seen:
        seen.append(1)
        return json.dumps({"tool_calls": [{"name": "nope", "arguments": {}}]})
    return adding_policy(observation)


@real_cli(timeout=150)
@pytest.mark.parametrize("cli", ["claude", "codex"])
def test_a_stream_ended_by_fail_is_an_api_error_to_the_cli(
    cli: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_VAR.get(cli, "OPENAI_API_KEY"), "test-key")
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    seen: list[int] = []
    with ModelEndpoint(lambda obs: failing_first(obs, seen), keepalives=1) as served:
        calls = Calls()
        env = cli_env(harness_for(cli, served.base_url), calls, startup_timeout_s=60)
        try:
            env.reset()
            reply, _, terminated, truncated, info = env.step(PROMPT)
        finally:
            env.close()
        errors = [c.error for c in served.calls() if c.error]
    assert len(errors) == 1 and "'nope'" in errors[0]
    if cli == "claude":  # Claude Code retries an API error event, and the retry goes on
        assert (terminated, truncated, info["error_type"]) == (False, False, ""), info
        assert calls.seen == [(20, 22)] and "42" in reply
    else:  # Codex (stream_max_retries = 0) fails the turn with our reason
        assert (terminated, info["error_type"]) == (True, "harness_error"), info
        assert "'nope'" in info["error"] and calls.seen == []
