"""The five real CLIs in model mode, answered by ``ChatCompletionsPolicy``.

Each CLI speaks its own wire API to the env (Anthropic Messages, Responses, Chat
Completions, Gemini); the policy forwards every main call, as Chat Completions, to the
scripted server of ``support.model_server`` (real HTTP on 127.0.0.1, vLLM's answer shape
with ``token_ids``, ``prompt_token_ids`` and ``logprobs``), all in the loopback-only
namespace. The server first calls the env's tool (under the name the CLI gave it), then
answers with text: the tool runs over the bridge, the turn ends with the server's text,
and the text call's ids are in the trace as the server sent them.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.cli import CLIS, Calls, real_cli
from support.model_server import ScriptedModelServer, pieces, token_id

from gym_harness import ChatCompletionsPolicy
from gym_harness.records.trajectory import RewardContext
from gym_harness.rollout.episode import answer_calls

PROMPT = "please add 20 and 22 with the add tool"


def reward(ctx: RewardContext) -> float:
    """0.75 when the reply quotes the tool's result (the sum), else 0.25."""
    return 0.75 if "tool said:" in ctx.response and "42" in ctx.response else 0.25


@real_cli(timeout=300)
@pytest.mark.parametrize("cli", list(CLIS))
def test_the_server_answers_the_cli_through_the_policy(cli: str, make_env: Any) -> None:
    calls = Calls()
    with (
        ScriptedModelServer(tool="add", arguments={"a": 20, "b": 22}) as server,
        ChatCompletionsPolicy(
            server.openai_base_url, "served", return_token_ids=True, logprobs=True
        ) as policy,
    ):
        env = make_env(calls, PROMPT, reward_fn=reward)
        try:
            obs, info = env.reset(seed=0)
            assert info["error_type"] == "", info
            answer_calls(env, obs, policy, max_steps=8)
            trajectory = env.trajectory
        finally:
            env.close()
        sent = server.requests(api="chat")

    (turn,) = trajectory.turns
    assert (turn.error_type, turn.terminated, turn.truncated) == ("", True, False), turn.error
    with calls.lock:
        assert calls.seen == [(20, 22)]  # the server's tool call ran the env's tool
    assert turn.reward == 0.75, turn.response

    main = [c for c in trajectory.calls if not c.side]
    assert len(main) == len(sent) == 2, [c.request_id for c in main]
    tool_name = main[0].completion.tool_calls[0].name if main[0].completion else ""
    assert tool_name.endswith("add") and "env" in tool_name, tool_name
    assert any(t["function"]["name"] == tool_name for t in sent[0].body["tools"])
    results = [m for m in sent[1].body["messages"] if m["role"] == "tool"]
    assert len(results) == 1 and "42" in results[0]["content"], sent[1].body["messages"]
    # The text call's ids, as the server returned them, are the trace's.
    text = main[1]
    assert text.completion is not None and text.completion.content.startswith("tool said:")
    # The turn ends with the server's text (each CLI words its tool result its own way).
    assert turn.response.strip() == text.completion.content.strip(), turn.response
    expected = [token_id(p) for p in pieces(text.completion.content)]
    assert list(text.token_ids or ()) == expected
    assert text.logprobs is not None and len(text.logprobs) == len(expected)
    assert text.prompt_token_ids
