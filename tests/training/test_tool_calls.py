"""``completion_action``: Hermes ``<tool_call>`` blocks of a sampled text as tool calls.

A block whose JSON calls an offered tool becomes a tool call; anything else (no JSON,
an unoffered tool, JSON nested past the decoder's depth) stays text, as the model wrote it.
"""

from __future__ import annotations

import pytest

from gym_harness.training import completion_action

OFFERS_ADD = {"tools": [{"type": "function", "function": {"name": "add"}}]}


def test_a_block_calling_an_offered_tool_is_a_tool_call() -> None:
    text = 'Sure. <tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>'
    assert completion_action(text, OFFERS_ADD) == {
        "content": "Sure.",
        "tool_calls": [{"name": "add", "arguments": {"a": 1}}],
    }


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        '{"name": "sub", "arguments": {}}',
        '{"name": "add", "arguments": [1]}',
        "[" * 100_000,  # json raises RecursionError here, not ValueError
        '{"name": "add", "arguments": "' + "[" * 100_000 + '"}',
    ],
)
def test_a_block_that_calls_no_offered_tool_stays_text(body: str) -> None:
    text = f"<tool_call>{body}</tool_call>"
    assert completion_action(text, OFFERS_ADD) == {"content": text}
