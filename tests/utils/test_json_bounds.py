"""The bounded JSON parser (gym_harness.utils.bounded_json): it agrees with json.loads within its
bounds, and outside them raises only ValueError, never RecursionError."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gym_harness.utils.bounded_json import MAX_DEPTH, JSONBoundError, loads, parse_object
from gym_harness.utils.lines import LineSplitter

_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None, database=None)
@given(_values)
def test_agrees_with_json_loads_within_the_depth_bound(value: Any) -> None:
    text = json.dumps(value)
    assert _depth(value) <= MAX_DEPTH
    assert loads(text) == json.loads(text)


_JSONISH = '[]{}"\\:,0a \n'


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.text(alphabet=_JSONISH, max_size=400)
    | st.text(max_size=200)
    | st.builds(
        lambda depth, tail: "[" * depth + tail,  # deep enough for json.loads to recurse out
        st.integers(0, 3000),
        st.text(alphabet=_JSONISH, max_size=50),
    )
)
def test_any_text_parses_or_raises_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):  # anything else (RecursionError) fails the test
        loads(text)
    obj, why = parse_object(text)
    assert (obj is None) == bool(why)


@pytest.mark.parametrize("opener,closer", [("[", "]"), ('{"a":', "}")])
def test_nesting_past_the_bound_names_it(opener: str, closer: str) -> None:
    ok = opener * MAX_DEPTH + "0" + closer * MAX_DEPTH
    assert _depth(loads(ok)) == MAX_DEPTH
    deep = opener * 5000 + "0" + closer * 5000
    with pytest.raises(JSONBoundError, match=f"5000 levels deep, past the bound of {MAX_DEPTH}"):
        loads(deep)


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"text": "[" * 5000 + '\\"{' * 100})
    assert loads(text) == json.loads(text)


def test_a_cut_line_names_max_line_bytes() -> None:
    ((line, _),) = LineSplitter(16).feed(b'{"type":"text","text":"' + b"a" * 100 + b'"}\n')
    obj, why = parse_object(line)
    assert obj is None and "max_line_bytes" in why and "were cut" in why


def test_huge_integers_are_a_value_error_naming_the_limit() -> None:
    obj, why = parse_object('{"n":' + "9" * 10_000 + "}")
    assert obj is None and "digits" in why
