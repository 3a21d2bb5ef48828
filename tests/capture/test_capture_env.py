"""HarnessEnv(capture=True): real harnesses talk to the scripted model server through the proxy.

The env's proxy records every model call as llm_request / llm_response events; the real
key stays in this process; upstream faults reach the harness and the record, and nothing
hangs past the turn's deadlines.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest
from support.cli import cli_path
from support.model_server import Drop, Echo, Raw, ScriptedModelServer, token_id

from gym_harness import HarnessEnv
from gym_harness.capture.proxy import parse_sse
from gym_harness.process import sandbox
from gym_harness.records.chat_format import exchange_messages, exchange_records

REAL_KEY = "sk-real-upstream-key-7f3a"
KEY_VAR = "TEST_REAL_KEY"

# A line-protocol agent that asks for one chat completion per message from OPENAI_BASE_URL
# (streamed, or not with the argument "plain") and reports the exact bytes it received (as
# an "other" event) and any transport error. Everything but the request itself is done
# before "ready", so a message becomes a model call at once, however loaded the machine.
STREAMING_AGENT = textwrap.dedent(
    """
    import json, os, sys
    import httpx2

    def emit(obj):
        sys.stdout.write(json.dumps(obj) + "\\n")
        sys.stdout.flush()

    stream = sys.argv[1:] != ["plain"]
    url = os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions"
    headers = {"authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
    client = httpx2.Client(timeout=30, trust_env=False)
    emit({"type": "ready"})
    with client:
        for line in sys.stdin:
            content = json.loads(line)["content"]
            body = {"model": "m", "stream": stream, "return_token_ids": True,
                    "messages": [{"role": "user", "content": content}]}
            if stream:
                body["stream_options"] = {"include_usage": True}
            received, text, status = b"", "", 0
            try:
                with client.stream("POST", url, json=body, headers=headers) as resp:
                    status = resp.status_code
                    for chunk in resp.iter_raw():
                        received += chunk
                if not stream and status < 400:
                    text = json.loads(received)["choices"][0]["message"]["content"] or ""
                for event in received.decode().split("\\n\\n") if stream else ():
                    data = event.partition("data: ")[2]
                    if data and data != "[DONE]":
                        for choice in json.loads(data).get("choices") or []:
                            text += choice["delta"].get("content") or ""
                error = "" if status < 400 else f"HTTP {status}: {received.decode()}"
            except httpx2.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            emit({"type": "stream_bytes", "status": status, "data": received.decode()})
            if error:
                emit({"type": "error", "message": error})
            else:
                emit({"type": "text", "text": text})
            emit({"type": "turn_complete", "response": error or text})
    """
)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture(autouse=True)
def real_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The upstream key the env reads (by name) and must keep from the harness."""
    monkeypatch.setenv(KEY_VAR, REAL_KEY)


def reference_env(srv: ScriptedModelServer, **kwargs: Any) -> HarnessEnv:
    kwargs.setdefault("turn_timeout_s", 30)
    kwargs.setdefault("idle_timeout_s", 20)
    return HarnessEnv(
        "reference",
        policy="openai",
        model="m",
        capture=True,
        upstream=srv.base_url,  # the origin: each adapter appends its API's path
        upstream_api_key_env=KEY_VAR,
        tools=[add],
        **kwargs,
    )


def streaming_env(
    srv: ScriptedModelServer, tmp_path: Path, *, plain: bool = False, **kwargs: Any
) -> HarnessEnv:
    script = tmp_path / "streaming_agent.py"
    script.write_text(STREAMING_AGENT)
    # The reference adapter hands OPENAI_BASE_URL / OPENAI_API_KEY to whatever command runs.
    command = [sys.executable, str(script), *(["plain"] if plain else [])]
    return reference_env(srv, command=command, **kwargs)


def model_calls(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The turn's exchanges: each llm_response's data merged with its llm_request's."""
    return exchange_records(info["events"])


def harness_sees(env: HarnessEnv, token: str) -> str:
    """The harness process's argv and environment, read from /proc while it runs.

    Read after a turn: between fork and exec /proc shows the parent's environment.
    """
    proc = env.unwrapped.process
    assert proc is not None and proc.pid is not None
    ps = psutil.Process(proc.pid)
    seen = json.dumps([ps.cmdline(), ps.environ()])
    assert token in seen  # the proxy token reached it (sanity: we read the right process)
    return seen


def proxy_token(env: HarnessEnv) -> str:
    proxy = env.unwrapped._proxy
    assert proxy is not None
    return proxy.token


def assert_key_stays_home(srv: ScriptedModelServer, token: str, header: str) -> None:
    logged = srv.requests()
    assert logged
    for req in logged:
        if req.api != "other":
            assert req.headers[header] in (REAL_KEY, f"Bearer {REAL_KEY}")
        assert token not in json.dumps(req.headers) + req.query


# ---------------------------------------------------------------- (a) reference agent, openai


@pytest.mark.timeout(60)
@pytest.mark.parametrize("logprobs", [False, True])
def test_reference_agent_calls_are_recorded_in_the_turn(
    srv: ScriptedModelServer, logprobs: bool
) -> None:
    env = reference_env(srv, request_logprobs=logprobs)
    try:
        _, info = env.reset()
        assert info["error_type"] == "", info
        token = proxy_token(env)
        reply, _, terminated, truncated, info = env.step("please add")
        assert REAL_KEY not in harness_sees(env, token)
        assert reply == "tool said: 5; you said: please add"
        assert (info["error_type"], terminated, truncated) == ("", False, False)
    finally:
        env.close()

    # Harness lines are stamped when the env reads them, so a line and a model call the
    # harness made right after it may swap places; these orders are causal, hence certain.
    kinds = [e["type"] for e in info["events"] if e["type"] != "llm_usage"]
    llm = [k for k in kinds if k.startswith("llm_")]
    assert llm == ["llm_request", "llm_response"] * 2
    responses = [i for i, k in enumerate(kinds) if k == "llm_response"]
    assert responses[0] < kinds.index("tool_call") < kinds.index("tool_result")
    assert responses[1] < kinds.index("text") < kinds.index("turn_complete") == len(kinds) - 1
    stamps = [e["timestamp"] for e in info["events"]]
    assert stamps == sorted(stamps)
    calls = model_calls(info)
    upstream = srv.requests("chat")
    assert [c["request"] for c in calls] == [r.body for r in upstream]  # what went up
    assert all((c["outcome"], c["status"], c["streamed"]) == ("ok", 200, False) for c in calls)
    (tool_call,) = calls[0]["tool_calls"]
    assert (tool_call["name"], json.loads(tool_call["arguments"])) == ("add", {"a": 2, "b": 3})
    assert calls[1]["text"] == reply and calls[1]["tool_calls"] == []
    assert json.loads(calls[1]["body"])["choices"][0]["message"]["content"] == reply
    assert all(r.body.get("logprobs") is (True if logprobs else None) for r in upstream)
    if logprobs:
        assert "".join(lp["token"] for lp in calls[1]["logprobs"]) == reply
        assert all(lp["logprob"] <= 0 for lp in calls[1]["logprobs"])
    else:
        assert calls[1]["logprobs"] == []
    assert_key_stays_home(srv, token, "authorization")
    # the exchange as chat messages: the tool round trip is in the second prompt
    messages = exchange_messages(calls[1])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2]["content"] == "5" and messages[-1]["content"] == reply


# ---------------------------------------------------------------- (b) streaming


@pytest.mark.timeout(60)
@pytest.mark.parametrize("logprobs", [False, True])
def test_streamed_answer_is_recorded_chunk_for_chunk(
    srv: ScriptedModelServer, tmp_path: Path, logprobs: bool
) -> None:
    env = streaming_env(srv, tmp_path, request_logprobs=logprobs)
    try:
        env.reset()
        token = proxy_token(env)
        reply, _, _, _, info = env.step("hello there")
        assert REAL_KEY not in harness_sees(env, token)
    finally:
        env.close()
    assert reply == "you said: hello there"
    (received,) = [
        e["data"]["data"] for e in info["events"] if e["data"].get("type") == "stream_bytes"
    ]
    (call,) = model_calls(info)
    assert call["streamed"] and call["outcome"] == "ok"
    events = [{"event": e.event, "data": e.data} for e in parse_sse(received.encode())]
    assert call["events"] == events  # what the harness got is what was recorded
    assert call["text"] == reply and call["request"] == srv.requests("chat")[-1].body
    pieces = ["you", " said:", " hello", " there"]
    assert call["token_ids"] == [token_id(p) for p in pieces]
    if logprobs:
        assert [(lp["token"], lp["token_id"]) for lp in call["logprobs"]] == [
            (p, token_id(p)) for p in pieces
        ]
    else:
        assert call["logprobs"] == []
    assert_key_stays_home(srv, token, "authorization")


# ---------------------------------------------------------------- (c) real CLIs


@pytest.mark.cli
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("isolated_network")
@pytest.mark.parametrize("tier", ["auto", "strict"])
@pytest.mark.parametrize("cli", ["claude_code", "codex"])
def test_real_cli_through_the_proxy(
    srv: ScriptedModelServer, monkeypatch: pytest.MonkeyPatch, cli: str, tier: str
) -> None:
    """Turn mode through the capture proxy: confined as by default, and with ``"strict"``
    (the proxy is then the CLI's only way to its model)."""
    if tier == "strict" and sandbox.report("strict")["missing"]:
        pytest.skip(f"strict is not available here: {sandbox.report('strict')['missing']}")
    api, header = {
        "claude_code": ("anthropic", "x-api-key"),
        "codex": ("responses", "authorization"),
    }[cli]
    upstream = srv.base_url  # the origin, as for every harness
    # The user's own keys must not leak to the CLI either: the proxy token replaces them.
    monkeypatch.setenv("ANTHROPIC_API_KEY", REAL_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", REAL_KEY)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    executable = cli_path("claude" if cli == "claude_code" else "codex")
    env = HarnessEnv(
        cli,
        executable=executable,
        model="scripted-model",
        tools=[add],
        capture=True,
        upstream=upstream,
        upstream_api_key_env=KEY_VAR,
        turn_timeout_s=60,
        idle_timeout_s=30,
        startup_timeout_s=40,
        sandbox=tier,
    )
    try:
        _, info = env.reset()
        assert info["error_type"] == "", info
        token = proxy_token(env)
        reply, _, _, _, info = env.step("please add the numbers")
        assert info["error_type"] == "", info
        assert REAL_KEY not in harness_sees(env, token)
    finally:
        env.close()
    assert "5" in reply
    calls = [c for c in model_calls(info) if c["api"] == api]
    upstream_calls = srv.requests(api)
    assert len(calls) == len(upstream_calls) >= 2
    assert [c["request"] for c in calls] == [r.body for r in upstream_calls]
    assert all(c["outcome"] == "ok" and c["streamed"] for c in calls)
    recorded_calls = [tc for c in calls for tc in c["tool_calls"]]
    assert [json.loads(tc["arguments"]) for tc in recorded_calls] == [{"a": 2, "b": 3}]
    assert recorded_calls[0]["name"].endswith("add")
    assert any(c["text"] and c["text"] in reply for c in calls)
    kinds = [e["type"] for e in info["events"]]
    assert kinds.index("llm_response") < kinds.index("tool_result") < len(kinds) - 1
    assert_key_stays_home(srv, token, header)


# ---------------------------------------------------------------- (d) upstream faults


@pytest.mark.timeout(60)
def test_refusal_reaches_the_harness_and_the_record(srv: ScriptedModelServer) -> None:
    error = {"error": {"message": "overloaded, try later", "type": "server_error"}}
    env = reference_env(srv)
    try:
        env.reset()
        srv.fail(503, error)
        reply, _, terminated, truncated, info = env.step("please add")
    finally:
        env.close()
    assert "503" in reply and "overloaded, try later" in reply  # the upstream's status and body
    assert not terminated and not truncated
    (call,) = model_calls(info)
    assert (call["outcome"], call["status"], json.loads(call["body"])) == ("refused", 503, error)
    assert exchange_messages(call) == [{"role": "user", "content": "please add"}]


@pytest.mark.timeout(60)
def test_drop_without_an_answer_is_recorded(srv: ScriptedModelServer) -> None:
    env = reference_env(srv)
    try:
        env.reset()
        srv.drop(after=0)
        reply, _, _, _, info = env.step("please add")
    finally:
        env.close()
    (call,) = model_calls(info)
    assert call["outcome"] == "dropped" and "closed without answering" in call["error"]
    assert "502" in reply and "closed without answering" in reply


@pytest.mark.timeout(60)
def test_drop_mid_stream_breaks_the_harness_connection(
    srv: ScriptedModelServer, tmp_path: Path
) -> None:
    env = streaming_env(srv, tmp_path)
    try:
        env.reset()
        srv.enqueue(Drop(after=2))
        reply, _, _, _, info = env.step("one two three")
        reply2, _, _, _, info2 = env.step("again")  # the next call is unharmed
    finally:
        env.close()
    assert "RemoteProtocolError" in reply  # what the harness would see from the real server
    (received,) = [
        e["data"]["data"] for e in info["events"] if e["data"].get("type") == "stream_bytes"
    ]
    (call,) = model_calls(info)
    assert call["outcome"] == "dropped" and len(call["events"]) == 2
    assert call["events"] == [
        {"event": e.event, "data": e.data} for e in parse_sse(received.encode())
    ]
    assert reply2 == "you said: again" and model_calls(info2)[0]["outcome"] == "ok"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("streaming", [False, True])
def test_stall_ends_the_turn_at_its_deadline(
    srv: ScriptedModelServer, tmp_path: Path, streaming: bool
) -> None:
    kwargs = {"turn_timeout_s": 10, "idle_timeout_s": 4}
    # Not the reference agent: its first turn imports and connects with no output
    # before its model call (seconds on a loaded machine, the whole idle budget).
    env = streaming_env(srv, tmp_path, plain=not streaming, **kwargs)
    try:
        env.reset()
        srv.stall(after=2 if streaming else None)
        _, _, terminated, truncated, info = env.step("please add")
    finally:
        env.close()
    assert truncated and not terminated and info["error_type"] == "idle_timeout"
    (call,) = model_calls(info)
    assert call["outcome"] == "stalled" and "idle_timeout" in call["error"]
    assert len(call["events"]) == (2 if streaming else 0)


# ---------------------------------------------------------------- (e) rollout export


@pytest.mark.timeout(90)
def test_rollout_capture_writes_llm_exchanges(srv: ScriptedModelServer, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t1", "prompt": "hello model"}) + "\n")
    out = tmp_path / "out.jsonl"
    argv = [sys.executable, "-m", "gym_harness.rollout.cli", "rollout", str(tasks)]
    argv += ["--env", "gym_harness/Reference-v0", "--set", 'policy="openai"', "--set", 'model="m"']
    argv += ["--capture", srv.base_url, "--upstream-key-env", KEY_VAR, "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=80)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert REAL_KEY not in text
    (record,) = [json.loads(line) for line in text.splitlines()]
    first, second = record["llm_exchanges"]  # the demo tools include "add": it is called
    assert first["turn"] == second["turn"] == 1
    (call,) = first["messages"][-1]["tool_calls"]
    assert call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {"a": 2, "b": 3}
    assert second["messages"] == [
        {"role": "user", "content": "hello model"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "5", "tool_call_id": call["id"], "name": "add"},
        {"role": "assistant", "content": "tool said: 5; you said: hello model", "tool_calls": []},
    ]
    assert "add" in [t["function"]["name"] for t in second["tools"]]
    raw = second["raw"]
    assert (raw["api"], raw["outcome"], raw["status"]) == ("chat", "ok", 200)
    assert raw["request"] == srv.requests("chat")[-1].body
    assert srv.requests("chat")[-1].headers["authorization"] == f"Bearer {REAL_KEY}"


# ---------------------------------------------------------------- (f) nothing hidden or leaked

# A line-protocol agent that posts each message, as is, as the body of one chat call, and
# replies with the status, the size and the start of the answer (it parses nothing).
RAW_AGENT = textwrap.dedent(
    """
    import json, os, sys
    import httpx2

    url = os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions"
    headers = {"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
               "content-type": "application/json"}
    print(json.dumps({"type": "ready"}), flush=True)
    with httpx2.Client(timeout=30, trust_env=False) as client:
        for line in sys.stdin:
            resp = client.post(url, content=json.loads(line)["content"], headers=headers)
            seen = {"status": resp.status_code, "bytes": len(resp.content),
                    "head": resp.text[:4000], "headers": dict(resp.headers)}
            print(json.dumps({"type": "turn_complete", "response": json.dumps(seen)}), flush=True)
    """
)
DEEP_SSE = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\ndata: ' + b"[" * 5000 + b"\n\n"


def raw_env(srv: ScriptedModelServer, tmp_path: Path, **kwargs: Any) -> HarnessEnv:
    script = tmp_path / "raw_agent.py"
    script.write_text(RAW_AGENT)
    return reference_env(srv, command=[sys.executable, str(script)], **kwargs)


def chat_body(content: str, stream: bool = False) -> str:
    messages = [{"role": "user", "content": content}]
    return json.dumps({"model": "m", "stream": stream, "messages": messages})


@pytest.mark.timeout(60)
def test_unreadable_model_calls_still_reach_the_trajectory(
    srv: ScriptedModelServer, tmp_path: Path
) -> None:
    deep = '{"model": "m", "messages": [{"role": "user", "content": ' + "[" * 3000 + "]" * 3000
    deep += "}]}"
    env = raw_env(srv, tmp_path)
    try:
        env.reset()
        reply1, _, _, _, info1 = env.step(deep)
        srv.enqueue(Raw(DEEP_SSE))
        reply2, _, _, _, info2 = env.step(chat_body("hello", stream=True))
        trajectory = json.dumps(env.unwrapped.trajectory.to_dict())
    finally:
        env.close()
    assert json.loads(reply1)["status"] == 200 and info1["error_type"] == ""
    assert json.loads(reply2)["bytes"] == len(DEEP_SSE)  # the harness got it whole
    (call1,) = model_calls(info1)
    (call2,) = model_calls(info2)
    kinds = [e["type"] for e in info1["events"] if e["type"].startswith("llm_")]
    assert kinds == ["llm_request", "llm_response"]
    assert (call1["outcome"], call1["request"], call1["request_text"]) == ("unparsed", None, deep)
    assert (call2["outcome"], call2["text"]) == ("unparsed", "hi")
    assert "nested deeper" in call1["error"] and "nested deeper" in call2["error"]
    assert trajectory.count('"outcome": "unparsed"') == 2


@pytest.mark.timeout(60)
def test_echoed_credentials_reach_neither_the_harness_nor_the_trajectory(
    srv: ScriptedModelServer, tmp_path: Path
) -> None:
    env = raw_env(srv, tmp_path)
    try:
        env.reset()
        token = proxy_token(env)
        srv.enqueue(Echo(401))
        reply, _, _, _, info = env.step(chat_body("hello"))
        trajectory = json.dumps(env.unwrapped.trajectory.to_dict())
    finally:
        env.close()
    seen = json.loads(reply)
    assert seen["status"] == 401 and seen["headers"]["x-echo-credential"] == "Bearer [redacted]"
    assert srv.requests()[0].headers["authorization"] == f"Bearer {REAL_KEY}"  # it was echoed
    for text in (reply, trajectory, json.dumps(info["events"])):
        assert REAL_KEY not in text and token not in text
    (call,) = model_calls(info)
    assert call["outcome"] == "refused" and "[redacted]" in call["body"]


@pytest.mark.timeout(60)
def test_capture_max_bytes_caps_the_record_not_the_answer(
    srv: ScriptedModelServer, tmp_path: Path
) -> None:
    env = raw_env(srv, tmp_path, capture_max_bytes=2000)
    try:
        env.reset()
        srv.reply("word " * 3000)
        reply, _, _, _, info = env.step(chat_body("x" * 5000, stream=True))
    finally:
        env.close()
    got = json.loads(reply)["bytes"]
    (call,) = model_calls(info)
    assert call["truncated"] and call["answer_bytes"] == got > 100_000
    assert sum(len(e["data"]) for e in call["events"]) <= 2000
    assert call["request"] is None and len(call["request_text"]) == 2000
    assert call["request_bytes"] == len(chat_body("x" * 5000, stream=True))
