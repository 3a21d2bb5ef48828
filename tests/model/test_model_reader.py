"""Incremental request reading: each call read from what the episode's call before it left.

Every reading is checked against a fresh, whole :func:`read_request` of the same body:
the observation (its text byte for byte), the parsed body, the tools and their wire
spelling must not depend on what came before. The bodies are grown from the real
requests under ``tests/data/model_requests`` (Claude Code, Codex, OpenCode, Qwen Code,
Gemini CLI), so each API's conversion, head (system prompt) and member order is covered.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym_harness.model import BadRequest, ModelRequest, read_request
from gym_harness.model.calls import CallKey
from gym_harness.model.request import MAX_REQUEST_DEPTH, RequestReader
from gym_harness.records.chat_format import CONVERSATION_KEYS

DATA = Path(__file__).parents[1] / "data" / "model_requests"
CLIS = ("claude", "codex", "opencode", "qwen_code", "gemini_cli")


def captured(cli: str) -> dict[str, Any]:
    return dict(json.loads(gzip.decompress((DATA / f"{cli}.json.gz").read_bytes())))


def grown(cli: str, lengths: range) -> tuple[str, str, list[dict[str, Any]]]:
    """The CLI's request with conversations of each length (its items, repeated)."""
    doc = captured(cli)
    body, path = doc["body"], doc["path"]
    key = CONVERSATION_KEYS[_api(path)]
    items = body[key]
    longer = items[:1] + items[1:] * 40
    return path, doc["query"], [{**body, key: longer[:n]} for n in lengths]


def _api(path: str) -> str:
    from gym_harness.records.exchanges import api_of

    return api_of(path)


def same_as_whole(got: ModelRequest, raw: bytes, path: str, query: str) -> None:
    whole = read_request(path, raw, query=query, request_id=got.request_id)
    assert whole is not None
    assert got.observation_text() == json.dumps(whole.observation(), ensure_ascii=False)
    assert got.observation() == whole.observation()
    assert got.body == json.loads(raw) == whole.body
    assert list(got.body) == list(json.loads(raw))  # the same member order
    assert got.wire_tools == whole.wire_tools
    assert (got.stream, got.sse, got.model, got.size) == (
        whole.stream,
        whole.sse,
        whole.model,
        whole.size,
    )


@pytest.mark.parametrize("cli", CLIS)
@pytest.mark.parametrize("compact", [False, True], ids=["spaced", "compact"])
def test_a_growing_conversation_reads_as_whole_reads_do(cli: str, compact: bool) -> None:
    path, query, bodies = grown(cli, range(1, 40, 2))
    separators = (",", ":") if compact else None
    reader = RequestReader()
    before: ModelRequest | None = None
    for i, body in enumerate(bodies):
        raw = json.dumps(body, separators=separators, ensure_ascii=False).encode()
        got = reader.read(path, raw, query=query, request_id=f"r{i}", episode=1)
        assert got is not None
        same_as_whole(got, raw, path, query)
        if before is not None:  # read on from the call before: its messages, unparsed
            assert got.messages[0] is before.messages[0]
            assert got.body["tools"] is before.body["tools"]
        before = got


@pytest.mark.parametrize("cli", CLIS)
def test_a_changed_prefix_is_read_whole(cli: str) -> None:
    """Compaction (earlier items rewritten), a rewritten system prompt, a shorter
    conversation: each is read whole, and as a whole read reads it."""
    path, query, bodies = grown(cli, range(8, 12))
    key = CONVERSATION_KEYS[_api(path)]
    reader = RequestReader()
    compacted = {**bodies[3], key: [bodies[3][key][0], *bodies[3][key][5:]]}
    shorter = bodies[0]
    system = dict(bodies[3])
    for name in ("system", "instructions", "systemInstruction"):
        if name in system:
            system[name] = {"parts": [{"text": "rewritten"}]} if cli == "gemini_cli" else "new"
    sequence = [*bodies, compacted, bodies[3], shorter, system, bodies[3]]
    for i, body in enumerate(sequence):
        raw = json.dumps(body).encode()
        got = reader.read(path, raw, query=query, request_id=f"r{i}", episode=1)
        assert got is not None
        same_as_whole(got, raw, path, query)


def test_a_system_prompt_after_the_messages_that_changes_is_converted_anew() -> None:
    """Claude Code sends ``system`` after ``messages``: the prefix matches, the head does not."""
    path, query, bodies = grown("claude", range(6, 8))
    reader = RequestReader()
    first = json.dumps(bodies[0]).encode()
    assert reader.read(path, first, request_id="a", episode=1) is not None
    changed = json.dumps({**bodies[1], "system": "a different system prompt"}).encode()
    got = reader.read(path, changed, request_id="b", episode=1)
    assert got is not None
    assert got.messages[0] == {"role": "system", "content": "a different system prompt"}
    same_as_whole(got, changed, path, query)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["append", "edit", "cut", "tools", "same"]),
            st.integers(0, 30),
            st.text(max_size=8),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_any_edit_sequence_reads_as_whole_reads_do(edits: list[tuple[str, int, str]]) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    tools: list[dict[str, Any]] = [{"type": "function", "function": {"name": "add"}}]
    reader = RequestReader()
    for i, (kind, at, text) in enumerate(edits):
        if kind == "append":
            messages = [*messages, {"role": "user", "content": text}]
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": f"c{i}", "function": {"name": "add", "arguments": "{}"}}],
                }
            )
            messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": text})
        elif kind == "edit":
            messages = list(messages)
            messages[at % len(messages)] = {"role": "user", "content": text}
        elif kind == "cut":
            messages = messages[: max(1, at % (len(messages) + 1))]
        elif kind == "tools":
            tools = [*tools, {"type": "function", "function": {"name": text or "t"}}]
        raw = json.dumps({"model": "m", "messages": messages, "tools": tools}).encode()
        got = reader.read("/v1/chat/completions", raw, request_id=f"r{i}", episode=1)
        assert got is not None
        same_as_whole(got, raw, "/v1/chat/completions", "")


def test_responses_calls_that_extend_an_assistant_message_never_change_an_earlier_one() -> None:
    """Responses ``function_call`` items join the assistant message before them: the
    earlier observation keeps its own message."""
    reader = RequestReader()
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "hi"}]
    seen = []
    for i in range(3):
        items = [*items, {"type": "function_call", "call_id": f"c{i}", "name": "add"}]
        raw = json.dumps({"model": "m", "input": items}).encode()
        got = reader.read("/v1/responses", raw, request_id=f"r{i}", episode=1)
        assert got is not None
        same_as_whole(got, raw, "/v1/responses", "")
        seen.append(got.observation_text())
    assert [len(json.loads(s)["messages"][-1]["tool_calls"]) for s in seen] == [1, 2, 3]
    assert seen[0] == read_request("/v1/responses", json.dumps(
        {"model": "m", "input": items[:2]}).encode(), request_id="r0").observation_text()  # type: ignore[union-attr]  # fmt: skip


def test_what_follows_a_known_prefix_is_checked_as_a_whole_body_is() -> None:
    """Bad JSON, a non-object item and nesting past the bound after a known prefix get
    the whole read's BadRequest, message for message."""
    path = "/v1/chat/completions"
    head = [{"role": "user", "content": "x" * 100}]
    deep: Any = "leaf"
    for _ in range(MAX_REQUEST_DEPTH):
        deep = [deep]
    good = json.dumps({"model": "m", "messages": head}).encode()
    bad = [
        good[:-2] + b", {]}",  # not JSON
        json.dumps({"model": "m", "messages": [*head, "a string"]}).encode(),
        json.dumps({"model": "m", "messages": [*head, {"content": deep}]}).encode(),
        json.dumps({"model": "m", "messages": head}).encode() + b" extra",
    ]
    for raw in bad:
        reader = RequestReader()
        assert reader.read(path, good, request_id="a", episode=1) is not None
        with pytest.raises(BadRequest) as whole:
            read_request(path, raw, request_id="b")
        with pytest.raises(BadRequest) as incremental:
            reader.read(path, raw, request_id="b", episode=1)
        assert str(incremental.value) == str(whole.value)


def test_duplicate_keys_read_as_json_loads_reads_them() -> None:
    path = "/v1/chat/completions"
    one = '{"model": "m", "messages": [{"role": "user", "content": "a"}]'
    reader = RequestReader()
    for raw in (
        one + "}",
        one + ', "model": "n", "messages": [{"role": "user", "content": "b"}]}',
        one + ', "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "c"}]}',
    ):
        got = reader.read(path, raw.encode(), request_id="r", episode=1)
        assert got is not None
        same_as_whole(got, raw.encode(), path, "")


def test_bases_are_bounded_and_forgotten_with_the_episode() -> None:
    """A harness that sends many unrelated conversations leaves at most MAX_BASES bases,
    and a new episode starts with none."""
    from gym_harness.model._reader import MAX_BASES

    path = "/v1/chat/completions"
    reader = RequestReader()
    for i in range(3 * MAX_BASES):
        body = {"model": "m", "messages": [{"role": "user", "content": f"conversation {i}"}]}
        reader.read(path, json.dumps(body).encode(), request_id=f"r{i}", episode=1)
        assert reader.kept()[0] <= MAX_BASES
    assert reader.kept()[0] == MAX_BASES
    body = {"model": "m", "messages": [{"role": "user", "content": "conversation 0"}]}
    reader.read(path, json.dumps(body).encode(), request_id="r", episode=2)
    assert reader.kept()[0] == 1


def test_a_base_past_the_character_bound_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    from gym_harness.model import _reader

    monkeypatch.setattr(_reader, "MAX_BASE_CHARS", 1000)
    reader = RequestReader()
    small = {"model": "m", "messages": [{"role": "user", "content": "x" * 100}]}
    large = {"model": "m", "messages": [{"role": "user", "content": "y" * 2000}]}
    reader.read("/v1/chat/completions", json.dumps(small).encode(), request_id="a", episode=1)
    reader.read("/v1/chat/completions", json.dumps(large).encode(), request_id="b", episode=1)
    count, chars = reader.kept()
    assert count == 1 and chars <= 1000


def test_call_keys_match_a_retry_and_nothing_else() -> None:
    path = "/v1/messages"
    reader = RequestReader()

    def key(body: dict[str, Any]) -> CallKey:
        request = reader.read(path, json.dumps(body).encode(), request_id="r", episode=1)
        assert request is not None
        return CallKey.of(path, request)

    messages = [{"role": "user", "content": "hi"}]
    call = key({"model": "m", "max_tokens": 10, "messages": messages, "stream": True})
    unstreamed = key({"model": "m", "max_tokens": 10, "messages": messages})
    more_tokens = key({"model": "m", "max_tokens": 99, "messages": messages, "stream": True})
    other = key({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "ho"}]})
    assert call.matches(unstreamed, conversation_only=False)
    assert not call.matches(more_tokens, conversation_only=False)
    assert call.matches(more_tokens, conversation_only=True)
    assert not call.matches(other, conversation_only=True)
    assert call.cheap == other.cheap  # the same length: only the bodies tell them apart
