"""gym_harness.model: request -> observation -> action -> answer, in the four wire APIs.

The requests under ``tests/data/model_requests`` are real: what Claude Code, Codex,
OpenCode, Qwen Code and Gemini CLI sent (against tests/support/model_server.py, second model
call of a turn that called the env tool ``add``). Answers are read back with the
parsers the capture proxy uses (``records.exchanges.assemble``, ``chat_format``), which
were written against the real APIs' streams.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym_harness.model import (
    ActionLimits,
    AnswerWriter,
    BadRequest,
    Completion,
    InvalidAction,
    ModelRequest,
    ToolCall,
    encode_answer,
    error_body,
    parse_action,
    read_request,
)
from gym_harness.records.chat_format import exchange_messages
from gym_harness.records.exchanges import assemble, parse_sse

DATA = Path(__file__).parents[1] / "data" / "model_requests"
APIS = ("anthropic", "responses", "chat", "gemini")
#: The env tool ``add`` as each CLI offered it.
ENV_TOOL = {
    "claude": "mcp__env__add",
    "codex": "mcp__env__add",
    "opencode": "env_add",
    "qwen_code": "mcp__env__add",
    "gemini_cli": "mcp_env_add",
}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def captured(cli: str) -> dict[str, Any]:
    return dict(json.loads(gzip.decompress((DATA / f"{cli}.json.gz").read_bytes())))


def real_request(cli: str) -> ModelRequest:
    doc = captured(cli)
    raw = json.dumps(doc["body"]).encode()
    request = read_request(doc["path"], raw, query=doc["query"], request_id="r1")
    assert request is not None
    return request


# -- a request in each API, offering the given tools ------------------------------------------


def make_body(api: str, tools: list[str], stream: bool) -> tuple[str, str, dict[str, Any]]:
    """(path, query, body) of a small request in ``api`` offering ``tools``."""
    if api == "anthropic":
        offered = [{"name": n, "description": "d", "input_schema": SCHEMA} for n in tools]
        body = {
            "model": "m",
            "max_tokens": 100,
            "stream": stream,
            "system": "be brief",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": offered,
        }
        return "/v1/messages", "", body
    if api == "responses":
        offered = [{"type": "function", "name": n, "parameters": SCHEMA} for n in tools]
        body = {"model": "m", "stream": stream, "input": "hi", "tools": offered}
        return "/v1/responses", "", body
    if api == "chat":
        offered = [
            {"type": "function", "function": {"name": n, "parameters": SCHEMA}} for n in tools
        ]
        body = {
            "model": "m",
            "stream": stream,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi"}],
            "tools": offered,
        }
        return "/v1/chat/completions", "", body
    offered = [{"functionDeclarations": [{"name": n, "parameters": SCHEMA} for n in tools]}]
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "tools": offered}
    method = "streamGenerateContent" if stream else "generateContent"
    return f"/v1beta/models/gm:{method}", "alt=sse" if stream else "", body


def make_request(api: str, tools: list[str], stream: bool) -> ModelRequest:
    path, query, body = make_body(api, tools, stream)
    request = read_request(path, json.dumps(body).encode(), query=query, request_id="r")
    assert request is not None
    return request


def read_back(request: ModelRequest, content_type: str, data: bytes) -> dict[str, Any]:
    """The answer as the capture proxy records it: ``(text, tool_calls, stop, usage)``."""
    path = {"anthropic": "/v1/messages", "responses": "/v1/responses"}.get(
        request.api, "/v1/chat/completions" if request.api == "chat" else "/models/m:x"
    )
    if request.api == "gemini":
        path = "/v1beta/models/gm:streamGenerateContent"
    record = assemble(
        seq=1,
        method="POST",
        path=path,
        request=json.dumps(request.body).encode(),
        logprobs_added=False,
        status=200,
        outcome="ok",
        error="",
        answer=(content_type, data),
        started_at=0.0,
        ttfb_s=None,
        total_s=0.0,
    )
    return record.to_dict()


# -- requests: real captures -------------------------------------------------------------------


@pytest.mark.parametrize("cli", sorted(ENV_TOOL))
def test_real_request_becomes_the_observation(cli: str) -> None:
    request = real_request(cli)
    obs = json.loads(json.dumps(request.observation()))  # JSON-ready
    assert set(obs) == {"request_id", "api", "model", "messages", "tools", "sampling", "stream"}
    assert obs["request_id"] == "r1" and obs["model"] == "scripted-model" and obs["stream"]
    assert ENV_TOOL[cli] in request.tool_names
    (tool,) = [t for t in obs["tools"] if t["function"]["name"] == ENV_TOOL[cli]]
    assert {"a", "b"} <= set(tool["function"]["parameters"]["properties"])
    text = json.dumps(obs["messages"])
    assert "please add the numbers" in text
    calls = [c for m in obs["messages"] if m["role"] == "assistant" for c in m["tool_calls"]]
    assert [c["function"]["name"] for c in calls] == [ENV_TOOL[cli]]
    (result,) = [m for m in obs["messages"] if m["role"] == "tool"]
    assert "42" in result["content"] and result["tool_call_id"] == calls[0]["id"]


def test_real_requests_report_their_sampling() -> None:
    assert real_request("claude").sampling["max_tokens"] == 32000
    assert real_request("claude").api == "anthropic"
    assert real_request("codex").sampling["reasoning"] == {"effort": "medium"}
    assert real_request("codex").sampling["tool_choice"] == "auto"
    assert real_request("qwen_code").sampling["max_tokens"] == 8000
    gemini = real_request("gemini_cli")
    assert gemini.sampling["top_k"] == 64 and gemini.sampling["temperature"] == 1
    assert (gemini.api, gemini.stream, gemini.sse) == ("gemini", True, True)


def test_codex_namespaced_tool_answers_in_its_namespace() -> None:
    request = real_request("codex")
    assert request.wire_tools["mcp__env__add"].namespace == "mcp__env"
    assert "apply_patch" in request.tool_names  # a freeform tool, offered as {"input": str}
    action = json.dumps(
        {
            "content": "",
            "tool_calls": [
                {"name": "mcp__env__add", "arguments": {"a": 1, "b": 2}},
                {"name": "apply_patch", "arguments": {"input": "*** Begin Patch\n"}},
            ],
        }
    )
    completion = parse_action(action, api=request.api, tool_names=request.tool_names)
    _, data = encode_answer(request, completion)
    done = [
        json.loads(e.data)["item"]
        for e in parse_sse(data)
        if e.event == "response.output_item.done"
    ]
    assert done[0]["type"] == "function_call"
    assert (done[0]["name"], done[0]["namespace"]) == ("add", "mcp__env")
    assert done[1] == {**done[1], "type": "custom_tool_call", "input": "*** Begin Patch\n"}
    assert [e.event for e in parse_sse(data)][-1] == "response.completed"


def test_requests_that_are_no_model_call_are_none() -> None:
    assert read_request("/", b"") is None
    assert read_request("/v1/models", b"{}") is None
    assert read_request("/v1/messages/count_tokens", b"not json") is None


MALFORMED = {
    "empty": ("/v1/messages", b"", "empty"),
    "blank": ("/v1/messages", b" \r\n ", "empty"),
    "binary": ("/v1/messages", b"\x89PNG\r\n\x1a\n\xff\xfe", "binary"),
    "not json": ("/v1/messages", b"not json", "not JSON"),
    "array": ("/v1/messages", b"[1, 2]", "JSON array"),
    "deep": ("/v1/chat/completions", b"[" * 200_000 + b"]" * 200_000, "nested"),
    "messages a string": ("/v1/chat/completions", b'{"messages": "x"}', "'messages' must be"),
    "messages missing": ("/v1/messages", b'{"model": "m"}', "got missing"),
    "message not an object": ("/v1/messages", b'{"messages": [{"role": "user"}, 3]}', "item 1"),
    "contents an object": ("/v1beta/models/m:generateContent", b'{"contents": {}}', "object"),
    "input a number": ("/v1/responses", b'{"input": 5}', "'input' must be"),
    "tool call not an object": (
        "/v1/chat/completions",
        b'{"messages": [{"role": "assistant", "tool_calls": ["x"]}]}',
        "wrong shape",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_model_call_is_a_bad_request_with_the_reason(case: str) -> None:
    path, body, reason = MALFORMED[case]
    with pytest.raises(BadRequest, match=re.escape(reason)):
        read_request(path, body)


def test_a_responses_input_may_be_one_string() -> None:
    request = read_request("/v1/responses", b'{"model": "m", "input": "hi"}')
    assert request is not None and request.messages == [{"role": "user", "content": "hi"}]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = st.sampled_from(
    ["messages", "input", "contents", "system", "tools", "instructions", "model", "stream"]
)


#: Messages of any shape: objects with the keys the four APIs' messages use.
MESSAGES = st.lists(
    st.dictionaries(
        st.sampled_from(["role", "content", "tool_calls", "parts", "type", "text", "call_id"]),
        JSON,
        max_size=4,
    ),
    max_size=4,
)
CONVERSATION = {"chat": "messages", "anthropic": "messages", "responses": "input"}


@given(st.sampled_from(APIS), st.dictionaries(KEYS, JSON, max_size=5), MESSAGES | st.none())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_json_body_reads_or_is_refused_never_raises(
    api: str, body: dict[str, Any], messages: list[Any] | None
) -> None:
    path = make_body(api, [], False)[0]
    if messages is not None:  # a conversation of the right kind, with parts of any shape
        body[CONVERSATION.get(api, "contents")] = messages
    try:
        request = read_request(path, json.dumps(body).encode())
    except BadRequest:
        return
    assert request is not None
    json.dumps(request.observation())


# -- actions ------------------------------------------------------------------------------------


def test_plain_text_and_non_messages_are_text() -> None:
    for action in ["hello", "", '{"role": "assistant"}', "{not json}", "[1]", '"x"', " {}"]:
        assert parse_action(action) == Completion(content=action)


def test_a_message_with_calls_in_both_shapes() -> None:
    action = {
        "content": "ok",
        "tool_calls": [
            {"id": "c1", "name": "add", "arguments": '{"a": 1}'},
            {"type": "function", "function": {"name": "add", "arguments": {"a": 2}}},
        ],
        "token_ids": [1, 2],
        "logprobs": [-0.5, {"token": "x", "logprob": -1.0}],
        "usage": {"input_tokens": 3},
    }
    completion = parse_action(json.dumps(action), api="anthropic", tool_names={"add"})
    assert completion.content == "ok" and completion.stop_reason == "tool_calls"
    assert completion.tool_calls[0] == ToolCall("c1", "add", {"a": 1})
    assert completion.tool_calls[1].id.startswith("toolu_")
    assert completion.token_ids == (1, 2) and completion.usage == {"input_tokens": 3}
    assert json.loads(json.dumps(completion.to_dict()))["tool_calls"][0]["name"] == "add"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ({"tool_calls": [{"name": "sub", "arguments": {}}]}, "did not offer"),
        ({"tool_calls": [{"name": "add", "arguments": "[1]"}]}, "must be an object"),
        ({"tool_calls": [{"name": "add", "arguments": [1]}]}, "must be an object"),
        ({"tool_calls": [{"name": "add", "arguments": "{oops"}]}, "not valid JSON"),
        ({"tool_calls": [{"arguments": {}}]}, "needs a tool name"),
        ({"tool_calls": ["add"]}, "must be an object"),
        ({"tool_calls": {"name": "add"}}, "must be a list"),
        ({"content": 3}, "content must be a string"),
        ({"content": "", "stop_reason": "bored"}, "stop_reason"),
        ({"content": "", "token_ids": [1.5]}, "integers"),
        ({"content": "", "logprobs": ["x"]}, "numbers or objects"),
        ({"content": "", "usage": [1]}, "usage must be an object"),
        ({"tool_calls": [{"id": "a b", "name": "add"}]}, "id must be"),
        ({"tool_calls": [{"id": "x", "name": "add"}, {"id": "x", "name": "add"}]}, "unique"),
    ],
)
def test_invalid_messages_say_why(message: dict[str, Any], reason: str) -> None:
    with pytest.raises(InvalidAction, match=reason):
        parse_action(json.dumps(message), tool_names={"add"})


def test_stop_reason_follows_the_calls() -> None:
    call = {"name": "add", "arguments": {}}
    with_call = {"content": "", "tool_calls": [call], "stop_reason": "end_turn"}
    assert parse_action(json.dumps(with_call), tool_names={"add"}).stop_reason == "tool_calls"
    without = {"content": "x", "stop_reason": "tool_use"}
    assert parse_action(json.dumps(without)).stop_reason == "stop"
    truncated = {"content": "x", "stop_reason": "MAX_TOKENS"}
    assert parse_action(json.dumps(truncated)).stop_reason == "length"


def test_bounds() -> None:
    limits = ActionLimits(max_chars=100, max_depth=4, max_tool_calls=1, max_trace=2)
    with pytest.raises(InvalidAction, match="over the limit of 100"):
        parse_action("x" * 101, limits=limits)
    deep = '{"content": "", "usage": {"a": {"b": {"c": {"d": 1}}}}}'
    with pytest.raises(InvalidAction, match="deeper than 4"):
        parse_action(deep, limits=limits)
    with pytest.raises(InvalidAction, match="nested too deeply"):
        parse_action('{"content": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(InvalidAction, match="NaN"):
        parse_action(
            '{"tool_calls": [{"name": "add", "arguments": {"a": NaN}}]}', tool_names={"add"}
        )
    with pytest.raises(InvalidAction, match="over the limit of 1"):
        parse_action(
            '{"tool_calls": [{"name": "a"}, {"name": "a"}]}', tool_names={"a"}, limits=limits
        )
    with pytest.raises(InvalidAction, match="over the limit of 2"):
        parse_action('{"content": "", "token_ids": [1, 2, 3]}', limits=limits)


@given(
    st.text(max_size=200)
    | JSON.map(json.dumps)
    | st.builds(
        lambda d: json.dumps({"content": "", **d}),
        st.dictionaries(
            st.sampled_from(
                ["tool_calls", "content", "stop_reason", "usage", "token_ids", "logprobs"]
            ),
            JSON,
            max_size=3,
        ),
    )
)
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_action_is_a_completion_or_invalid(action: str) -> None:
    try:
        completion = parse_action(action, tool_names={"add"})
    except InvalidAction as exc:
        assert str(exc)
    else:
        json.dumps(completion.to_dict())


# -- answers: the round trip -------------------------------------------------------------------

NAMES = st.sampled_from(["add", "mcp__env__add", "env_add", "lookup"])
ARGS = st.dictionaries(
    st.text(min_size=1, max_size=6),
    st.integers() | st.text(max_size=10) | st.booleans() | st.none(),
    max_size=3,
)
CALLS = st.lists(st.tuples(NAMES, ARGS), max_size=3)


@given(
    api=st.sampled_from(APIS),
    stream=st.booleans(),
    content=st.text(max_size=40),
    calls=CALLS,
    keepalives=st.integers(0, 2),
)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_round_trip(
    api: str, stream: bool, content: str, calls: list[tuple[str, Any]], keepalives: int
) -> None:
    request = make_request(api, ["add", "mcp__env__add", "env_add", "lookup"], stream)
    obs = request.observation()
    assert obs["stream"] is stream and obs["messages"][-1] == {"role": "user", "content": "hi"}
    action = json.dumps(
        {"content": content, "tool_calls": [{"name": n, "arguments": a} for n, a in calls]}
    )
    completion = parse_action(action, api=api, tool_names=request.tool_names)
    writer = AnswerWriter(request)
    data = writer.head() + writer.keepalive() * keepalives + writer.body(completion)
    assert writer.content_type == ("text/event-stream" if stream else "application/json")
    record = read_back(request, writer.content_type, data)
    assert record["text"] == content
    got = [(c["id"], c["name"], json.loads(c["arguments"])) for c in record["tool_calls"]]
    assert got == [(c.id, c.name, c.arguments) for c in completion.tool_calls]
    # The next request carries the answer as its history: chat_format reads it back alike.
    *_, answer = exchange_messages(record)
    assert answer["content"] == content
    assert [c["function"]["name"] for c in answer["tool_calls"]] == [n for n, _ in calls]
    assert record["usage"]  # every API's answer carries usage
    expected_stop = {
        "anthropic": "tool_use" if calls else "end_turn",
        "responses": "completed",
        "chat": "tool_calls" if calls else "stop",
        "gemini": "STOP",
    }[api]
    assert record["stop_reason"] == expected_stop


@pytest.mark.parametrize("api", APIS)
def test_stream_event_names_and_order(api: str) -> None:
    request = make_request(api, ["add"], stream=True)
    action = '{"content": "hi", "tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 1}}]}'
    completion = parse_action(action, api=api, tool_names=request.tool_names)
    writer = AnswerWriter(request)
    head, ping, body = writer.head(), writer.keepalive(), writer.body(completion)
    events = parse_sse(head + ping + body)
    names = [e.event for e in events]
    if api == "anthropic":
        assert ping == b'event: ping\ndata: {"type": "ping"}\n\n'
        assert names == [
            "message_start", "ping",
            "content_block_start", "content_block_delta", "content_block_stop",
            "content_block_start", "content_block_delta", "content_block_stop",
            "message_delta", "message_stop",
        ]  # fmt: skip
        assert json.loads(events[5].data)["content_block"]["id"] == "c1"
    elif api == "responses":
        assert ping == b": keep-alive\n\n"
        assert names[:2] == ["response.created", "response.in_progress"]
        assert names[-1] == "response.completed"
        seqs = [json.loads(e.data)["sequence_number"] for e in events]
        assert seqs == list(range(len(events)))
        assert all(json.loads(e.data)["type"] == e.event for e in events)
    elif api == "chat":
        assert events[-1].data == "[DONE]" and set(names) == {""}
        chunks = [json.loads(e.data) for e in events[:-1]]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert chunks[-1]["usage"]["total_tokens"] > 0  # include_usage was asked
        assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    else:
        assert head == b"" and ping == b"\n" and len(events) == 1
        part = json.loads(events[0].data)["candidates"][0]["content"]["parts"][1]
        assert part == {"functionCall": {"id": "c1", "name": "add", "args": {"a": 1}}}


def test_gemini_stream_without_sse_is_a_json_array() -> None:
    path, _, body = make_body("gemini", ["add"], stream=True)
    request = read_request(path, json.dumps(body).encode())  # no alt=sse
    assert request is not None and request.stream and not request.sse
    writer = AnswerWriter(request)
    assert writer.content_type == "application/json" and writer.keepalive() == b""
    chunks = json.loads(writer.head() + writer.body(Completion(content="yo")))
    assert chunks[0]["candidates"][0]["content"]["parts"] == [{"text": "yo"}]


def stop_of(api: str, body: dict[str, Any]) -> Any:
    if api == "anthropic":
        return body["stop_reason"]
    if api == "responses":
        return body["status"], (body["incomplete_details"] or {}).get("reason")
    if api == "chat":
        return body["choices"][0]["finish_reason"]
    return body["candidates"][0]["finishReason"]


@pytest.mark.parametrize("api", APIS)
def test_stop_reasons_in_each_api(api: str) -> None:
    request = make_request(api, [], stream=False)
    spelled = {}
    for reason in ("stop", "length", "content_filter"):
        _, data = encode_answer(request, Completion(content="x", stop_reason=reason))
        spelled[reason] = stop_of(api, json.loads(data))
    assert (
        spelled
        == {
            "anthropic": {"stop": "end_turn", "length": "max_tokens", "content_filter": "refusal"},
            "responses": {
                "stop": ("completed", None),
                "length": ("incomplete", "max_output_tokens"),
                "content_filter": ("incomplete", "content_filter"),
            },
            "chat": {"stop": "stop", "length": "length", "content_filter": "content_filter"},
            "gemini": {"stop": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY"},
        }[api]
    )


def test_policy_trace_never_reaches_the_wire() -> None:
    request = make_request("chat", ["add"], stream=True)
    action = {"content": "hi", "token_ids": [987654321], "logprobs": [-3.25], "usage": {"x": 7}}
    _, data = encode_answer(request, parse_action(json.dumps(action)))
    assert b"987654321" not in data and b"-3.25" not in data


@pytest.mark.parametrize("api", APIS)
def test_error_bodies_and_failed_streams(api: str) -> None:
    body = error_body(api, 500, "policy failed")
    assert "policy failed" in json.dumps(body)
    writer = AnswerWriter(make_request(api, [], stream=True))
    (event,) = parse_sse(writer.fail("policy failed"))
    assert "policy failed" in event.data
    assert event.event == {"anthropic": "error", "responses": "response.failed"}.get(api, "")
    record = read_back(writer.request, "text/event-stream", writer.head() + writer.fail("x"))
    assert record["text"] == "" and record["tool_calls"] == []
    if api in ("anthropic", "responses"):  # the capture parser sees the failure too
        assert record["stop_reason"] in ("error", "failed")
    unstreamed = AnswerWriter(make_request(api, [], stream=False))
    assert json.loads(unstreamed.fail("policy failed")) == body
