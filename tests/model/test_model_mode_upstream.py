"""mode="model" with ``upstream=``: side calls go to the real API, main calls to the policy.

A real line-protocol harness (``support/scripts/model_agent.py``, whose prompt word
"side" makes it send a ``gym-side`` title call first) and a scripted upstream on
127.0.0.1 (``support.model_server``); the env's endpoint forwards through its capture
proxy. Nothing of ours is mocked.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from support.envs import model_env
from support.model_server import Raw, ScriptedModelServer
from test_model_endpoint import no_tools, post

from gym_harness import HarnessEnv, RewardContext
from gym_harness.capture.proxy import ModelProxy
from gym_harness.model import ModelEndpoint
from gym_harness.model._side import SideUpstream
from gym_harness.records.events import EventType

KEY_ENV = "GYM_HARNESS_TEST_SIDE_KEY"
REAL_KEY = "sk-real-side-key-0123456789"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def reward(ctx: RewardContext) -> float:
    return 1.0 if "5" in ctx.response else 0.25


def play(env: HarnessEnv) -> tuple[list[Any], list[str]]:
    """Reset, call the tool, end with text; the main calls must be the steps.

    Returns:
        The turn's events, and the texts the harness printed.
    """
    obs, info = env.reset(seed=0)
    assert info["error_type"] == "", info["error"]
    request = json.loads(obs)
    assert request["model"] == "main" and [t["function"]["name"] for t in request["tools"]]
    obs, rew, term, _, info = env.step(
        json.dumps({"content": "", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]})
    )
    assert (rew, term, info["error_type"]) == (0.0, False, ""), info["error"]
    tool = json.loads(obs)["messages"][-1]
    assert (tool["role"], tool["content"]) == ("tool", "5")  # the tool really ran
    _, rew, term, _, info = env.step("5")
    assert (rew, term, info["error_type"]) == (1.0, True, ""), info["error"]
    events = list(env.trajectory.turns[0].events)
    texts = [e.data.get("text") for e in events if e.type is EventType.TEXT]
    return events, texts


def test_a_side_call_goes_upstream_with_the_real_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, REAL_KEY)
    with ScriptedModelServer() as upstream:
        upstream.reply("Sums from upstream")
        env = model_env(
            "command",
            [add],
            prompt="side: what is 2+3?",
            upstream=upstream.base_url,
            upstream_api_key_env=KEY_ENV,
            reward_fn=reward,
        )
        try:
            events, texts = play(env)
            token = env._mode.endpoint.token if env._mode.endpoint else ""
            logged = upstream.requests()
            assert [r.body["model"] for r in logged] == ["gym-side"]  # main calls: the policy
            assert logged[0].headers["authorization"] == f"Bearer {REAL_KEY}"
            assert token and token not in logged[0].raw.decode() + json.dumps(logged[0].headers)
            assert "[title: Sums from upstream] " in texts  # the harness got the upstream's answer
            calls = env.trajectory.calls
            assert [(c.side, c.status) for c in calls] == [(True, 200), (False, 200), (False, 200)]
            assert calls[0].observation is not None
            assert calls[0].observation["model"] == "gym-side"
            # The proxy's record of the exchange is in the turn's events, key redacted.
            answers = [e.data for e in events if e.type is EventType.LLM_RESPONSE]
            assert [(a["status"], a["outcome"], a["text"]) for a in answers] == [
                (200, "ok", "Sums from upstream")
            ]
            assert REAL_KEY not in json.dumps([e.data for e in events], default=str)
        finally:
            env.close()


def test_an_unreachable_upstream_gives_the_side_call_a_502(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, REAL_KEY)
    with socket.socket() as sock:  # a port nothing listens on (bound, never listening)
        sock.bind(("127.0.0.1", 0))
        env = model_env(
            "command",
            [add],
            prompt="side: what is 2+3?",
            upstream=f"http://127.0.0.1:{sock.getsockname()[1]}",
            upstream_api_key_env=KEY_ENV,
            reward_fn=reward,
        )
        try:
            _, texts = play(env)
            assert "[title: failed 502] " in texts
            calls = env.trajectory.calls
            assert [(c.side, c.status) for c in calls] == [(True, 502), (False, 200), (False, 200)]
            assert calls[0].error
        finally:
            env.close()


@pytest.mark.parametrize("cli", ["claude", "codex", "gemini_cli", "opencode"])
def test_a_streamed_side_answer_is_relayed_byte_for_byte(cli: str) -> None:
    sse = b'data: {"a": 1}\n\n' + b"x" * 70_000 + b"\n\ndata: [DONE]\n\n"
    with (
        ScriptedModelServer() as upstream,
        ModelProxy(upstream.base_url, api_key=REAL_KEY) as proxy,
    ):
        upstream.enqueue(Raw(sse))
        with ModelEndpoint(no_tools) as ep:
            ep.rotate_token()
            ep.side_upstream = SideUpstream(proxy.base_url, proxy.rotate_token(), 30.0)
            conn = post(ep, cli, body=_no_tools_body(cli))
            try:
                resp = conn.getresponse()
                assert (resp.status, resp.read()) == (200, sse)
                assert resp.getheader("content-type") == "text/event-stream"
            finally:
                conn.close()
            records = ep.calls()
        assert [(r.side, r.status, r.completion) for r in records] == [(True, 200, None)]
        assert [e.status for e in proxy.drain()] == [200]


def _no_tools_body(cli: str) -> dict[str, Any]:
    from test_model_wire import captured

    return {k: v for k, v in captured(cli)["body"].items() if k != "tools"}
