"""``capture_tokens=True``: the proxy asks a vLLM-style upstream for the engine's token ids.

The upstream is the scripted model server (real HTTP on loopback), which answers
``return_token_ids`` as vLLM does (``prompt_token_ids`` at the top of the answer or of a
stream's first chunk, ``token_ids`` per choice or delta) and ``logprobs`` with one entry
per token; with ``token_ids=False`` it ignores the request, as a hosted API does. The
harness's client must get an ordinary answer (no token fields it did not ask for), the
record must keep the ids, and the episode's training trace must use them: main calls
trainable over their completion, a side call never, an upstream that ignored the request
text-level. The stripper itself is driven with hostile bodies (not JSON, an event with
no end, an answer past its bound): it never raises and never holds more than its bound.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from support import TOKEN_AGENT
from support.model_server import ScriptedModelServer, token_id

from gym_harness import HarnessEnv
from gym_harness.capture.proxy import ModelProxy
from gym_harness.capture.tokens import TokenStripper, ask_for_tokens
from gym_harness.errors import ConfigError

KEY_VAR = "GYM_TEST_TOKENS_KEY"
PIECES = ["you", " said:", " x", " y"]
TOKEN_FIELDS = ("prompt_token_ids", "token_ids", '"logprob"')


@pytest.fixture
def srv_options() -> dict[str, Any]:
    """The scripted server answers with text: no tool call."""
    return {}


def chat(proxy: ModelProxy, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        headers = {"authorization": f"Bearer {proxy.token}"}
        return client.post("/v1/chat/completions", json=body, headers=headers)


@pytest.mark.parametrize("stream", [False, True])
def test_the_upstream_is_asked_the_record_keeps_the_ids_the_harness_gets_none(
    srv: ScriptedModelServer, stream: bool
) -> None:
    body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "x y"}]}
    with ModelProxy(srv.base_url, request_tokens=True, timeout_s=5) as proxy:
        seen = chat(proxy, body)
        (record,) = proxy.drain()
    upstream = srv.requests()[-1].body
    assert upstream["return_token_ids"] is True and upstream["logprobs"] is True
    assert record.tokens_asked and record.logprobs_added
    assert list(record.token_ids) == [token_id(p) for p in PIECES]
    assert [lp.token for lp in record.logprobs] == PIECES
    assert len(record.prompt_token_ids) > 0 and all(lp.logprob <= 0 for lp in record.logprobs)
    # The harness's client gets an ordinary answer with the same text.
    assert seen.status_code == 200
    assert not any(f in seen.text for f in TOKEN_FIELDS), seen.text
    if stream:
        text = "".join(
            (json.loads(e.split("data: ", 1)[1])["choices"] or [{}])[0]
            .get("delta", {})
            .get("content")
            or ""
            for e in seen.text.split("\n\n")
            if e.startswith("data: {")
        )
        assert seen.text.rstrip().endswith("data: [DONE]")
    else:
        answer = seen.json()
        assert answer["choices"][0]["logprobs"] is None
        text = answer["choices"][0]["message"]["content"]
    assert text == "you said: x y" == record.text


def test_what_the_harness_asked_for_itself_stays_in_its_answer(srv: ScriptedModelServer) -> None:
    body = {"model": "m", "logprobs": True, "messages": [{"role": "user", "content": "x y"}]}
    with ModelProxy(srv.base_url, request_tokens=True, timeout_s=5) as proxy:
        seen = chat(proxy, body).json()
        (record,) = proxy.drain()
    assert record.tokens_asked and not record.logprobs_added
    assert [e["token"] for e in seen["choices"][0]["logprobs"]["content"]] == PIECES
    assert "token_ids" not in seen["choices"][0] and "prompt_token_ids" not in seen


def test_an_upstream_that_ignores_the_request_is_recorded_text_level() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x y"}]}
    with (
        ScriptedModelServer(token_ids=False) as srv,
        ModelProxy(srv.base_url, request_tokens=True, timeout_s=5) as proxy,
    ):
        assert chat(proxy, body).status_code == 200
        (record,) = proxy.drain()
    assert record.tokens_asked and record.token_ids == () and record.prompt_token_ids == ()


def test_without_capture_tokens_nothing_is_asked(srv: ScriptedModelServer) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    with ModelProxy(srv.base_url, timeout_s=5) as proxy:
        chat(proxy, body)
        (record,) = proxy.drain()
    assert "return_token_ids" not in srv.requests()[-1].body and not record.tokens_asked


def test_capture_tokens_without_capture_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"capture_tokens=True .* needs capture=True"):
        HarnessEnv("reference", capture_tokens=True)
    with pytest.raises(ConfigError, match="capture_tokens must be a bool"):
        HarnessEnv("reference", capture=True, upstream="http://127.0.0.1:9", capture_tokens=1)


# ---------------------------------------------------------------- the stripper, hostile input


def test_ask_for_tokens_leaves_what_it_cannot_read_alone() -> None:
    for body in (b"", b"not json", b"[1, 2]", b"[" * 100_000):
        assert ask_for_tokens(body) == (body, ())
    asked = {"return_token_ids": True, "logprobs": True, "messages": []}
    assert ask_for_tokens(json.dumps(asked).encode())[1] == ()
    sent, added = ask_for_tokens(b'{"messages": [], "logprobs": false}')
    assert added == ("return_token_ids", "logprobs") and json.loads(sent)["logprobs"] is True


def test_the_stripper_passes_through_what_is_no_json_and_bounds_what_it_holds() -> None:
    answer = (
        b'{"choices": [{"token_ids": [1], "logprobs": {"content": []}}], "prompt_token_ids": [2]}'
    )
    strip = TokenStripper(("return_token_ids", "logprobs"), streamed=False)
    assert strip.feed(answer[:10]) == b"" and strip.feed(answer[10:]) == b""
    assert json.loads(strip.end()) == {"choices": [{"logprobs": None}]}
    for raw in (b"<html>oops</html>", b"[" * 100_000, b'{"choices": 5}'):
        strip = TokenStripper(("return_token_ids",), streamed=False)
        assert strip.feed(raw) + strip.end() == raw
    # An event that never ends: held up to the bound, then everything passes as it came.
    strip = TokenStripper(("return_token_ids",), streamed=True, max_held=1024)
    sent = b"".join(strip.feed(b"data: " + b"x" * 300) for _ in range(10)) + strip.end()
    assert sent == b"".join([b"data: " + b"x" * 300] * 10)
    # A stream split anywhere: each event is rewritten whole, the rest untouched.
    events = (
        b'data: {"prompt_token_ids": [1], "choices": []}\r\n\r\n: keep-alive\n\ndata: [DONE]\n\n'
    )
    for cut in range(len(events)):
        strip = TokenStripper(("return_token_ids",), streamed=True)
        sent = strip.feed(events[:cut]) + strip.feed(events[cut:]) + strip.end()
        assert sent == b'data: {"choices": []}\r\n\r\n: keep-alive\n\ndata: [DONE]\n\n', cut


# ---------------------------------------------------------------- an episode's training trace


def agent_env(srv: ScriptedModelServer, tmp_path: Path, plain: bool) -> HarnessEnv:
    return HarnessEnv(
        "reference",
        policy="openai",  # the adapter then hands OPENAI_BASE_URL / OPENAI_API_KEY on
        model="m",
        command=[sys.executable, str(TOKEN_AGENT), *(["plain"] if plain else [])],
        capture=True,
        upstream=srv.base_url,
        capture_tokens=True,
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("plain", [True, False])
def test_the_trace_trains_main_calls_only_with_the_engines_ids(
    srv: ScriptedModelServer, tmp_path: Path, plain: bool
) -> None:
    env = agent_env(srv, tmp_path, plain)
    try:
        _, info = env.reset()
        assert info["error_type"] == "", info
        reply, _, _, _, info = env.step("x y")
        assert (reply, info["error_type"]) == ("you said: x y", ""), info
        (answers,) = [e["data"] for e in info["events"] if e["data"].get("type") == "answers"]
        trace = env.trajectory.training_trace()
    finally:
        env.close()
    assert "you said: x y" in answers["side"]  # the main answer's text is the reply
    for seen in (answers["side"], answers["main"]):
        assert not any(f in seen for f in TOKEN_FIELDS), seen
    assert trace["token_level"] is True and trace["text_level_calls"] == []
    side, main = trace["turns"]
    assert (side["metadata"]["side"], main["metadata"]["side"]) == (True, False)
    assert side["loss_mask"] == [0] * (len(side["prompt_token_ids"]) + len(PIECES))
    assert main["completion_token_ids"] == [token_id(p) for p in PIECES]
    assert len(main["per_token_logps"]) == len(PIECES)
    prompt = len(main["prompt_token_ids"])
    assert prompt > 0 and main["loss_mask"] == [0] * prompt + [1] * len(PIECES)
    assert main["request"]["messages"] == [{"role": "user", "content": "x y"}]


@pytest.mark.timeout(240)
def test_an_upstream_that_ignores_the_request_gives_a_text_level_trace(tmp_path: Path) -> None:
    with ScriptedModelServer(token_ids=False) as srv:
        env = agent_env(srv, tmp_path, plain=True)
        try:
            env.reset()
            _, _, _, _, info = env.step("x y")
            assert info["error_type"] == "", info
            trace = env.trajectory.training_trace()
        finally:
            env.close()
    assert trace["token_level"] is False and trace["turns"] == []
    whys = {(c["side"], c["why"]) for c in trace["text_level_calls"]}
    ignored = "the upstream ignored return_token_ids: it returned text only"
    assert whys == {(True, ignored), (False, ignored)}
