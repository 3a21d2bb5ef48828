"""ModelProxy in front of the scripted model server: pass-through, records, keys, faults."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import h11
import httpx2 as httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.model_server import Drop, Fail, ScriptedModelServer, Stall, token_id
from support.raw_upstream import RawUpstream

from gym_harness.capture.proxy import ModelExchange, ModelProxy, SSEEvent, parse_sse
from gym_harness.capture.upstream import UpstreamDropped, _Body
from gym_harness.errors import CaptureError
from gym_harness.lifecycle import Lifecycle
from gym_harness.records.chat_format import exchange_records
from gym_harness.records.events import EventType

ADD = {"a": 2, "b": 3}
REAL_KEY = "sk-real-upstream-key"


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
    assert proxy.state is Lifecycle.NEW and REAL_KEY not in repr(proxy)
    with pytest.raises(CaptureError):
        _ = proxy.base_url
    proxy.start()
    proxy.start()
    assert proxy.state is Lifecycle.RUNNING
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
    assert proxy.state is Lifecycle.STOPPED and errors
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


@pytest.mark.parametrize("api", ["chat", "anthropic"])
def test_exchange_becomes_a_request_and_response_event_pair(
    proxy: ModelProxy, client: httpx.Client, api: str
) -> None:
    path, header, body = requests_for(True)[api]
    client.post(path, json=body, headers=auth(proxy, header))
    (record,) = proxy.drain()
    request, response = record.to_events()
    assert (request.type, response.type) == (EventType.LLM_REQUEST, EventType.LLM_RESPONSE)
    assert request.timestamp == record.started_at
    assert response.timestamp == record.started_at + record.total_s
    assert set(request.data) == {"seq", "api", "method", "path", "request", "request_text"}
    assert request.data["request"] == body and request.data["api"] == api
    assert request.data["seq"] == response.data["seq"] == record.seq
    assert set(request.data) | set(response.data) == set(ModelExchange.__dataclass_fields__)
    assert exchange_records([request.to_dict(), response.to_dict()]) == [record.to_dict()]


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


@pytest.fixture
def raw_upstream() -> Iterator[RawUpstream]:
    upstream = RawUpstream()
    try:
        yield upstream
    finally:
        upstream.stop()


SSE = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\ndata: [DONE]\n\n'
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"


def chunked(body: bytes, size: int) -> bytes:
    """``body`` in chunked transfer coding, ``size`` bytes a chunk, with an extension and a
    trailer (both legal, both dropped on the way to the harness)."""
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\nX-T: 1\r\n\r\n"


def split_every(data: bytes, n: int) -> list[bytes]:
    return [data[i : i + n] for i in range(0, len(data), n)]


# name: (the upstream's answer, in pieces; it closes the connection after it)
FRAMINGS: dict[str, tuple[list[bytes], bool]] = {
    "chunked, split inside sizes and data": (
        split_every(SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(SSE, 7), 5),
        False,
    ),
    "content-length, split": (
        split_every(SSE_HEAD + b"Content-Length: %d\r\n\r\n" % len(SSE) + SSE, 9),
        False,
    ),
    "informational answers first": (
        [
            b"HTTP/1.1 100 Continue\r\n\r\n",
            b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
            SSE_HEAD + b"Content-Length: %d\r\n\r\n" % len(SSE) + SSE,
        ],
        False,
    ),
    "close-delimited": ([SSE_HEAD + b"Connection: close\r\n\r\n", *split_every(SSE, 11)], True),
}


@pytest.mark.parametrize("framing", list(FRAMINGS))
def test_upstream_framings_reach_harness_intact(raw_upstream: RawUpstream, framing: str) -> None:
    pieces, close = FRAMINGS[framing]
    raw_upstream.answers = [(pieces, close), (pieces, close)]
    upstream = f"http://127.0.0.1:{raw_upstream.port}/api"
    with (
        ModelProxy(upstream, api_key=REAL_KEY, timeout_s=5) as proxy,
        httpx.Client(base_url=proxy.base_url, timeout=10) as client,
    ):
        headers = auth(proxy, "authorization")
        seen = [
            client.post("/v1/chat/completions?x=1", json={"stream": True}, headers=headers)
            for _ in range(2)
        ]
        records = proxy.drain()
    assert [s.content for s in seen] == [SSE, SSE]
    assert [(r.outcome, r.status, r.text) for r in records] == [("ok", 200, "hi")] * 2
    assert all(r.events == parse_sse(SSE) for r in records)
    for head in raw_upstream.heads:  # the path prefix is kept, Host names the upstream
        assert head.startswith(b"POST /api/v1/chat/completions?x=1 HTTP/1.1\r\n")
        assert f"host: 127.0.0.1:{raw_upstream.port}\r\n".encode() in head.lower()
        assert f"authorization: Bearer {REAL_KEY}".encode() in head
    # a kept-alive connection is reused; one the upstream closed is not
    assert raw_upstream.connections == (2 if close else 1)


def test_head_answer_has_no_body_and_keeps_the_connection(raw_upstream: RawUpstream) -> None:
    head_only = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\n"
    raw_upstream.answers = [([head_only], False), ([head_only + b"0123456789"], False)]
    with (
        ModelProxy(f"http://127.0.0.1:{raw_upstream.port}", api_key=REAL_KEY, timeout_s=5) as proxy,
        httpx.Client(base_url=proxy.base_url, timeout=10) as client,
    ):
        assert client.head("/").status_code == 200
        assert client.get("/a%20b", headers=auth(proxy, "authorization")).text == "0123456789"
        records = proxy.drain()
    assert [(r.method, r.outcome, r.body) for r in records] == [
        ("HEAD", "ok", ""),
        ("GET", "ok", "0123456789"),
    ]
    assert raw_upstream.heads[1].startswith(b"GET /a%20b HTTP/1.1\r\n")  # not re-encoded
    assert raw_upstream.connections == 1


def test_an_answer_that_is_not_http_is_dropped(raw_upstream: RawUpstream) -> None:
    raw_upstream.answers = [([b"SSH-2.0-OpenSSH_9.6\r\n\r\n"], True)]
    with (
        ModelProxy(f"http://127.0.0.1:{raw_upstream.port}", api_key=REAL_KEY, timeout_s=5) as proxy,
        httpx.Client(base_url=proxy.base_url, timeout=10) as client,
    ):
        path, header, body = requests_for(False)["chat"]
        resp = client.post(path, json=body, headers=auth(proxy, header))
        (record,) = proxy.drain()
    assert resp.status_code == 502 and record.outcome == "dropped"
    assert "closed without answering" in record.error and "broken HTTP" in record.error


def decode_chunked(wire: bytes, cuts: list[int]) -> tuple[bytes, _Body]:
    """Feed ``wire`` (a chunked answer's body) to the proxy's decoder, cut at ``cuts``."""
    head = h11.Response(status_code=200, headers=[("transfer-encoding", "chunked")])
    body, out, start = _Body("POST", head), [], 0
    for end in [*sorted(set(cuts)), len(wire)]:
        out.append(body.feed(wire[start:end]))
        start = end
    return b"".join(out), body


@given(
    st.lists(st.binary(min_size=1, max_size=40), max_size=6),
    st.lists(st.integers(0, 400), max_size=12),
    st.booleans(),
)
def test_chunked_decoding_survives_any_split(
    pieces: list[bytes], cuts: list[int], extras: bool
) -> None:
    ext, trailer = (b";name=v", b"X-T: 1\r\n") if extras else (b"", b"")
    wire = b"".join(b"%x%s\r\n%s\r\n" % (len(p), ext, p) for p in pieces)
    wire += b"0%s\r\n%s\r\n" % (ext, trailer)
    decoded, body = decode_chunked(wire, [c for c in cuts if c < len(wire)])
    assert decoded == b"".join(pieces) and body.done and body.clean
    _, over = decode_chunked(wire + b"HTTP/1.1 200 OK\r\n", [])  # bytes past the end
    assert over.done and not over.clean


@pytest.mark.parametrize(
    "wire", [b"x\r\n", b"+5\r\nhello\r\n", b"0x5\r\nhello\r\n", b"5\r\nhelloXX", b"1_0\r\n"]
)
def test_broken_chunked_framing_is_refused(wire: bytes) -> None:
    with pytest.raises(UpstreamDropped, match="broken HTTP"):
        decode_chunked(wire, [])


def test_an_unfinished_body_is_dropped_at_eof() -> None:
    _, body = decode_chunked(b"5\r\nhel", [])
    with pytest.raises(UpstreamDropped, match="before the answer ended"):
        body.end()
    counted = _Body("POST", h11.Response(status_code=200, headers=[("content-length", "3")]))
    assert counted.feed(b"ab") == b"ab" and not counted.done
    assert counted.feed(b"cd") == b"c" and counted.done and not counted.clean
