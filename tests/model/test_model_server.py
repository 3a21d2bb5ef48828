"""The scripted model server, driven over real loopback HTTP, for each wire API."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest
from support.model_server import Drop, Fail, Reply, ScriptedModelServer, Stall, token_id

ADD = {"a": 2, "b": 3}


@pytest.fixture
def client(srv: ScriptedModelServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.base_url, timeout=10) as c:
        yield c


def sse(text: str) -> list[tuple[str | None, Any]]:
    """Parse an SSE body into (event name, data) pairs; data is JSON unless "[DONE]"."""
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        name, data = None, ""
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        events.append((name, data if data == "[DONE]" else json.loads(data)))
    return events


# -- Anthropic Messages --

ANTHROPIC_TOOLS = [{"name": "mcp__env__add", "input_schema": {"type": "object"}}]


def test_anthropic_stream_calls_the_tool_then_quotes_its_result(client: httpx.Client) -> None:
    first = {"role": "user", "content": [{"type": "text", "text": "add them"}]}
    body = {"model": "m", "stream": True, "tools": ANTHROPIC_TOOLS, "messages": [first]}
    resp = client.post("/v1/messages?beta=true", json=body)
    assert resp.headers["content-type"] == "text/event-stream"
    events = sse(resp.text)
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    block = events[1][1]["content_block"]
    assert block["type"] == "tool_use" and block["name"] == "mcp__env__add"
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
    assert json.loads(partial) == ADD
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"]["output_tokens"] >= 1

    call = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": ADD}
    result = {
        "type": "tool_result",
        "tool_use_id": block["id"],
        "content": [{"type": "text", "text": "5"}],
    }
    body["messages"] = [
        first,
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    events = sse(client.post("/v1/messages", json=body).text)
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == "tool said: 5; you said: add them"
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"


def test_anthropic_non_streaming_and_side_routes(client: httpx.Client) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    message = client.post("/v1/messages", json=body).json()
    assert message["type"] == "message" and message["stop_reason"] == "end_turn"
    assert message["content"] == [{"type": "text", "text": "you said: hello"}]
    assert message["usage"]["input_tokens"] > 0
    assert client.head("/").status_code == 200
    assert client.get("/").status_code == 200
    assert client.post("/v1/messages/count_tokens", json=body).json()["input_tokens"] > 0


# -- OpenAI Responses --

RESPONSES_TOOLS = [{"type": "function", "name": "mcp__env__add", "parameters": {}}]


def test_responses_stream_calls_the_tool_then_quotes_its_result(client: httpx.Client) -> None:
    prompt = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}
    body = {"model": "m", "stream": True, "tools": RESPONSES_TOOLS, "input": [prompt]}
    events = sse(client.post("/v1/responses", json=body).text)
    assert [n for n, _ in events][:2] == ["response.created", "response.in_progress"]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    done = next(d["item"] for n, d in events if n == "response.output_item.done")
    assert done["type"] == "function_call" and json.loads(done["arguments"]) == ADD
    completed = events[-1][1]["response"]
    assert events[-1][0] == "response.completed" and completed["usage"]["total_tokens"] > 0

    output = {"type": "function_call_output", "call_id": done["call_id"], "output": "5"}
    body["input"] = [prompt, done, output]
    events = sse(client.post("/v1/responses", json=body).text)
    text = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    assert text == "tool said: 5; you said: go"
    item = next(d["item"] for n, d in events if n == "response.output_item.done")
    assert item["content"][0]["text"] == text


def test_responses_non_streaming_and_models(client: httpx.Client) -> None:
    resp = client.post("/v1/responses", json={"model": "m", "input": "hi"}).json()
    assert resp["status"] == "completed"
    assert resp["output"][0]["content"][0]["text"] == "you said: hi"
    for path in ("/v1/models", "/models"):
        assert client.get(path).json()["data"][0]["id"] == "scripted-model"


# -- OpenAI Chat Completions --

CHAT_TOOLS = [{"type": "function", "function": {"name": "env_add", "parameters": {}}}]


def test_chat_stream_calls_the_tool_then_quotes_its_result(client: httpx.Client) -> None:
    prompt = {"role": "user", "content": "sum"}
    body = {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": CHAT_TOOLS,
        "messages": [prompt],
    }
    events = sse(client.post("/v1/chat/completions", json=body).text)
    assert events[-1] == (None, "[DONE]")
    assert events[-2][1]["choices"] == [] and events[-2][1]["usage"]["total_tokens"] > 0
    assert events[-3][1]["choices"][0]["finish_reason"] == "tool_calls"
    calls = [c for _, d in events[:-2] for c in d["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "env_add"
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == ADD

    assistant = {"role": "assistant", "tool_calls": [{**calls[0], "function": {"name": "env_add"}}]}
    tool_msg = {"role": "tool", "tool_call_id": calls[0]["id"], "content": "5"}
    body["messages"] = [prompt, assistant, tool_msg]
    events = sse(client.post("/chat/completions", json=body).text)
    text = "".join(d["choices"][0]["delta"].get("content") or "" for _, d in events[:-2])
    assert text == "tool said: 5; you said: sum"
    assert events[-3][1]["choices"][0]["finish_reason"] == "stop"


def test_chat_logprobs_and_token_ids(client: httpx.Client) -> None:
    msgs = [{"role": "user", "content": "x y"}]
    body = {"model": "m", "messages": msgs, "logprobs": True, "top_logprobs": 2}
    resp = client.post("/v1/chat/completions", json={**body, "return_token_ids": True}).json()
    choice = resp["choices"][0]
    tokens = [e["token"] for e in choice["logprobs"]["content"]]
    assert "".join(tokens) == choice["message"]["content"] == "you said: x y"
    assert all(len(e["top_logprobs"]) == 2 for e in choice["logprobs"]["content"])
    assert choice["token_ids"] == [token_id(t) for t in tokens]

    events = sse(client.post("/v1/chat/completions", json={**body, "stream": True}).text)
    entries = [
        e for _, d in events[:-1] for e in (d["choices"][0]["logprobs"] or {}).get("content", [])
    ]
    assert [e["token"] for e in entries] == tokens
    assert all("token_ids" not in d["choices"][0] for _, d in events[:-1])

    plain = client.post("/v1/chat/completions", json={"model": "m", "messages": msgs}).json()
    assert plain["choices"][0]["logprobs"] is None


# -- Gemini --

GEMINI_TOOLS = [{"functionDeclarations": [{"name": "add", "parameters": {}}]}]


def test_gemini_stream_calls_the_tool_then_quotes_its_result(client: httpx.Client) -> None:
    prompt = {"role": "user", "parts": [{"text": "plus"}]}
    body = {"contents": [prompt], "tools": GEMINI_TOOLS}
    path = "/v1beta/models/gemini-x:streamGenerateContent?alt=sse"
    events = sse(client.post(path, json=body).text)
    last = events[-1][1]
    assert last["candidates"][0]["finishReason"] == "STOP" and "usageMetadata" in last
    call = last["candidates"][0]["content"]["parts"][0]["functionCall"]
    assert call == {"name": "add", "args": ADD}
    assert last["modelVersion"] == "gemini-x"

    answer = {"functionResponse": {"name": "add", "response": {"output": "5"}}}
    body["contents"] = [
        prompt,
        {"role": "model", "parts": [{"functionCall": call}]},
        {"role": "user", "parts": [answer]},
    ]
    events = sse(client.post(path, json=body).text)
    text = "".join(p["text"] for _, d in events for p in d["candidates"][0]["content"]["parts"])
    assert text == "tool said: 5; you said: plus"
    assert all("finishReason" not in d["candidates"][0] for _, d in events[:-1])

    single = client.post("/v1beta/models/g:generateContent", json=body).json()
    assert single["candidates"][0]["content"]["parts"] == [{"text": text}]
    assert client.post("/v1beta/models/g:countTokens", json=body).json()["totalTokens"] > 0


# -- modes --


def chat(client: httpx.Client, content: str = "q") -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    return str(
        client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    )


def test_fixed_reply_queue_and_every_turn(srv: ScriptedModelServer, client: httpx.Client) -> None:
    srv.reply("fixed")
    assert chat(client) == "fixed"
    srv.enqueue(Reply(text="one"), Reply(text="two"))
    assert [chat(client), chat(client), chat(client)] == ["one", "two", "fixed"]
    srv.script()
    assert chat(client, "back") == "you said: back"

    srv.script(tool="add")
    convo = [
        {"role": "user", "content": "t1"},
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "env_add"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "5"},
        {"role": "user", "content": "t2"},
    ]
    body = {"model": "m", "messages": convo, "tools": CHAT_TOOLS}
    once = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert once["message"]["content"] == "tool said: 5; you said: t2"
    with ScriptedModelServer(tool="add", every_turn=True) as other:
        again = httpx.post(f"{other.openai_base_url}/chat/completions", json=body, timeout=10)
        assert again.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_fail_mode(srv: ScriptedModelServer, client: httpx.Client) -> None:
    srv.enqueue(Fail(429, {"error": {"type": "rate_limit_error", "message": "slow down"}}))
    resp = client.post("/v1/messages", json={"model": "m", "messages": []})
    assert resp.status_code == 429 and resp.json()["error"]["type"] == "rate_limit_error"
    srv.fail(503, "overloaded")
    for _ in range(2):
        resp = client.post("/v1/responses", json={"model": "m", "input": "x"})
        assert (resp.status_code, resp.text) == (503, "overloaded")


def test_request_log(srv: ScriptedModelServer, client: httpx.Client) -> None:
    client.post("/v1/messages", json={"model": "m", "messages": []}, headers={"x-api-key": "k1"})
    client.get("/v1/models")
    assert srv.wait_requests(2, timeout=5)
    first, second = srv.requests()
    assert (first.api, first.method, first.path) == ("anthropic", "POST", "/v1/messages")
    assert first.headers["x-api-key"] == "k1" and first.body == {"model": "m", "messages": []}
    assert second.api == "other" and first.time <= second.time
    assert srv.requests(api="anthropic") == [first]


STREAM_BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "s"}]}


def stream_in_thread(url: str, out: list[Any]) -> threading.Thread:
    def run() -> None:
        try:
            with httpx.Client(timeout=10) as c:
                out.append(c.post(url, json=STREAM_BODY).text)
        except httpx.HTTPError as exc:
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("after", [None, 0, 3])
def test_stall_then_release_completes(srv: ScriptedModelServer, after: int | None) -> None:
    srv.stall(after=after)
    out: list[Any] = []
    thread = stream_in_thread(f"{srv.openai_base_url}/chat/completions", out)
    assert srv.wait_stalled(1, timeout=5)
    assert out == []
    srv.release()
    thread.join(10)
    assert sse(out[0])[-1] == (None, "[DONE]")
    assert not srv.wait_stalled(1, timeout=0.01)


def test_stop_is_bounded_with_stalled_requests_and_leaves_no_thread() -> None:
    before = set(threading.enumerate())
    srv = ScriptedModelServer().start()
    srv.enqueue(Stall(after=None), Stall(after=2))
    outs: list[Any] = []
    threads = [stream_in_thread(f"{srv.base_url}/v1/messages", outs) for _ in range(2)]
    assert srv.wait_stalled(2, timeout=5)
    started = time.monotonic()
    srv.stop()
    srv.stop()  # idempotent
    assert time.monotonic() - started < 5
    for t in threads:
        t.join(10)
    assert len(outs) == 2 and all(isinstance(o, httpx.HTTPError) for o in outs)
    assert set(threading.enumerate()) <= before


def test_drop_cuts_the_stream(srv: ScriptedModelServer, client: httpx.Client) -> None:
    srv.enqueue(Drop(after=2))
    seen = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        client.stream("POST", "/v1/messages", json=STREAM_BODY) as resp,
    ):
        for chunk in resp.iter_text():
            seen.append(chunk)
    assert "message_start" in "".join(seen) and "message_stop" not in "".join(seen)
    assert client.post("/v1/messages", json=STREAM_BODY).text.count("message_stop") == 2
