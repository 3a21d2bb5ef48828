"""ModelProxy under abuse: unreadable, huge and secret-leaking exchanges, and body floods.

Every test runs a real proxy on 127.0.0.1 in front of a real upstream (the scripted model
server, or a bare socket server that sends scripted bytes) and a real HTTP client as the
harness. Whatever the harness or the upstream sends, the exchange is recorded, the record
is bounded, and neither the real key nor the proxy token reaches the harness or a record.
"""

from __future__ import annotations

import json
import pickle
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.model_server import Echo, ScriptedModelServer
from support.raw_upstream import RawUpstream

from gym_harness.capture.proxy import (
    DEFAULT_MAX_RECORD_BYTES,
    ModelExchange,
    ModelProxy,
    assemble,
    parse_sse,
)
from gym_harness.capture.secrets import MASK, Redactor
from gym_harness.config import HarnessConfig
from gym_harness.errors import CaptureError, ConfigError
from gym_harness.records.exchanges import MAX_DEPTH

REAL_KEY = "sk-real-upstream-key-0123456789"
CHAT = "/v1/chat/completions"
HI = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
JSON_HI = json.dumps(
    {"choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}
).encode()


@pytest.fixture
def upstream() -> Iterator[RawUpstream]:
    server = RawUpstream()
    try:
        yield server
    finally:
        server.stop()


def json_answer(body: bytes, status: str = "200 OK") -> tuple[list[bytes], bool]:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
    return [head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body], False


def bearer(proxy: ModelProxy) -> dict[str, str]:
    return {"authorization": f"Bearer {proxy.token}"}


def leaks(proxy: ModelProxy, text: str) -> list[str]:
    """Which of the two secrets ``text`` holds."""
    return [name for name, s in (("key", REAL_KEY), ("token", proxy.token)) if s in text]


def record_text(record: ModelExchange) -> str:
    data = record.to_dict()
    assert pickle.loads(pickle.dumps(data)) == data  # a vector env's worker can send it
    return json.dumps(data)


def wait_records(proxy: ModelProxy, count: int) -> list[ModelExchange]:
    deadline = time.monotonic() + 10
    while len(proxy.records()) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return proxy.drain()


# ---------------------------------------------------------------- unreadable exchanges


def test_an_sse_event_nested_5000_deep_is_recorded_unparsed(upstream: RawUpstream) -> None:
    deep = b"data: " + b"[" * 5000 + b"\n\n"
    stream = HI + deep + HI + b"data: [DONE]\n\n"
    upstream.answers = [([SSE_HEAD, stream], True)]
    with (
        ModelProxy(f"http://127.0.0.1:{upstream.port}", api_key=REAL_KEY, timeout_s=5) as proxy,
        httpx.Client(base_url=proxy.base_url, timeout=10) as client,
    ):
        seen = client.post(CHAT, json={"stream": True}, headers=bearer(proxy))
        (record,) = proxy.drain()
    assert seen.content == stream  # the harness gets its answer as sent
    assert (record.outcome, record.status, record.streamed) == ("unparsed", 200, True)
    assert f"nested deeper than {MAX_DEPTH}" in record.error and "part 1" in record.error
    assert record.events == parse_sse(stream) and record.text == "hihi"  # the rest is read
    assert not record.truncated and record.answer_bytes == len(stream)
    record_text(record)


@pytest.mark.parametrize("logprobs", [False, True])
def test_a_request_3000_deep_is_forwarded_and_recorded_unparsed(
    upstream: RawUpstream, logprobs: bool
) -> None:
    body = b'{"model": "m", "messages": [{"role": "user", "content": ' + b"[" * 3000
    body += b"]" * 3000 + b"}]}"
    upstream.answers = [json_answer(JSON_HI)]
    with (
        ModelProxy(
            f"http://127.0.0.1:{upstream.port}", api_key=REAL_KEY, request_logprobs=logprobs
        ) as proxy,
        httpx.Client(base_url=proxy.base_url, timeout=10) as client,
    ):
        seen = client.post(CHAT, content=body, headers=bearer(proxy))
        (record,) = proxy.drain()
    assert seen.status_code == 200 and seen.content == JSON_HI
    assert upstream.bodies == [body]  # went up byte for byte, logprobs or not
    assert (record.outcome, record.request) == ("unparsed", None)
    assert record.request_text == body.decode()
    assert record.error.startswith("request: JSON nested deeper")
    assert record.text == "hi" and record.request_bytes == len(body)
    record_text(record)


def test_a_failed_exchange_keeps_its_outcome_and_says_what_was_unreadable(
    upstream: RawUpstream,
) -> None:
    body = b"[" * 3000 + b"]" * 3000
    upstream.answers = [json_answer(b'{"error": "bad"}', "400 Bad Request")]
    with ModelProxy(f"http://127.0.0.1:{upstream.port}", api_key=REAL_KEY) as proxy:
        httpx.post(proxy.base_url + CHAT, content=body, headers=bearer(proxy), timeout=10)
        (record,) = proxy.drain()
    assert record.outcome == "refused" and "nested deeper" in record.error


nesting = st.recursive(
    st.none() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=20,
)


@given(
    request=st.binary(max_size=200) | nesting.map(lambda v: json.dumps(v).encode()),
    answer=st.binary(max_size=300),
    depth=st.integers(0, 3000),
    sse=st.booleans(),
    path=st.sampled_from([CHAT, "/v1/responses", "/v1/messages", "/m:generateContent", "/x"]),
)
def test_assemble_never_raises(
    request: bytes, answer: bytes, depth: int, sse: bool, path: str
) -> None:
    deep = b"[" * depth + b"]" * (depth // 2)
    raw = b"data: " + deep + b"\n\n" + answer if sse else deep + answer
    record = assemble(
        seq=1,
        method="POST",
        path=path,
        request=deep + request,
        logprobs_added=False,
        status=200,
        outcome="ok",
        error="",
        answer=("text/event-stream" if sse else "application/json", raw),
        started_at=0.0,
        ttfb_s=None,
        total_s=0.0,
    )
    assert record.outcome in ("ok", "unparsed")
    if depth > MAX_DEPTH and path != "/x":
        assert record.outcome == "unparsed" and "nested deeper" in record.error
    record_text(record)


# ---------------------------------------------------------------- bounded records


def test_a_100mb_streamed_answer_reaches_the_harness_whole_and_the_record_capped(
    upstream: RawUpstream,
) -> None:
    event = b'data: {"choices": [{"delta": {"content": "' + b"x" * 65000 + b'"}}]}\n\n'
    count = 100 * 1024 * 1024 // len(event) + 1
    upstream.answers = [([SSE_HEAD, *[event] * count, HI], True)]  # one bytes object, reused
    cap = DEFAULT_MAX_RECORD_BYTES  # a few MiB
    process = psutil.Process()
    peak = [process.memory_info().rss]
    done = threading.Event()

    def sample() -> None:  # the proxy and the harness both live in this process
        while not done.wait(0.02):
            peak.append(process.memory_info().rss)

    sampler = threading.Thread(target=sample)
    sampler.start()
    received, tail = 0, b""
    try:
        with (
            ModelProxy(f"http://127.0.0.1:{upstream.port}") as proxy,
            httpx.Client(base_url=proxy.base_url, timeout=30) as client,
            client.stream("POST", CHAT, json={"stream": True}, headers=bearer(proxy)) as resp,
        ):
            for piece in resp.iter_raw():
                received += len(piece)
                tail = (tail + piece)[-len(HI) :]
            (record,) = proxy.drain()
    finally:
        done.set()
        sampler.join(5)
    total = count * len(event) + len(HI)
    assert received == total and tail == HI
    growth_mb = (max(peak) - peak[0]) / 2**20
    assert growth_mb < 64, f"RSS grew {growth_mb:.0f} MB while relaying 100 MB"
    assert (record.outcome, record.truncated, record.answer_bytes) == ("ok", True, total)
    assert sum(len(e.data) for e in record.events) <= cap and len(record.events) >= 15
    assert len(record_text(record)) < 3 * cap  # the events, and the text read from them


def test_a_large_request_is_recorded_up_to_the_cap(upstream: RawUpstream) -> None:
    content = "y" * 5000
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]})
    upstream.answers = [json_answer(JSON_HI)]
    with ModelProxy(f"http://127.0.0.1:{upstream.port}", max_record_bytes=1000) as proxy:
        resp = httpx.post(proxy.base_url + CHAT, content=body, headers=bearer(proxy), timeout=10)
        (record,) = proxy.drain()
    assert resp.content == JSON_HI and upstream.bodies == [body.encode()]
    assert (record.outcome, record.truncated, record.request) == ("ok", True, None)
    assert record.request_text == body[:1000] and record.request_bytes == len(body)
    assert record.text == "hi"  # the answer was under the cap


# ---------------------------------------------------------------- secrets


def echo(upstream: RawUpstream, earlier: int | None = None) -> Any:
    """An error answer echoing the request's head and body (or an earlier request's body,
    as a stateful upstream might), sent three bytes at a time."""

    def answer(head: bytes, body: bytes) -> tuple[list[bytes], bool]:
        said = body if earlier is None else upstream.bodies[earlier]
        text = b"you sent:\n" + head + b"\n\n" + said
        whole = b"HTTP/1.1 401 Unauthorized\r\nContent-Type: text/plain\r\n"
        echoed = b" | ".join(line for line in head.split(b"\r\n") if REAL_KEY.encode() in line)
        whole += b"X-Echo: " + echoed + b"\r\n"
        whole += b"Content-Length: %d\r\n\r\n" % len(text) + text
        return [whole[i : i + 3] for i in range(0, len(whole), 3)], True

    return answer


def test_an_upstream_echoing_credentials_leaks_nothing(upstream: RawUpstream) -> None:
    # The harness even sends its token upstream in a body; a later answer echoes that body.
    upstream.answers = [echo(upstream), echo(upstream), echo(upstream, earlier=1)]
    with (
        ModelProxy(f"http://127.0.0.1:{upstream.port}", api_key=REAL_KEY) as proxy,
        httpx.Client(base_url=proxy.base_url, timeout=10) as client,
    ):
        body = {"messages": [{"role": "user", "content": "hello"}]}
        seen = [client.post(CHAT, json=body, headers=bearer(proxy))]
        body = {"messages": [{"role": "user", "content": f"my token is {proxy.token}"}]}
        seen.append(client.post(CHAT, json=body, headers=bearer(proxy)))
        seen.append(client.post(f"/v1beta/models/g:generateContent?key={proxy.token}", json={}))
        records = proxy.drain()
    assert all(REAL_KEY.encode() in head for head in upstream.heads)  # it was echoed
    assert proxy.token.encode() in upstream.bodies[1]  # and the token went up
    for resp in seen:
        assert resp.status_code == 401 and MASK.decode() in resp.headers["x-echo"]
        assert leaks(proxy, resp.text + json.dumps(dict(resp.headers))) == []
    assert "my token is [redacted]" in seen[1].text and "my token is [redacted]" in seen[2].text
    assert [r.outcome for r in records] == ["refused"] * 3
    for record in records:
        assert leaks(proxy, record_text(record)) == [] and MASK.decode() in record.body
    assert records[1].request["messages"][0]["content"] == "my token is [redacted]"


@given(
    st.lists(st.sampled_from([b"ab", b"sk-", REAL_KEY.encode(), b"\n\n", b"s", b"sk-real"])),
    st.lists(st.integers(0, 200), max_size=8),
)
def test_redaction_survives_any_split(words: list[bytes], cuts: list[int]) -> None:
    token = b"tok_0123456789abcdef"
    wire = b"".join(words) + token + b"".join(reversed(words))
    redactor = Redactor([REAL_KEY, token.decode(), "short"])
    out, held, start = [], b"", 0
    for end in [*sorted(c for c in set(cuts) if c < len(wire)), len(wire)]:
        safe, held = redactor.split(held + wire[start:end])
        out.append(safe)
        start = end
    joined = b"".join([*out, held])
    assert joined == wire.replace(REAL_KEY.encode(), MASK).replace(token, MASK)
    assert REAL_KEY.encode() not in joined and token not in joined


def test_an_sse_stream_is_never_held_back() -> None:
    redactor = Redactor([REAL_KEY])
    assert redactor.split(HI) == (HI, b"")
    assert redactor.split(b"data: sk-re") == (b"data: ", b"sk-re")
    assert redactor.split(b"sk-re" + b"x\n\n") == (b"sk-rex\n\n", b"")
    headers = [(b"a", b"1"), (b"b", b"Bearer " + REAL_KEY.encode())]
    assert redactor.scrub_headers(headers)[1] == (b"b", b"Bearer " + MASK)
    assert redactor.scrub_headers(headers[:1]) == [(b"a", b"1")]


@pytest.mark.timeout(60)
def test_scripted_echo_never_reaches_harness_or_record() -> None:
    with (
        ScriptedModelServer() as srv,
        ModelProxy(srv.base_url, api_key=REAL_KEY) as proxy,
        httpx.Client(base_url=proxy.base_url, timeout=10) as client,
    ):
        srv.enqueue(Echo(401))
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        resp = client.post(CHAT, json=body, headers=bearer(proxy))
        (record,) = proxy.drain()
    assert srv.requests()[0].headers["authorization"] == f"Bearer {REAL_KEY}"
    assert resp.status_code == 401 and resp.headers["x-echo-credential"] == "Bearer [redacted]"
    assert leaks(proxy, resp.text) == [] and leaks(proxy, record_text(record)) == []


# ---------------------------------------------------------------- request bodies


def raw_request(port: int, head: bytes, body: bytes = b"", *, close: bool = False) -> bytes:
    """Send a request's head and some body bytes on a fresh connection; the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        if close:
            return b""
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def post_head(proxy: ModelProxy, **headers: str) -> bytes:
    lines = [f"POST {CHAT} HTTP/1.1", "host: x", f"authorization: Bearer {proxy.token}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_100mb_content_length_is_refused_before_reading(upstream: RawUpstream) -> None:
    with ModelProxy(f"http://127.0.0.1:{upstream.port}", api_key=REAL_KEY) as proxy:
        port = int(proxy.base_url.rsplit(":", 1)[1])
        rss = psutil.Process().memory_info().rss
        # Nothing follows the head: the answer must come without the body being read.
        answer = raw_request(port, post_head(proxy, content_length=str(100 * 2**20)))
        grown = psutil.Process().memory_info().rss - rss
        (record,) = proxy.drain()
    assert answer.startswith(b"HTTP/1.1 413 ") and b"connection: close" in answer.lower()
    assert b"max_request_bytes" in answer
    assert (record.outcome, record.request_bytes, record.truncated) == (
        "too_large",
        100 * 2**20,
        True,
    )
    assert upstream.heads == [] and grown < 5 * 2**20


def test_a_streamed_body_is_cut_at_the_limit(upstream: RawUpstream) -> None:
    limit = 256 * 1024
    with ModelProxy(
        f"http://127.0.0.1:{upstream.port}", api_key=REAL_KEY, max_request_bytes=limit
    ) as proxy:
        port = int(proxy.base_url.rsplit(":", 1)[1])
        # One chunk just over the limit: the proxy has read all of it when it answers.
        chunk = b"z" * (limit + 1)
        head = post_head(proxy, transfer_encoding="chunked")
        # No CRLF after it: unread bytes would make the proxy's close a reset.
        answer = raw_request(port, head, b"%x\r\n%s" % (len(chunk), chunk))
        (record,) = proxy.drain()
    assert answer.startswith(b"HTTP/1.1 413 ") and upstream.heads == []
    assert record.outcome == "too_large" and record.truncated
    assert record.request_bytes > limit and len(record.request_text) <= proxy.max_record_bytes


def test_a_harness_hanging_up_mid_request_forwards_nothing(upstream: RawUpstream) -> None:
    with ModelProxy(f"http://127.0.0.1:{upstream.port}", api_key=REAL_KEY) as proxy:
        port = int(proxy.base_url.rsplit(":", 1)[1])
        raw_request(port, post_head(proxy, content_length="1000"), b"{" * 10, close=True)
        (record,) = wait_records(proxy, 1)
    assert record.outcome == "client_closed" and record.truncated and upstream.heads == []


def test_bounds_are_checked_at_construction() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(CaptureError, match="max_record_bytes must be a positive int"):
            ModelProxy("http://127.0.0.1:1", max_record_bytes=bad)  # type: ignore[arg-type]
        with pytest.raises(CaptureError, match="max_request_bytes must be a positive int"):
            ModelProxy("http://127.0.0.1:1", max_request_bytes=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="capture_max_bytes must be a positive int"):
            HarnessConfig(capture_max_bytes=bad)  # type: ignore[arg-type]
    assert HarnessConfig().capture_max_bytes == DEFAULT_MAX_RECORD_BYTES
