"""Property tests of the two parsers on the hot path: the line splitter that
cuts a harness's output into lines, and line protocol v1's ``feed``."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gym_harness.errors import ProtocolError
from gym_harness.harnesses.line import CommandSession
from gym_harness.records.events import EventType
from gym_harness.utils.lines import LineSplitter

LIMIT = 16


def split_whole(data: bytes, limit: int) -> list[str]:
    """The reference: split the whole stream at once, cutting long lines."""
    out = []
    parts = data.split(b"\n")
    for i, raw in enumerate(parts):
        if i == len(parts) - 1 and not raw:
            break
        if len(raw) > limit:
            out.append(f"{raw[:limit].decode('utf-8', 'replace')} …[cut {len(raw) - limit} bytes]")
        else:
            out.append(raw.removesuffix(b"\r").decode("utf-8", "replace"))
    return out


@given(st.binary(max_size=300), st.lists(st.integers(min_value=1, max_value=40), max_size=30))
def test_splitter_gives_the_same_lines_however_the_stream_is_chunked(
    data: bytes, cuts: list[int]
) -> None:
    splitter = LineSplitter(LIMIT)
    lines: list[str] = []
    pos = 0
    for size in cuts:
        lines += [text for text, _ in splitter.feed(data[pos : pos + size])]
        pos += size
    lines += [text for text, _ in splitter.feed(data[pos:])]
    lines += [text for text, _ in splitter.finish()]
    assert lines == split_whole(data, LIMIT)


@given(st.binary(max_size=200))
def test_splitter_never_holds_more_than_the_limit(data: bytes) -> None:
    splitter = LineSplitter(LIMIT)
    for byte in data:
        for _, held in splitter.feed(bytes([byte])):
            assert held <= LIMIT + 1
        assert len(splitter._pending) <= LIMIT


@given(st.text())
def test_a_line_that_is_not_a_json_object_is_a_protocol_error(line: str) -> None:
    try:
        obj = json.loads(line)
    except ValueError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("type"), str):
        assert CommandSession().feed(line).error_type == ""
    else:  # the turn runner maps ProtocolError to the protocol_error outcome
        with pytest.raises(ProtocolError, match="expected one JSON object with a 'type'"):
            CommandSession().feed(line)


@given(
    st.sampled_from(["text", "tool_call", "tool_result", "llm_usage", "error", "weird", "x"]),
    st.dictionaries(st.sampled_from(["text", "name", "value", "n"]), st.integers() | st.text()),
)
def test_every_typed_object_becomes_one_event(kind: str, fields: dict[str, object]) -> None:
    feed = CommandSession().feed(json.dumps({**fields, "type": kind}))
    (event,) = feed.events
    assert not feed.turn_complete and not feed.error_type
    if event.type is EventType.OTHER:
        assert event.data == {**fields, "type": kind}  # kept whole
    else:
        assert event.type.value == kind
        assert all(event.data[k] == v for k, v in fields.items())


@given(st.text(), st.booleans())
def test_turn_complete_carries_response_and_done(response: str, done: bool) -> None:
    line = json.dumps({"type": "turn_complete", "response": response, "done": done})
    feed = CommandSession().feed(line)
    assert (feed.turn_complete, feed.response, feed.done) == (True, response, done)
