"""ModelEndpoint over real loopback HTTP: steps, side calls, retries, bounds, shutdown.

Requests are the real ones under ``tests/data/model_requests`` (what each CLI sent);
answers are read back with the capture proxy's parsers (``test_model_wire.read_back``).
The policy is the test itself: it claims a call with ``next_request`` and answers with
``deliver``, as the env will. Hostile cases use raw sockets.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from support.cli import PROMPT, Calls, adding_policy, cli_env, harness_for, real_cli
from test_model_wire import ENV_TOOL, captured, read_back

from gym_harness.errors import ConfigError
from gym_harness.model import (
    Completion,
    InvalidAction,
    ModelEndpoint,
    PendingCall,
    read_request,
)

CLIS = sorted(ENV_TOOL)
API = {"claude": "anthropic", "codex": "responses", "gemini_cli": "gemini"}
WAIT_S = 10.0
_OPEN: list[http.client.HTTPConnection] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


@pytest.fixture
def ep() -> Iterator[ModelEndpoint]:
    with ModelEndpoint(keepalive_s=0.05) as served:
        served.rotate_token()
        yield served


def request_parts(
    cli: str, *, stream: bool = True, body: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """The target and body of ``cli``'s real request, streamed or not."""
    doc = captured(cli)
    path, query, body = doc["path"], doc["query"], dict(body or doc["body"])
    if not stream:
        if cli == "gemini_cli":
            path, query = path.replace(":streamGenerateContent", ":generateContent"), ""
        else:
            body["stream"] = False
            body.pop("stream_options", None)
    return path + (f"?{query}" if query else ""), body


def auth(cli: str, key: str) -> dict[str, str]:
    api = API.get(cli, "chat")
    if api == "anthropic":
        return {"x-api-key": key}
    if api == "gemini":
        return {"x-goog-api-key": key}
    return {"authorization": f"Bearer {key}"}


def post(
    ep: ModelEndpoint,
    cli: str = "claude",
    *,
    stream: bool = True,
    body: dict[str, Any] | None = None,
    key: str | None = None,
    headers: dict[str, str] | None = None,
) -> http.client.HTTPConnection:
    """Send ``cli``'s request; the answer is read later with ``getresponse``."""
    target, data = request_parts(cli, stream=stream, body=body)
    port = int(ep.base_url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    _OPEN.append(conn)
    sent = {"content-type": "application/json", **auth(cli, ep.token if key is None else key)}
    conn.request("POST", target, body=json.dumps(data), headers={**sent, **(headers or {})})
    return conn


def claim(ep: ModelEndpoint) -> PendingCall:
    """The next main call, waiting (bounded) until one is there."""
    ready, _, _ = select.select([ep.wake_fd], [], [], WAIT_S)
    assert ready, "no model call arrived"
    call = ep.next_request()
    assert call is not None
    return call


def waiting(ep: ModelEndpoint) -> bool:
    return bool(select.select([ep.wake_fd], [], [], 0)[0])


def until(check: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def add_action(call: PendingCall, cli: str) -> Completion:
    action = {"content": "", "tool_calls": [{"name": ENV_TOOL[cli], "arguments": {"a": 2}}]}
    return call.parse(json.dumps({**action, "token_ids": [5, 6], "logprobs": [-0.1, -0.2]}))


def answer_of(cli: str, stream: bool, resp: http.client.HTTPResponse) -> dict[str, Any]:
    target, body = request_parts(cli, stream=stream)
    path, _, query = target.partition("?")
    request = read_request(path, json.dumps(body).encode(), query=query)
    assert request is not None
    return read_back(request, resp.getheader("content-type") or "", resp.read())


# -- steps, in the four APIs ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("cli", CLIS)
def test_a_model_call_is_a_step_in_its_own_wire_api(
    ep: ModelEndpoint, cli: str, stream: bool
) -> None:
    conn = post(ep, cli, stream=stream)
    call = claim(ep)
    assert not waiting(ep) and ep.next_request() is None and ep.busy
    assert call.observation["api"] == API.get(cli, "chat")
    assert ENV_TOOL[cli] in call.request.tool_names
    assert call.observation["stream"] is (stream or False)
    assert ep.deliver(call.request_id, add_action(call, cli))
    resp = conn.getresponse()
    assert resp.status == 200
    got = answer_of(cli, stream, resp)
    conn.close()
    assert [json.loads(c["arguments"]) for c in got["tool_calls"]] == [{"a": 2}], got
    assert got["streamed"] is stream
    assert not ep.busy and not ep.deliver(call.request_id, add_action(call, cli))
    (record,) = ep.drain()
    assert (record.request_id, record.status, record.error, record.side) == (
        call.request_id,
        200,
        "",
        False,
    )
    assert record.token_ids == [5, 6] and record.logprobs == [-0.1, -0.2]
    assert record.observation == call.observation and record.answered >= record.started
    as_dict = json.loads(json.dumps(record.to_dict()))
    assert as_dict["completion"]["tool_calls"][0]["name"] == ENV_TOOL[cli]
    assert as_dict["token_ids"] == [5, 6] and "token_ids" not in as_dict["completion"]
    assert ep.calls() == []


@pytest.mark.parametrize("cli", ["claude", "codex", "gemini_cli", "opencode"])
def test_fail_is_an_api_error_in_each_form(ep: ModelEndpoint, cli: str) -> None:
    other = dict(captured(cli)["body"], x=1)  # another call, not a retry
    streamed, whole = post(ep, cli), post(ep, cli, stream=False, body=other)
    first, second = claim(ep), claim(ep)
    with pytest.raises(InvalidAction):
        first.parse(json.dumps({"tool_calls": [{"name": "nope", "arguments": {}}]}))
    assert ep.fail(first.request_id, "bad action") and ep.fail(second.request_id, "bad action")
    resp = streamed.getresponse()
    assert resp.status == 200 and b"bad action" in resp.read()
    resp = whole.getresponse()
    assert resp.status == 500 and b"bad action" in resp.read()
    assert [(r.status, r.error) for r in ep.calls()] == [(500, "bad action")] * 2


def test_calls_that_are_no_model_calls_are_answered_at_once(ep: ModelEndpoint) -> None:
    port = int(ep.base_url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    _OPEN.append(conn)
    conn.request("HEAD", "/")  # Claude Code's probe carries no key
    head = conn.getresponse()
    assert head.status == 200 and head.read() == b""
    for method, path, status in [
        ("GET", "/v1/models", 200),
        ("POST", "/v1/messages/count_tokens", 200),
        ("POST", "/v1/nothing", 404),  # a path that is no model call's
    ]:
        conn.request(method, path, body=b"not json", headers={"x-api-key": ep.token})
        resp = conn.getresponse()
        assert resp.status == status and resp.read()
    conn.close()
    assert not waiting(ep) and ep.calls() == []


MALFORMED = {
    "empty": ("/v1/messages", b"", "empty"),
    "binary": ("/v1/messages", bytes(range(256)) * 4, "binary"),
    "not json": ("/v1/chat/completions", b"{'messages': []}", "not JSON"),
    "a json array": ("/v1/responses", b'[{"role": "user", "content": "hi"}]', "JSON array"),
    "nested 200k deep": ("/v1/chat/completions", b"[" * 200_000 + b"]" * 200_000, "nested"),
    "messages not a list": ("/v1/chat/completions", b'{"messages": "x"}', "'messages' must be"),
    "a message not an object": (
        "/v1/messages",
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}, "x"]}',
        "item 1 is a JSON string",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_body_gets_400_with_the_reason_and_is_no_step(
    ep: ModelEndpoint, case: str
) -> None:
    path, body, reason = MALFORMED[case]
    port = int(ep.base_url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    _OPEN.append(conn)
    conn.request("POST", path, body=body, headers={"authorization": f"Bearer {ep.token}"})
    resp = conn.getresponse()
    answer = resp.read()
    assert resp.status == 400, answer
    assert reason in json.loads(answer)["error"]["message"], answer
    assert not waiting(ep) and ep.next_request() is None
    (record,) = ep.calls()
    assert (record.status, record.observation) == (400, None) and reason in record.error
    conn.request("POST", path, body=body, headers={"authorization": f"Bearer {ep.token}"})
    assert conn.getresponse().status == 400  # the connection stays usable


def test_the_key_is_required_and_rotates(ep: ModelEndpoint) -> None:
    before = ep.last_activity
    for key in ("", "wrong-key-wrong-key"):
        resp = post(ep, "codex", key=key).getresponse()
        assert resp.status == 401 and b"key" in resp.read()
    assert ep.last_activity == before  # no sign of life from a stranger
    old = ep.token
    ep.rotate_token()
    assert post(ep, "claude", key=old).getresponse().status == 401
    assert not waiting(ep) and ep.calls() == []
    conn = post(ep, "claude")
    call = claim(ep)
    assert ep.last_activity > before
    ep.deliver(call.request_id, Completion(content="hi"))
    assert conn.getresponse().status == 200


@pytest.mark.parametrize(
    "options",
    [{"model_calls": "some"}, {"keepalive_s": 0}, {"max_pending": 0}, {"max_records": True}],
)
def test_settings_out_of_range_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(options))):
        ModelEndpoint(**options)


# -- side calls -------------------------------------------------------------------------------


def no_tools(request: Any, headers: Any) -> bool:
    return not request.tools


@pytest.mark.parametrize("cli", CLIS)
def test_a_side_call_is_answered_without_the_policy(cli: str) -> None:
    body = {k: v for k, v in captured(cli)["body"].items() if k != "tools"}
    with ModelEndpoint(no_tools) as ep:
        ep.rotate_token()
        for stream in (True, False):
            resp = post(ep, cli, stream=stream, body=body).getresponse()
            assert resp.status == 200
            target, data = request_parts(cli, stream=stream, body=body)
            path, _, query = target.partition("?")
            request = read_request(path, json.dumps(data).encode(), query=query)
            assert request is not None
            got = read_back(request, resp.getheader("content-type") or "", resp.read())
            assert got["text"] == "OK"
        assert not waiting(ep) and ep.next_request() is None
        records = ep.calls()
        answers = [(r.side, r.completion and r.completion.content) for r in records]
        assert answers == [(True, "OK")] * 2


def test_with_model_calls_all_a_side_call_is_a_step() -> None:
    body = {k: v for k, v in captured("opencode")["body"].items() if k != "tools"}
    with ModelEndpoint(no_tools, model_calls="all") as ep:
        conn = post(ep, "opencode", key=ep.token, body=body)
        call = claim(ep)
        assert call.side
        ep.deliver(call.request_id, Completion(content="A title"))
        assert b"A title" in conn.getresponse().read()
        assert [r.side for r in ep.calls()] == [True]


# -- retries ----------------------------------------------------------------------------------


def test_a_retry_of_a_waiting_call_joins_it(ep: ModelEndpoint) -> None:
    first = post(ep, "claude")  # streamed
    call = claim(ep)
    first_resp = first.getresponse()  # its stream opened
    retry = post(ep, "claude", stream=False)  # Claude Code's unstreamed fallback
    until(lambda: call.retries == 1)
    assert ep.next_request() is None and not waiting(ep)
    ep.deliver(call.request_id, add_action(call, "claude"))
    got = answer_of("claude", False, retry.getresponse())
    assert got["tool_calls"] and not got["streamed"]
    with pytest.raises((http.client.IncompleteRead, ConnectionError)):  # the older one closed
        first_resp.read()
    (record,) = ep.calls()
    assert record.retries == 1


def test_an_sdk_retry_that_changed_a_limit_joins_by_its_conversation(ep: ModelEndpoint) -> None:
    post(ep, "qwen_code")
    call = claim(ep)
    changed = dict(captured("qwen_code")["body"], max_tokens=7)
    plain = post(ep, "qwen_code", body=changed)  # no retry header: a call of its own
    other = claim(ep)
    retry = post(ep, "qwen_code", body=changed, headers={"x-stainless-retry-count": "1"})
    until(lambda: call.retries + other.retries == 1)
    assert ep.next_request() is None
    for pending in (call, other):
        ep.deliver(pending.request_id, Completion(content=f"answer {pending.request_id}"))
    texts = {answer_of("qwen_code", True, c.getresponse())["text"] for c in (plain, retry)}
    assert f"answer {other.request_id}" in texts
    assert len(ep.calls()) == 2


def test_a_retry_of_an_answered_call_gets_the_same_bytes(ep: ModelEndpoint) -> None:
    conn = post(ep, "codex")
    call = claim(ep)
    ep.deliver(call.request_id, add_action(call, "codex"))
    resp = conn.getresponse()
    original = resp.read()
    again = post(ep, "codex").getresponse().read()
    assert again == original and b"keep-alive" not in original
    assert not waiting(ep) and len(ep.calls()) == 1
    (sent,) = ep.calls()[0].completion.tool_calls  # type: ignore[union-attr]
    whole = answer_of("codex", False, post(ep, "codex", stream=False).getresponse())
    assert [c["id"] for c in whole["tool_calls"]] == [sent.id] and not whole["streamed"]
    ep.rotate_token()  # a new episode forgets old answers
    post(ep, "codex")
    assert claim(ep).request_id != call.request_id


def test_a_dropped_connection_keeps_its_call_for_the_retry(ep: ModelEndpoint) -> None:
    conn = post(ep, "opencode")
    call = claim(ep)
    conn.getresponse()
    conn.sock.shutdown(socket.SHUT_RDWR)  # the harness gave up on it
    conn.close()
    until(lambda: call.exchange is None)  # the endpoint saw the hang-up
    assert ep.deliver(call.request_id, add_action(call, "opencode"))
    assert ep.calls()[0].error == ""
    got = answer_of("opencode", True, post(ep, "opencode").getresponse())
    assert [json.loads(c["arguments"]) for c in got["tool_calls"]] == [{"a": 2}]


# -- a slow policy ----------------------------------------------------------------------------


@pytest.mark.parametrize("cli", CLIS)
def test_a_waiting_stream_gets_keepalives(ep: ModelEndpoint, cli: str) -> None:
    conn = post(ep, cli)
    call = claim(ep)
    resp = conn.getresponse()
    beat = call.writer(call.request).keepalive()
    seen = b""
    while seen.count(beat) < 3:  # bounded by the connection's timeout
        seen += resp.read1(65536)
    ep.deliver(call.request_id, Completion(content="done"))
    assert answer_of(cli, True, resp)["text"] == "done"


def test_a_call_the_policy_leaves_too_long_ends_in_an_api_error() -> None:
    with ModelEndpoint(policy_timeout_s=0.2, keepalive_s=0.05) as ep:
        whole, streamed = post(ep, "qwen_code", stream=False), post(ep, "claude")
        resp = whole.getresponse()
        assert resp.status == 504 and b"policy_timeout_s" in resp.read()
        assert b"policy_timeout_s" in streamed.getresponse().read()
        assert [r.status for r in ep.calls()] == [504, 504]
        assert ep.next_request() is None and not waiting(ep)
        assert not ep.deliver(ep.calls()[0].request_id, Completion(content="late"))


# -- bounds -----------------------------------------------------------------------------------


def raw_post(ep: ModelEndpoint, head: bytes, body: bytes = b"") -> bytes:
    """Send bytes as they are; the status line of the answer (or b"" if the socket closed)."""
    port = int(ep.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(head + body)
        try:
            return sock.recv(65536).split(b"\r\n", 1)[0]
        except ConnectionError:
            return b""


def test_a_body_over_the_limit_gets_413_declared_or_streamed() -> None:
    with ModelEndpoint(max_request_bytes=1000) as ep:
        key = f"x-api-key: {ep.token}\r\n".encode()
        declared = b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n" + key
        assert b"413" in raw_post(ep, declared + b"content-length: 5000000\r\n\r\n")
        chunked = declared + b"transfer-encoding: chunked\r\n\r\n"
        piece = b"%x\r\n%s\r\n" % (600, b"x" * 600)
        assert b"413" in raw_post(ep, chunked, piece * 3)
        assert [(r.status, r.observation) for r in ep.calls()] == [(413, None)] * 2
        assert not waiting(ep)


def test_a_chunked_body_over_the_limit_is_dropped_while_read() -> None:
    """The body is never held past the limit: no copy of it is made to refuse it."""
    limit = 4 * 2**20
    piece = b"x" * (256 * 1024)
    with ModelEndpoint(max_request_bytes=limit) as ep:
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-api-key: {ep.token}\r\n"
            "transfer-encoding: chunked\r\n\r\n"
        ).encode()
        payload = head + (b"%x\r\n%s\r\n" % (len(piece), piece)) * 24  # 6 MiB, made first
        port = int(ep.base_url.rsplit(":", 1)[1])
        tracemalloc.start()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
                with contextlib.suppress(ConnectionError):  # closed once past the limit
                    sock.sendall(payload)
                    sock.recv(65536)
                until(ep.calls)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        (record,) = ep.calls()
    assert record.status == 413 and "max_request_bytes" in record.error
    # The body up to the limit, plus a chunk or two in flight; holding a copy would be 2x.
    assert peak < 1.6 * limit, peak / limit


def read_answer(sock: socket.socket) -> tuple[int, bytes]:
    """One whole HTTP/1.1 answer with a content-length: its status and body."""
    got = bytearray()
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(1 << 20)
        assert chunk, bytes(got[:200])
        got += chunk
    head, _, body = bytes(got).partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    fields = {name.lower(): value for name, _, value in (line.partition(":") for line in lines)}
    length = int(fields["content-length"])
    rest = bytearray(body)
    while len(rest) < length:
        chunk = sock.recv(1 << 20)
        if not chunk:  # cut before its end
            break
        rest += chunk
    return int(status.split()[1]), bytes(rest)


def test_a_complete_answer_still_being_written_is_never_evicted() -> None:
    """At the connection cap, an answered call whose bytes are not all sent stays."""
    with ModelEndpoint(max_connections=8) as ep:
        server = ep._server
        assert server is not None and server.max_connections == 8
        port = int(ep.base_url.rsplit(":", 1)[1])
        _, data = request_parts("opencode", stream=False)
        body = json.dumps(data).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            f"\r\nauthorization: Bearer {ep.token}\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.socket() as reader:  # a harness slow to read its answer
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader.settimeout(WAIT_S)
            reader.connect(("127.0.0.1", port))
            reader.sendall(head + body)
            call = claim(ep)
            for i in range(7):  # the other seven places: calls waiting for the policy
                post(ep, "opencode", stream=False, body=dict(data, n=i))
                claim(ep)
            text = "y" * (8 * 2**20)  # far more than the sockets' buffers hold
            assert ep.deliver(call.request_id, Completion(content=text))
            until(lambda: call.exchange is None)  # the answer is complete, not all sent
            with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as newcomer:
                until(lambda: hung_up(newcomer))  # no place for it: nobody may be evicted
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            status, answer = read_answer(reader)
        assert status == 200
        assert json.loads(answer)["choices"][0]["message"]["content"] == text


def test_waiting_calls_are_bounded_by_max_pending() -> None:
    with ModelEndpoint(max_pending=2) as ep:
        body = captured("opencode")["body"]
        for i in range(2):
            post(ep, "opencode", body=dict(body, n=i))
            claim(ep)
        resp = post(ep, "opencode", body=dict(body, n=9)).getresponse()
        assert resp.status == 429 and b"max_pending" in resp.read()
        assert ep.next_request() is None
        assert [r.status for r in ep.calls()] == [429]


def test_the_replay_table_is_bounded() -> None:
    body = captured("claude")["body"]
    with ModelEndpoint(max_replay=2) as ep:
        for i in range(3):
            conn = post(ep, "claude", body=dict(body, metadata={"n": i}))
            ep.deliver(claim(ep).request_id, Completion(content=f"answer {i}"))
            conn.getresponse().read()
        assert len(ep._replay) <= 2  # two keys per answer: only the newest is left
        post(ep, "claude", body=dict(body, metadata={"n": 0}))  # forgotten: a new step
        call = claim(ep)
        ep.deliver(call.request_id, Completion(content="new"))
        assert len(ep._replay) <= 2 and len(ep.calls()) == 4


def test_records_are_bounded_by_count_and_bytes() -> None:
    body = captured("claude")["body"]
    size = len(json.dumps(body))
    with ModelEndpoint(max_records=3, max_record_bytes=2 * size) as ep:
        for i in range(5):
            conn = post(ep, "claude", body=dict(body, metadata={"n": i}))
            ep.deliver(claim(ep).request_id, Completion(content=f"answer {i}"))
            conn.getresponse().read()
        records = ep.calls()
        assert [r.truncated for r in records] == [False, True, True] and ep.dropped == 2
        assert records[1].observation is None and records[1].completion is None
        assert records[1].status == 200 and records[1].to_dict()["truncated"]
        assert len(ep.drain()) == 3 and ep.dropped == 0 and ep.calls() == []


def hung_up(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionError:
        return True


def test_connections_are_bounded() -> None:
    with ModelEndpoint(max_connections=8) as ep:
        server = ep._server
        assert server is not None and server.max_connections == 8
        port = int(ep.base_url.rsplit(":", 1)[1])
        socks = [socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) for _ in range(30)]
        closed: set[int] = set()
        try:
            # Until the server has taken all 30: each is either open there or closed by it.
            while len(closed) + len(server.connections) < 30:
                ready, _, _ = select.select([s for s in socks if id(s) not in closed], [], [], 0.05)
                closed.update(id(s) for s in ready if hung_up(s))
            assert len(server.connections) <= 8 and len(closed) >= 22
        finally:
            for sock in socks:
                sock.close()


def test_a_flood_of_retries_grows_nothing() -> None:
    with ModelEndpoint(max_pending=4) as ep:
        conns = [post(ep, "gemini_cli") for _ in range(20)]
        call = claim(ep)
        until(lambda: call.retries == 19)
        assert ep.next_request() is None
        ep.deliver(call.request_id, Completion(content="once"))
        assert b"once" in conns[-1].getresponse().read()
        (record,) = ep.calls()
        assert record.retries == 19


# -- episode end and shutdown -----------------------------------------------------------------


def model_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gym-harness-model"]


def test_cut_ends_every_waiting_call_with_an_error(ep: ModelEndpoint) -> None:
    streamed = post(ep, "claude")
    claimed = claim(ep)
    whole = post(ep, "opencode", stream=False)
    until(lambda: waiting(ep))
    assert ep.busy
    assert ep.cut("the episode ended") == 2
    assert not waiting(ep) and not ep.busy and ep.next_request() is None
    assert b"the episode ended" in streamed.getresponse().read()
    resp = whole.getresponse()
    assert resp.status == 504 and b"the episode ended" in resp.read()
    assert [(r.status, r.error) for r in ep.calls()] == [(504, "the episode ended")] * 2
    assert not ep.deliver(claimed.request_id, Completion(content="late"))


def test_the_key_stops_working_the_moment_its_episode_is_cut(ep: ModelEndpoint) -> None:
    old = ep.token
    waiting_call = post(ep, "claude", stream=False)
    claim(ep)
    assert ep.cut("the episode ended") == 1
    assert waiting_call.getresponse().status == 504
    assert [r.status for r in ep.drain()] == [504]  # into the ended episode's trajectory
    late = post(ep, "claude", key=old).getresponse()
    assert late.status == 401 and b"key" in late.read()
    assert not waiting(ep) and ep.calls() == []  # in no trajectory
    new = ep.rotate_token()
    assert new != old
    assert post(ep, "claude", key=old).getresponse().status == 401


def test_a_request_let_in_before_the_cut_is_refused_after_it(ep: ModelEndpoint) -> None:
    """Its key was good when its headers came; its body came after the episode ended."""
    _, data = request_parts("opencode", stream=False)
    body = json.dumps(data).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {ep.token}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    port = int(ep.base_url.rsplit(":", 1)[1])
    before = ep.last_activity
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(head)
        until(lambda: ep.last_activity > before)  # the endpoint let it in
        ep.cut("the episode ended")
        sock.sendall(body)
        assert sock.recv(65536).startswith(b"HTTP/1.1 401 ")
    assert not waiting(ep) and ep.calls() == []


def test_a_call_that_timed_out_is_a_lapse_until_an_answer_goes_out() -> None:
    with ModelEndpoint(policy_timeout_s=0.2, keepalive_s=0.05) as ep:
        ep.rotate_token()
        assert ep.lapses() == (0, ())
        first = post(ep, "opencode", stream=False)
        call = claim(ep)
        assert first.getresponse().status == 504
        assert ep.lapses() == (1, (call.request_id,))
        retry = post(ep, "opencode", stream=False)  # the harness retries: a call of its own
        assert retry.getresponse().status == 504
        count, ids = ep.lapses()
        assert count == 2 and ids[0] == call.request_id and len(set(ids)) == 2
        conn = post(ep, "opencode", stream=False, body=dict(captured("opencode")["body"], n=1))
        answered = claim(ep)
        assert ep.lapses()[0] == 2  # claimed is not answered
        assert ep.deliver(answered.request_id, Completion(content="in time"))
        assert conn.getresponse().status == 200
        assert ep.lapses() == (0, ())
        post(ep, "opencode", stream=False, body=dict(captured("opencode")["body"], n=2))
        until(lambda: ep.lapses()[0] == 1)
        ep.cut("the episode ended")
        assert ep.lapses() == (0, ())


def test_stop_is_bounded_idempotent_and_leaves_no_thread() -> None:
    before = len(model_threads())
    ep = ModelEndpoint(keepalive_s=0.05)
    ep.start()
    conn = post(ep, "codex")
    call = claim(ep)
    fd = ep.wake_fd
    ep.stop()
    ep.stop()
    assert len(model_threads()) == before
    with pytest.raises(OSError):
        select.select([fd], [], [], 0)  # the wake pipe is closed
    assert not ep.deliver(call.request_id, Completion(content="late"))
    assert [r.error for r in ep.calls()] == ["the model endpoint stopped"]
    assert b"stopped" in conn.getresponse().read()
    with pytest.raises(Exception, match="stopped"):
        ep.start()


# -- a real CLI -------------------------------------------------------------------------------


class Driver:
    """The policy side of the env, in a thread: claim each call, answer it after a pause."""

    def __init__(self, ep: ModelEndpoint, pause_s: float, first_pause_s: float = 0.0) -> None:
        self.ep, self.pause_s, self.first_pause_s = ep, pause_s, first_pause_s
        self.stop = threading.Event()
        self.steps: list[PendingCall] = []
        self.thread = threading.Thread(target=self.run, name="test-policy", daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            select.select([self.ep.wake_fd], [], [], 0.1)
            call = self.ep.next_request()
            if call is None:
                continue
            self.steps.append(call)
            self.stop.wait(
                self.first_pause_s if len(self.steps) == 1 else self.pause_s
            )  # a slow policy: the stream gets keep-alives meanwhile
            action = json.loads(adding_policy(call.observation))
            action = action if isinstance(action, dict) else {"content": action}
            self.ep.deliver(call.request_id, call.parse(json.dumps({**action, "token_ids": [1]})))

    def __enter__(self) -> Driver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(WAIT_S)


@real_cli(timeout=150)
@pytest.mark.parametrize("first_pause_s", [0.5, 20.0], ids=["quick", "slow_policy"])
def test_claude_code_takes_the_endpoint_answers(
    monkeypatch: pytest.MonkeyPatch, first_pause_s: float
) -> None:
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    calls = Calls()
    with ModelEndpoint(keepalive_s=1.0) as ep:
        monkeypatch.setenv("ANTHROPIC_API_KEY", ep.rotate_token())
        env = cli_env(harness_for("claude", ep.base_url), calls, startup_timeout_s=60)
        try:
            with Driver(ep, pause_s=0.5, first_pause_s=first_pause_s) as driver:
                env.reset()
                reply, _, terminated, truncated, info = env.step(PROMPT)
        finally:
            env.close()
        records = ep.drain()
    assert (terminated, truncated, info["error_type"]) == (False, False, ""), info
    assert calls.seen == [(20, 22)] and "42" in reply
    main = [r for r in records if not r.side]
    # One step per call: a slow first answer made no retry and no second step.
    assert [r.request_id for r in main] == [c.request_id for c in driver.steps]
    assert all(r.retries == 0 and r.status == 200 and r.token_ids == [1] for r in main)
    first = next(r for r in main if r.completion and r.completion.tool_calls)
    assert PROMPT in json.dumps(first.to_dict()["observation"]["messages"])
