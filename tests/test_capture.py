"""ModelProxy in front of the scripted model server: pass-through, records, keys, faults."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from model_server import Drop, Fail, ScriptedModelServer, Stall, token_id

from gym_harness.capture import ModelExchange, ModelProxy, ProxyState, SSEEvent, parse_sse
from gym_harness.errors import CaptureError

ADD = {"a": 2, "b": 3}
REAL_KEY = "sk-real-upstream-key"


@pytest.fixture
def srv() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(tool="add", arguments=ADD) as server:
        yield server


@pytest.fixture
def proxy(srv: ScriptedModelServer) -> Iterator[ModelProxy]:
    with ModelProxy(srv.base_url, api_key=REAL_KEY, timeout_s=5) as p:
        yield p


@pytest.fixture
def client(proxy: ModelProxy) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy.base_url, timeout=10) as c:
        yield c


def sse_events(text: str) -> tuple[SSEEvent, ...]:
    return parse_sse(text.encode())


# One request per wire API: (path, auth header name, body); each offers the tool "…add".
def requests_for(stream: bool) -> dict[str, tuple[str, str, dict[str, Any]]]:
    user = "please add"
    return {
        "chat": (
            "/v1/chat/completions",
            "authorization",
            {
                "model": "m",
                "stream": stream,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": user}],
                "tools": [{"type": "function", "function": {"name": "env_add"}}],
            },
        ),
        "responses": (
            "/v1/responses",
            "authorization",
            {
                "model": "m",
                "stream": stream,
                "input": user,
                "tools": [{"type": "function", "name": "mcp__env__add"}],
            },
        ),
        "anthropic": (
            "/v1/messages",
            "x-api-key",
            {
                "model": "m",
                "stream": stream,
                "messages": [{"role": "user", "content": user}],
                "tools": [{"name": "mcp__env__add"}],
            },
        ),
        "gemini": (
            "/v1beta/models/g:streamGenerateContent?alt=sse"
            if stream
            else "/v1beta/models/g:generateContent",
            "x-goog-api-key",
            {
                "contents": [{"role": "user", "parts": [{"text": user}]}],
                "tools": [{"functionDeclarations": [{"name": "add"}]}],
            },
        ),
    }


def auth(proxy: ModelProxy, header: str) -> dict[str, str]:
    value = f"Bearer {proxy.token}" if header == "authorization" else proxy.token
    return {header: value}


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("api", ["chat", "responses", "anthropic", "gemini"])
def test_pass_through_records_tool_call_then_text(
    srv: ScriptedModelServer, proxy: ModelProxy, client: httpx.Client, api: str, stream: bool
) -> None:
    path, header, body = requests_for(stream)[api]
    first = client.post(path, json=body, headers=auth(proxy, header))
    srv.script()  # no tool now: the next answer is text
    second = client.post(path, json=body, headers=auth(proxy, header))
    assert first.status_code == second.status_code == 200

    call, text = proxy.drain()
    assert proxy.records() == []
    for record, seen in ((call, first), (text, second)):
        assert (record.api, record.outcome, record.status, record.streamed) == (
            api,
            "ok",
            200,
            stream,
        )
        assert record.request == json.loads(srv.requests()[record.seq - 1].raw)
        if stream:  # what the harness got is what was recorded, event for event
            assert record.events == sse_events(seen.text) and record.body == ""
        else:
            assert record.body == seen.text and record.events == ()
        assert record.ttfb_s is not None and 0 < record.ttfb_s <= record.total_s
        assert record.usage
    assert [(c.name.endswith("add"), json.loads(c.arguments)) for c in call.tool_calls] == [
        (True, ADD)
    ]
    assert call.text == ""
    assert text.text == "you said: please add" and text.tool_calls == ()
    stops = {"chat": "stop", "responses": "completed", "anthropic": "end_turn", "gemini": "STOP"}
    assert text.stop_reason == stops[api]


@pytest.mark.parametrize("stream", [True, False])
def test_logprobs_requested_and_recorded(srv: ScriptedModelServer, stream: bool) -> None:
    with (
        ModelProxy(srv.base_url, api_key=REAL_KEY, request_logprobs=True, timeout_s=5) as proxy,
        httpx.Client(base_url=proxy.base_url, timeout=10) as client,
    ):
        body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "x y"}]}
        headers = auth(proxy, "authorization")
        seen = client.post(
            "/v1/chat/completions", json={**body, "return_token_ids": True}, headers=headers
        )
        (record,) = proxy.drain()
    upstream = srv.requests()[-1].body
    assert upstream["logprobs"] is True and record.logprobs_added and record.request == upstream
    pieces = ["you", " said:", " x", " y"]
    assert [lp.token for lp in record.logprobs] == pieces
    assert [lp.token_id for lp in record.logprobs] == [token_id(p) for p in pieces]
    assert list(record.token_ids) == [token_id(p) for p in pieces]
    assert all(lp.logprob <= 0 for lp in record.logprobs)
    if stream:
        assert record.events == sse_events(seen.text)


def test_no_logprobs_unless_asked(
    srv: ScriptedModelServer, proxy: ModelProxy, client: httpx.Client
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    client.post("/v1/chat/completions", json=body, headers=auth(proxy, "authorization"))
    (record,) = proxy.drain()
    assert "logprobs" not in srv.requests()[-1].body and record.logprobs == ()
    assert not record.logprobs_added


def test_real_key_replaces_the_proxy_token(
    srv: ScriptedModelServer, proxy: ModelProxy, client: httpx.Client
) -> None:
    for api, (path, header, body) in requests_for(stream=True).items():
        assert client.post(path, json=body, headers=auth(proxy, header)).status_code == 200, api
    gem_path = "/v1beta/models/g:generateContent?key=" + proxy.token
    assert client.post(gem_path, json=requests_for(False)["gemini"][2]).status_code == 200
    logged = srv.requests()
    assert [r.headers.get("authorization") for r in logged[:2]] == [f"Bearer {REAL_KEY}"] * 2
    assert logged[2].headers["x-api-key"] == REAL_KEY
    assert logged[3].headers["x-goog-api-key"] == REAL_KEY
    assert logged[4].query == f"key={REAL_KEY}"
    for r in logged:
        assert proxy.token not in json.dumps(r.headers) + r.query


def test_wrong_or_old_token_is_refused_and_not_forwarded(
    srv: ScriptedModelServer, proxy: ModelProxy, client: httpx.Client
) -> None:
    path, header, body = requests_for(False)["anthropic"]
    old = auth(proxy, header)
    proxy.rotate_token()
    for headers in (old, {header: "guess"}, {}):
        resp = client.post(path, json=body, headers=headers)
        assert resp.status_code == 401 and "proxy token" in resp.text
    assert client.post(path, json=body, headers=auth(proxy, header)).status_code == 200
    assert len(srv.requests()) == 1
    assert [r.outcome for r in proxy.drain()] == ["unauthorized"] * 3 + ["ok"]
    assert client.head("/").status_code == 200  # a probe without any key still gets through
    assert "x-api-key" not in srv.requests()[-1].headers


def test_no_api_key_sends_no_credential(srv: ScriptedModelServer) -> None:
    with ModelProxy(srv.base_url, api_key=None) as proxy, httpx.Client(timeout=10) as client:
        path, header, body = requests_for(False)["chat"]
        client.post(proxy.base_url + path, json=body, headers=auth(proxy, header))
    assert "authorization" not in srv.requests()[-1].headers


@pytest.mark.parametrize("stream", [True, False])
def test_refusal_passes_through_unchanged(
    srv: ScriptedModelServer, proxy: ModelProxy, client: httpx.Client, stream: bool
) -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    srv.enqueue(Fail(529, error))
    path, header, body = requests_for(stream)["anthropic"]
    resp = client.post(path, json=body, headers=auth(proxy, header))
    assert (resp.status_code, resp.json()) == (529, error)
    (record,) = proxy.drain()
    assert (record.outcome, record.status, json.loads(record.body)) == ("refused", 529, error)


@pytest.mark.parametrize("api", ["chat", "anthropic", "responses", "gemini"])
def test_drop_mid_stream_reaches_the_harness(
    srv: ScriptedModelServer, proxy: ModelProxy, client: httpx.Client, api: str
) -> None:
    srv.script()  # text answers: several events in every API
    srv.enqueue(Drop(after=1))
    path, header, body = requests_for(True)[api]
    received: list[bytes] = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        client.stream("POST", path, json=body, headers=auth(proxy, header)) as resp,
    ):
        received.extend(resp.iter_bytes())
    (record,) = proxy.drain()
    assert record.outcome == "dropped" and "broke" in record.error
    assert record.events == parse_sse(b"".join(received)) and len(record.events) == 1
    assert client.post(path, json=body, headers=auth(proxy, header)).status_code == 200


def test_stall_is_bounded(srv: ScriptedModelServer) -> None:
    with (
        ModelProxy(srv.base_url, api_key=REAL_KEY, timeout_s=0.5) as proxy,
        httpx.Client(base_url=proxy.base_url, timeout=10) as client,
    ):
        path, header, body = requests_for(True)["chat"]
        srv.enqueue(Stall(after=None))
        resp = client.post(path, json=body, headers=auth(proxy, header))
        assert resp.status_code == 504 and "silent" in resp.text
        srv.enqueue(Stall(after=3))
        with pytest.raises(httpx.RemoteProtocolError):
            client.post(path, json=body, headers=auth(proxy, header))
        before, during = proxy.drain()
        srv.release()
    assert (before.outcome, before.status, before.ttfb_s) == ("stalled", 504, None)
    assert (during.outcome, during.status, len(during.events)) == ("stalled", 200, 3)


def test_unreachable_upstream() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once closed
    with ModelProxy(f"http://127.0.0.1:{port}", api_key=REAL_KEY, timeout_s=2) as proxy:
        path, header, body = requests_for(False)["chat"]
        resp = httpx.post(proxy.base_url + path, json=body, headers=auth(proxy, header), timeout=10)
        (record,) = proxy.drain()
    assert resp.status_code == 502 and record.outcome == "unreachable"


def test_lifecycle_is_bounded_and_idempotent(srv: ScriptedModelServer) -> None:
    proxy = ModelProxy(srv.base_url, api_key=REAL_KEY)
    assert proxy.state is ProxyState.UNOPENED and REAL_KEY not in repr(proxy)
    with pytest.raises(CaptureError):
        _ = proxy.base_url
    proxy.start()
    proxy.start()
    assert proxy.state is ProxyState.RUNNING
    srv.enqueue(Stall(after=1))
    path, header, body = requests_for(True)["anthropic"]
    errors: list[Exception] = []

    def call() -> None:
        try:
            httpx.post(proxy.base_url + path, json=body, headers=auth(proxy, header), timeout=10)
        except httpx.HTTPError as exc:
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert srv.wait_stalled(1, timeout=5)
    proxy.stop()  # with an exchange in flight
    proxy.stop()
    caller.join(10)
    srv.release()
    assert proxy.state is ProxyState.CLOSED and errors
    with pytest.raises(CaptureError):
        proxy.start()
    assert not [t for t in threading.enumerate() if t.name == "gym-harness-capture"]
    assert [r.outcome for r in proxy.drain()] == ["cancelled"]
    with pytest.raises(CaptureError):
        ModelProxy("127.0.0.1:80")


def test_record_round_trips_json(proxy: ModelProxy, client: httpx.Client) -> None:
    path, header, body = requests_for(True)["responses"]
    client.post(path, json=body, headers=auth(proxy, header))
    (record,) = proxy.drain()
    data = json.loads(json.dumps(record.to_dict()))
    assert data["tool_calls"][0]["name"] == "mcp__env__add"
    assert data["events"][0]["event"] == "response.created"
    assert set(data) == set(ModelExchange.__dataclass_fields__)


names = st.text(
    st.characters(exclude_characters="\r\n:", exclude_categories=["Cs"]),
    max_size=8,
)
payloads = st.text(
    st.characters(exclude_characters="\r", exclude_categories=["Cs"]),
    max_size=30,
)


@given(st.lists(st.tuples(names.map(str.strip), payloads), max_size=5))
def test_parse_sse_round_trip(events: list[tuple[str, str]]) -> None:
    wire = "".join(
        (f"event: {name}\n" if name else "")
        + "".join(f"data: {line}\n" for line in data.split("\n"))
        + "\n"
        for name, data in events
    )
    assert parse_sse(wire.encode()) == tuple(SSEEvent(n, d) for n, d in events)
