"""``ChatCompletionsPolicy`` answers model mode with a real chat-completions server.

The server is the scripted one of ``support.model_server`` (real HTTP on 127.0.0.1, vLLM's
answer shape); the harness is the reference agent in model mode, whose env tool records its
calls. Per case: the server's tool call reaches the env's tool and its text ends the turn,
with the engine's ids in the trace when the server returns them; a server that is down,
fails, answers garbage or is too slow ends the episode as ``policy_error``, scored, and the
rollout goes on. The CLI's ``--policy chat-completions`` runs the same.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.cli import Calls
from support.envs import model_env
from support.model_server import Raw, ScriptedModelServer, token_id

from gym_harness import ChatCompletionsPolicy, ConfigError, PolicyError, Task
from gym_harness.outcome import Outcome
from gym_harness.records.trajectory import RewardContext
from gym_harness.rollout import local_rollout
from gym_harness.rollout.episode import run_episode
from gym_harness.rollout.groups import NOT_FORKED, run_task

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "what is 2+3?"
#: The scripted server calls ``add(2, 3)`` while no result is in, then says what it got.
srv_options_add = {"tool": "add", "arguments": {"a": 2, "b": 3}}
#: The text the server ends the turn with once the tool said 5.
FINAL = f"tool said: 5; you said: {PROMPT}"
TASK = {"id": "t", "prompt": PROMPT}


@pytest.fixture
def srv_options() -> dict[str, Any]:
    return srv_options_add


def scored(ctx: RewardContext) -> float:
    """1.0 for the server's final text; 0.5 for a turn cut by the policy's error."""
    if ctx.cause == "policy_error":
        return 0.5
    return 1.0 if "tool said: 5" in ctx.response else 0.0


def episode(policy: Any, calls: Calls, **env_options: Any) -> dict[str, Any]:
    """One reference episode in model mode answered by ``policy``: its rollout record."""
    env = model_env("reference", calls.tools(), prompt=PROMPT, reward_fn=scored, **env_options)
    try:
        return run_episode(env, TASK, env_id="reference", policy=policy, max_steps=10)
    finally:
        env.close()


def test_the_servers_tool_call_reaches_the_tool_and_its_text_ends_the_turn(
    srv: ScriptedModelServer,
) -> None:
    calls = Calls()
    policy = ChatCompletionsPolicy(
        srv.openai_base_url, "served-model", return_token_ids=True, logprobs=True
    )
    with policy:
        record = episode(policy, calls)
    assert (record["outcome"], record["reward"]) == ("done", 1.0), record["turns"][-1]
    assert calls.seen == [(2, 3)]  # the server's call ran the env's tool, once
    assert record["messages"][-1] == {"role": "assistant", "content": FINAL}

    sent = srv.requests(api="chat")
    assert len(sent) == 2 and all(r.body["model"] == "served-model" for r in sent)
    assert all(r.body["stream"] is False and r.body["return_token_ids"] for r in sent)
    assert any(t["function"]["name"].endswith("add") for t in sent[0].body["tools"])
    # The tool's result went back in OpenAI's shape, paired with the server's call id.
    (asked,) = [c for m in sent[1].body["messages"] for c in m.get("tool_calls", [])]
    (result,) = [m for m in sent[1].body["messages"] if m["role"] == "tool"]
    assert result == {"role": "tool", "content": "5", "tool_call_id": asked["id"]}
    assert json.loads(asked["function"]["arguments"]) == {"a": 2, "b": 3}

    # The engine's ids and logprobs, as the server returned them, are in the trace.
    main = [c for c in record["calls"] if not c["side"]]
    assert len(main) == 2
    text = main[1]  # a call's record keeps the engine's ids at its top level
    pieces = ["tool", " said:", " 5;", " you", " said:", " what", " is", " 2+3?"]
    assert "".join(pieces) == FINAL
    assert text["token_ids"] == [token_id(p) for p in pieces]
    assert len(text["logprobs"]) == len(pieces)
    assert all(isinstance(lp, float) and lp <= 0 for lp in text["logprobs"])
    assert text["prompt_token_ids"] and text["prompt_token_ids"] == list(
        range(len(text["prompt_token_ids"]))
    )
    assert main[0]["completion"]["tool_calls"][0]["arguments"] == {"a": 2, "b": 3}


def test_a_server_without_ids_gives_a_text_level_trace(srv: ScriptedModelServer) -> None:
    srv.token_ids = False  # a hosted API: it ignores return_token_ids
    calls = Calls()
    with ChatCompletionsPolicy(srv.openai_base_url, "m", return_token_ids=True) as policy:
        record = episode(policy, calls)
    assert (record["outcome"], record["reward"], calls.seen) == ("done", 1.0, [(2, 3)])
    main = [c for c in record["calls"] if not c["side"]]
    assert [c["token_ids"] for c in main] == [None, None]
    assert [c["prompt_token_ids"] for c in main] == [None, None]


def test_one_policy_serves_concurrent_episodes(srv: ScriptedModelServer) -> None:
    out = io.StringIO()
    tasks = [Task(id="a", prompt=PROMPT), Task(id="b", prompt=PROMPT)]
    with ChatCompletionsPolicy(srv.openai_base_url, "m", max_connections=2) as policy:
        written = local_rollout(
            "gym_harness/Reference-v0",
            {"mode": "model"},
            tasks,
            out=out,
            n=2,
            policy=policy,
            concurrency=4,
        )
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert written == len(records) == 4
    assert {r["outcome"] for r in records} == {"done"}
    assert {r["messages"][-1]["content"] for r in records} == {FINAL}
    assert len(srv.requests(api="chat")) == 8  # two calls an episode, none lost or doubled


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: JSON nested past the decoder's recursion limit (json raises RecursionError, no ValueError).
DEEP = b"[" * 100_000


@pytest.mark.parametrize(
    "fault", ["down", "500", "garbage", "deep", "deep_500", "no_choices", "slow"]
)
def test_a_failing_server_ends_the_episode_as_policy_error(
    srv: ScriptedModelServer, fault: str
) -> None:
    base_url = srv.openai_base_url
    if fault == "down":
        base_url = f"http://127.0.0.1:{closed_port()}/v1"
    elif fault == "500":
        srv.fail(500, {"error": {"message": "engine overloaded"}})
    elif fault == "garbage":
        srv.enqueue(Raw(b"<html>not json", "application/json"))
    elif fault == "deep":
        srv.enqueue(Raw(DEEP, "application/json"))
    elif fault == "deep_500":
        srv.enqueue(Raw(DEEP, "application/json", status=500))
    elif fault == "no_choices":
        srv.enqueue(Raw(b'{"object": "chat.completion", "choices": []}', "application/json"))
    else:
        srv.stall()  # headers never come: the policy's timeout, well under the env's
    calls = Calls()
    with ChatCompletionsPolicy(base_url, "m", timeout_s=1.0, connect_timeout_s=2.0) as policy:
        record = episode(policy, calls)
    srv.release()
    turn = record["turns"][-1]
    assert record["outcome"] == Outcome.POLICY_ERROR, turn
    assert (turn["terminated"], turn["truncated"], record["reward"]) == (False, True, 0.5)
    assert calls.seen == []
    why = {
        "down": "could not connect to the model server",
        "500": "answered HTTP 500: 'engine overloaded'",
        "garbage": "no chat completion (the body is no JSON): '<html>not json'",
        "deep": "no chat completion (the body is no JSON): '[[[",
        "deep_500": "answered HTTP 500: '[[[",
        "no_choices": "no chat completion (it holds no choices[0])",
        "slow": "did not answer within 1s",
    }[fault]
    assert why in turn["error"] and "/v1/chat/completions" in turn["error"], turn["error"]
    main = [c for c in record["calls"] if not c["side"]]
    assert main and all(c["completion"] is None for c in main)  # nothing was delivered


def test_a_failing_server_before_the_fork_step_ends_the_prefix_unforked(
    srv: ScriptedModelServer,
) -> None:
    srv.fail(503, {"error": {"message": "no replicas"}})
    env = model_env("reference", Calls().tools(), prompt=PROMPT, reward_fn=scored)
    try:
        with ChatCompletionsPolicy(srv.openai_base_url, "m") as policy:
            records = run_task(
                env,
                TASK,
                env_id="reference",
                seed=0,
                index=0,
                max_turns=1,
                follow_up="",
                group=2,
                fork_at=1,
                policy=policy,
            )
    finally:
        env.close()
    assert [r["outcome"] for r in records] == [Outcome.POLICY_ERROR, NOT_FORKED]
    assert "answered HTTP 503: 'no replicas'" in records[0]["error"]
    assert records[0]["reward"] == 0.5


def test_the_key_goes_in_a_header_and_never_into_the_pickle(
    srv: ScriptedModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLICY_TEST_KEY", "sk-secret-123")
    policy = ChatCompletionsPolicy(
        srv.openai_base_url, "m", "POLICY_TEST_KEY", temperature=0.2, top_p=None
    )
    request = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": PROMPT},
            {"role": "assistant", "content": "", "tool_calls": []},
            {"role": "user", "content": "again"},
        ],
        "tools": [],
        "sampling": {"temperature": 1.0, "top_p": 0.9, "max_tokens": 32000, "seed": 7},
    }
    srv.reply("hello")
    assert policy(request)["content"] == "hello"
    copy = pickle.loads(pickle.dumps(policy))  # after use: the client is not pickled
    assert b"sk-secret" not in pickle.dumps(policy)
    assert copy(request)["content"] == "hello"
    policy.close()
    copy.close()
    first, second = srv.requests(api="chat")
    assert first.headers["authorization"] == "Bearer sk-secret-123"
    assert first.body == second.body
    # The harness's sampling is sent on, the policy's own over it; None leaves a field out;
    # max_tokens is the policy's to set; an empty tool_calls list is left out.
    assert first.body == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": PROMPT},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "again"},
        ],
        "temperature": 0.2,
        "seed": 7,
        "stream": False,
    }


def test_bad_configuration_says_what_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POLICY_TEST_NO_KEY", raising=False)
    with pytest.raises(ConfigError, match="export POLICY_TEST_NO_KEY="):
        ChatCompletionsPolicy("http://127.0.0.1:1/v1", "m", "POLICY_TEST_NO_KEY")
    with pytest.raises(ConfigError, match="base_url must be an http"):
        ChatCompletionsPolicy("127.0.0.1:8000", "m")
    with pytest.raises(ConfigError, match="timeout_s must be positive"):
        ChatCompletionsPolicy("http://127.0.0.1:1/v1", "m", timeout_s=0)
    with pytest.raises(PolicyError, match="could not connect"):
        ChatCompletionsPolicy(f"http://127.0.0.1:{closed_port()}/v1", "m")({"messages": []})


def rollout(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``gym-harness rollout`` of one Reference task in model mode."""
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "add", "prompt": PROMPT}) + "\n")
    command = [sys.executable, "-m", "gym_harness.rollout.cli", "rollout", "tasks.jsonl"]
    return subprocess.run(
        [*command, "--mode", "model", "--out", "out.jsonl", *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
    )


def test_the_cli_forwards_to_the_server(srv: ScriptedModelServer, tmp_path: Path) -> None:
    done = rollout(
        tmp_path,
        "--policy",
        "chat-completions",
        "--policy-url",
        srv.openai_base_url,
        "--policy-model",
        "served",
        "--policy-set",
        "return_token_ids=true",
        "--policy-set",
        "temperature=0",
    )
    assert done.returncode == 0, done.stderr
    (record,) = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert record["outcome"] == "done" and record["messages"][-1]["content"] == FINAL
    main = [c for c in record["calls"] if not c["side"]]
    assert main[-1]["token_ids"], main[-1]
    sent = srv.requests(api="chat")
    assert [r.body["temperature"] for r in sent] == [0, 0]
    assert {r.body["model"] for r in sent} == {"served"}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--policy", "chat-completions"], "needs --policy-url and --policy-model"),
        (
            ["--policy", "support.policies:add_then_answer", "--policy-url", "http://x/v1"],
            "--policy-url configure --policy chat-completions",
        ),
        (
            [
                *("--policy", "chat-completions", "--policy-url", "http://127.0.0.1:1/v1"),
                *("--policy-model", "m", "--policy-key-env", "POLICY_TEST_NO_KEY"),
            ],
            "export POLICY_TEST_NO_KEY=",
        ),
    ],
)
def test_the_cli_says_what_is_missing(tmp_path: Path, args: list[str], needle: str) -> None:
    done = rollout(tmp_path, *args)
    assert done.returncode == 2 and needle in done.stderr, done.stderr
