"""exchange_messages / exchange_tools: one conversation in four wire APIs reads back the same."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.model_server import ScriptedModelServer

from gym_harness.capture.proxy import ModelProxy
from gym_harness.records.chat_format import exchange_messages, exchange_tools

APIS = ("chat", "responses", "anthropic", "gemini")
Msg = dict[str, Any]


def assistant(text: str, calls: list[tuple[str, str, str]]) -> Msg:
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {"type": "function", "id": i, "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ],
    }


def tool(call_id: str, name: str, content: str) -> Msg:
    return {"role": "tool", "content": content, "tool_call_id": call_id, "name": name}


def calls_of(msg: Msg) -> list[tuple[str, str, str]]:
    return [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]]


# -- render a canonical conversation in each wire API (what a harness would send) -------------


def render(api: str, messages: list[Msg]) -> dict[str, Any]:
    system = [m["content"] for m in messages if m["role"] == "system"]
    rest = [m for m in messages if m["role"] != "system"]
    return {"model": "m", **RENDER[api](system[0] if system else None, rest)}


def render_chat(system: str | None, msgs: list[Msg]) -> dict[str, Any]:
    out: list[Msg] = [{"role": "system", "content": system}] if system is not None else []
    for m in msgs:
        if m["role"] == "assistant":
            entry: Msg = {"role": "assistant", "content": m["content"] or None}
            if m["tool_calls"]:
                entry["tool_calls"] = m["tool_calls"]
            out.append(entry)
        elif m["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": m["content"]})
        else:
            out.append({"role": "user", "content": [{"type": "text", "text": m["content"]}]})
    return {"messages": out}


def render_responses(system: str | None, msgs: list[Msg]) -> dict[str, Any]:
    items: list[Msg] = []
    for m in msgs:
        if m["role"] == "assistant":
            if m["content"]:
                part = {"type": "output_text", "text": m["content"]}
                items.append({"type": "message", "role": "assistant", "content": [part]})
            items += [
                {"type": "function_call", "call_id": i, "name": n, "arguments": a}
                for i, n, a in calls_of(m)
            ]
        elif m["role"] == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m["tool_call_id"],
                    "output": m["content"],
                }
            )
        else:
            items.append(
                {"role": "user", "content": [{"type": "input_text", "text": m["content"]}]}
            )
    return {"input": items, **({"instructions": system} if system is not None else {})}


def render_anthropic(system: str | None, msgs: list[Msg]) -> dict[str, Any]:
    out: list[Msg] = []
    for m in msgs:
        if m["role"] == "assistant":
            blocks = [{"type": "text", "text": m["content"]}] if m["content"] else []
            blocks += [
                {"type": "tool_use", "id": i, "name": n, "input": json.loads(a)}
                for i, n, a in calls_of(m)
            ]
            out.append({"role": "assistant", "content": blocks})
            continue
        if m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"]}
            block["content"] = [{"type": "text", "text": m["content"]}]
        else:
            block = {"type": "text", "text": m["content"]}
        if out and out[-1]["content"][-1]["type"] == "tool_result":  # results + text: one message
            out[-1]["content"].append(block)
        else:
            out.append({"role": "user", "content": [block]})
    return {"messages": out, **({"system": [{"type": "text", "text": system}]} if system else {})}


def render_gemini(system: str | None, msgs: list[Msg]) -> dict[str, Any]:
    contents: list[Msg] = []
    for m in msgs:
        if m["role"] == "assistant":
            parts: list[Msg] = [{"text": m["content"]}] if m["content"] else []
            parts += [
                {"functionCall": {"id": i, "name": n, "args": json.loads(a)}}
                for i, n, a in calls_of(m)
            ]
            contents.append({"role": "model", "parts": parts})
            continue
        if m["role"] == "tool":
            response = {"id": m["tool_call_id"], "name": m["name"]}
            part: Msg = {"functionResponse": {**response, "response": {"output": m["content"]}}}
        else:
            part = {"text": m["content"]}
        if contents and "functionResponse" in contents[-1]["parts"][-1]:
            contents[-1]["parts"].append(part)
        else:
            contents.append({"role": "user", "parts": [part]})
    extra = {"systemInstruction": {"parts": [{"text": system}]}} if system is not None else {}
    return {"contents": contents, **extra}


RENDER = {
    "chat": render_chat,
    "responses": render_responses,
    "anthropic": render_anthropic,
    "gemini": render_gemini,
}

# -- canonical conversations ------------------------------------------------------------------

texts = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=12)
arguments = st.dictionaries(
    st.text("abcxyz", min_size=1, max_size=4), st.integers() | st.text(max_size=4), max_size=3
).map(json.dumps)
calls = st.lists(st.tuples(st.sampled_from(["add", "echo", "read"]), arguments), min_size=1)
rounds = st.lists(st.tuples(st.text(max_size=8), calls.map(lambda c: c[:3]), st.data()), max_size=2)


@st.composite
def conversations(draw: st.DrawFn) -> list[Msg]:
    out: list[Msg] = []
    if draw(st.booleans()):
        out.append({"role": "system", "content": draw(texts)})
    ids = iter(f"call-{n}" for n in range(1000))
    for _ in range(draw(st.integers(1, 3))):
        out.append({"role": "user", "content": draw(texts)})
        for text, wanted, data in draw(rounds):
            made = [(next(ids), name, args) for name, args in wanted]
            out.append(assistant(text, made))
            out += [tool(i, n, data.draw(texts)) for i, n, _ in made]
        if draw(st.booleans()):
            out.append(assistant(draw(texts), []))
    if out[-1]["role"] == "assistant":
        out.append({"role": "user", "content": draw(texts)})
    return out


@pytest.mark.parametrize("api", APIS)
@given(conversation=conversations(), answer_text=st.text(max_size=8), answer_calls=calls)
def test_every_api_reads_back_the_conversation(
    api: str, conversation: list[Msg], answer_text: str, answer_calls: list[tuple[str, str]]
) -> None:
    answer = [("ans-" + str(k), name, args) for k, (name, args) in enumerate(answer_calls)]
    raw = {
        "api": api,
        "request": render(api, conversation),
        "outcome": "ok",
        "text": answer_text,
        "tool_calls": [{"id": i, "name": n, "arguments": a} for i, n, a in answer],
    }
    assert exchange_messages(raw) == [*conversation, assistant(answer_text, answer)]
    # JSON-ready, and what went in survives a JSON round trip
    assert json.loads(json.dumps(exchange_messages(raw))) == exchange_messages(raw)


def test_failed_exchange_has_no_answer_and_other_apis_no_messages() -> None:
    request = {"messages": [{"role": "user", "content": "hi"}]}
    raw = {"api": "chat", "request": request, "text": "partial", "tool_calls": []}
    assert exchange_messages({**raw, "outcome": "dropped"}) == [{"role": "user", "content": "hi"}]
    assert exchange_messages({**raw, "outcome": "ok"})[-1] == assistant("partial", [])
    assert exchange_messages({**raw, "api": "other"}) == []
    assert exchange_messages({"api": "chat", "request": None, "outcome": "refused"}) == []


def test_gemini_without_ids_pairs_results_by_name_in_order() -> None:
    def fc(name: str, n: int) -> Msg:
        return {"functionCall": {"name": name, "args": {"n": n}}}

    def fr(name: str, out: str) -> Msg:
        return {"functionResponse": {"name": name, "response": {"result": out}}}

    request = {
        "contents": [
            {"role": "user", "parts": [{"text": "go"}]},
            {"role": "model", "parts": [fc("add", 1), fc("echo", 2), fc("add", 3)]},
            {"role": "user", "parts": [fr("add", "one"), fr("echo", "two"), fr("add", "three")]},
        ]
    }
    raw = {"api": "gemini", "request": request, "outcome": "ok", "text": "", "tool_calls": []}
    raw["tool_calls"] = [{"id": "", "name": "add", "arguments": "{}"}]
    got = exchange_messages(raw)
    assert calls_of(got[1]) == [
        ("call_0", "add", '{"n": 1}'),
        ("call_1", "echo", '{"n": 2}'),
        ("call_2", "add", '{"n": 3}'),
    ]
    assert [(m["tool_call_id"], m["content"]) for m in got[2:5]] == [
        ("call_0", "one"),
        ("call_1", "two"),
        ("call_2", "three"),
    ]
    assert calls_of(got[-1]) == [("call_3", "add", "{}")]


# -- real exchanges: the scripted model server behind the proxy -------------------------------

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
TOOLS = {
    "chat": [{"type": "function", "function": {"name": "env_add", "parameters": SCHEMA}}],
    "responses": [{"type": "function", "name": "env_add", "parameters": SCHEMA}],
    "anthropic": [{"name": "env_add", "description": "Add.", "input_schema": SCHEMA}],
    "gemini": [{"functionDeclarations": [{"name": "env_add", "parameters": SCHEMA}]}],
}
PATHS = {
    "chat": ("/v1/chat/completions", "authorization"),
    "responses": ("/v1/responses", "authorization"),
    "anthropic": ("/v1/messages", "x-api-key"),
    "gemini": ("/v1beta/models/g:streamGenerateContent?alt=sse", "x-goog-api-key"),
}


@pytest.fixture
def proxied() -> Iterator[tuple[ScriptedModelServer, ModelProxy]]:
    with (
        ScriptedModelServer(tool="add", arguments={"a": 2}) as srv,
        ModelProxy(srv.base_url, api_key="k", timeout_s=5) as proxy,
    ):
        yield srv, proxy


@pytest.mark.parametrize("api", APIS)
def test_recorded_exchanges_become_messages_and_tools(
    proxied: tuple[ScriptedModelServer, ModelProxy], api: str
) -> None:
    srv, proxy = proxied
    path, header = PATHS[api]
    token = f"Bearer {proxy.token}" if header == "authorization" else proxy.token
    convo: list[Msg] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "add"},
    ]
    body = {**render(api, convo), "stream": True, "tools": TOOLS[api]}
    with httpx.Client(base_url=proxy.base_url, timeout=10, headers={header: token}) as client:
        assert client.post(path, json=body).status_code == 200
        (first,) = proxy.drain()
        messages = exchange_messages(first.to_dict())
        assert messages[:2] == convo
        (call,) = messages[2]["tool_calls"]
        assert call["function"]["name"] == "env_add"
        assert json.loads(call["function"]["arguments"]) == {"a": 2}
        # feed the call and its result back: the model's text answer closes the exchange
        follow = [*messages, tool(call["id"], "env_add", "5")]
        body = {**render(api, follow), "stream": False, "tools": TOOLS[api]}
        body_path = path.replace(":streamGenerateContent?alt=sse", ":generateContent")
        assert client.post(body_path, json=body).status_code == 200
        (second,) = proxy.drain()
    assert exchange_messages(second.to_dict()) == [
        *follow,
        assistant("tool said: 5; you said: add", []),
    ]
    assert srv.requests()[-1].body == second.request
    (schema,) = exchange_tools(second.to_dict())
    assert schema["function"]["name"] == "env_add" and schema["function"]["parameters"] == SCHEMA


def test_rows_load_as_a_datasets_table(proxied: tuple[ScriptedModelServer, ModelProxy]) -> None:
    datasets = pytest.importorskip("datasets")
    _, proxy = proxied
    rows = []
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        for api in APIS:
            path, header = PATHS[api]
            token = f"Bearer {proxy.token}" if header == "authorization" else proxy.token
            convo = [{"role": "user", "content": f"hello {api}"}]
            body = {**render(api, convo), "stream": True, "tools": TOOLS[api]}
            client.post(path, json=body, headers={header: token})
    for record in proxy.drain():
        raw = record.to_dict()
        rows.append({"messages": exchange_messages(raw), "tools": exchange_tools(raw)})
    table = datasets.Dataset.from_list(rows)
    assert table.num_rows == 4
    for row, expected in zip(table, rows, strict=True):
        for got, want in zip(row["messages"], expected["messages"], strict=True):
            assert {k: v for k, v in got.items() if v is not None} == want
