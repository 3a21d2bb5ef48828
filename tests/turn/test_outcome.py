"""The README's outcome table and ``gym_harness.Outcome`` are one list, with the same flags."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gym_harness import Outcome

README = Path(__file__).resolve().parents[2] / "README.md"


def _rows() -> list[tuple[str, str, str]]:
    text = README.read_text(encoding="utf-8")
    table = text[text.index("### Outcomes") : text.index("### Info keys")]
    rows = re.findall(r"^\|[^|]*\| ([^|]+) \| ([^|]+) \| `\"([a-z_]*)\"` \|$", table, re.M)
    return [(value, terminated.strip(), truncated.strip()) for terminated, truncated, value in rows]


def test_the_readme_table_lists_every_outcome_and_no_other() -> None:
    assert {value for value, _, _ in _rows()} == {o.value for o in Outcome}


@pytest.mark.parametrize("value,terminated,truncated", [r for r in _rows() if r[0]])
def test_each_fault_sets_the_flag_the_table_gives(
    value: str, terminated: str, truncated: str
) -> None:
    outcome = Outcome(value)
    assert outcome.truncates == (truncated == "True")
    assert outcome.terminates == terminated.startswith("True")
    assert outcome.terminates != outcome.truncates


def test_a_clean_turn_sets_neither_flag_by_itself() -> None:
    assert not Outcome.OK.terminates and not Outcome.OK.truncates
    assert Outcome.OK == ""
