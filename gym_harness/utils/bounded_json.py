"""The one bounded JSON parser for everything a harness writes.

Harness output is untrusted: a model with a shell can print a line nested a
thousand deep (``json.loads`` then raises ``RecursionError``, which is not a
``ValueError``), a number of ten thousand digits, or a line longer than
``max_line_bytes`` (cut while it is read, see ``gym_harness.utils.lines``). Every
place that parses what a harness wrote (adapters' ``feed``, the model proxy's
view of its requests) goes through ``loads`` here, which raises only
``JSONBoundError`` / ``ValueError`` and whose message names the bound a value broke.

Bounds: nesting depth ``MAX_DEPTH``; integer size is Python's own
``sys.get_int_max_str_digits()`` (a ``ValueError`` from ``json.loads``); line
size is ``HarnessConfig.max_line_bytes`` (the line is cut before it gets here).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from gym_harness.utils.lines import CUT_PATTERN

__all__ = ["MAX_DEPTH", "JSONBoundError", "loads", "nesting", "parse_object"]

#: Deepest nesting of arrays and objects accepted; deeper is a protocol error. Real
#: harness messages (JSON-RPC with tool arguments and schemas) stay far below it, and
#: everything downstream (events, pickling to vector workers, JSON export) stays safe.
MAX_DEPTH = 64

#: A JSON string; an unterminated one runs to the end. It always matches once it starts,
#: so no start position is tried twice: linear time on any input.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*\\?(?:"|\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
#: Bracket -> +1 (open) or -1 (close, as int8 0xff).
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
#: The stdlib's own scanner (C where available), with ``json.loads``'s default settings:
#: a line that is exactly one JSON value parses in one call, without the three Python
#: frames and two whitespace regexes ``json.loads`` adds (this is every line of a step).
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


class JSONBoundError(ValueError):
    """A JSON text breaks a bound (nesting depth, line size); the message names it."""


def loads(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` that never recurses past ``max_depth`` and raises only ``ValueError``.

    Args:
        text: One JSON document (a harness's output line, a request body).
        max_depth: Deepest nesting of arrays and objects accepted.

    Returns:
        The parsed value.

    Raises:
        JSONBoundError: The text nests deeper than ``max_depth``, or it is a line
            that was cut at ``max_line_bytes`` (and so is not whole).
        ValueError: Anything else that is not JSON (``json.JSONDecodeError``, an
            integer longer than Python's digit limit, invalid UTF-8 in bytes).
    """
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8")
    # The bracket count first, inline: most lines have few brackets (the hot path).
    brackets = text.count("[") + text.count("{")
    if brackets > max_depth and (depth := _depth(text, max_depth)) > max_depth:
        raise JSONBoundError(
            f"JSON nested {depth} levels deep, past the bound of {max_depth} (MAX_DEPTH)"
        )
    try:
        try:
            value, end = _SCAN(text, 0)
        except StopIteration:
            end = -1
        if end == len(text):
            return value
        # Whitespace around it, extra data, nothing at all: json.loads gives its own
        # verdict and message (the same value, or the same error, as without this path).
        return json.loads(text)
    except RecursionError as exc:  # unreachable after the depth check; kept as a guard
        raise JSONBoundError(f"JSON nested past the recursion limit: {exc}") from None
    except ValueError:
        cut = CUT_PATTERN.search(text)
        if cut is not None:
            raise JSONBoundError(
                f"a line longer than max_line_bytes (its last {cut.group(1)} bytes were cut "
                "while it was read); raise max_line_bytes if the harness writes such lines"
            ) from None
        raise


def parse_object(line: str) -> tuple[dict[str, Any] | None, str]:
    """Parse ``line`` as one JSON object.

    Returns:
        ``(obj, "")``, or ``(None, why)`` when the line is not one JSON object
        (``why`` names the broken bound, where one was broken).
    """
    try:
        obj = loads(line)
    except json.JSONDecodeError:
        return None, "not JSON"
    except ValueError as exc:  # a bound: depth, a cut line, Python's integer digit limit
        return None, str(exc)
    if not isinstance(obj, dict):
        return None, f"a JSON {type(obj).__name__}, not an object"
    return obj, ""


def nesting(text: str, max_depth: int = MAX_DEPTH) -> int:
    """An upper bound of how deep ``text`` (whole JSON, or a piece of it) nests.

    0 when it cannot pass ``max_depth`` (too few brackets); a piece that starts inside
    a value counts from there (its closing brackets do not count below 0).
    """
    return _depth(text, max_depth)


def _depth(text: str, max_depth: int) -> int:
    """An upper bound of the nesting ``json.loads`` would reach in ``text``.

    Cheap on the hot path: a line with at most ``max_depth`` brackets cannot nest
    deeper. Otherwise strings are removed first (brackets inside them do not
    nest); on a valid prefix the removed strings are exactly JSON's, so the
    count is never below what the parser would reach.
    """
    if text.count("[") + text.count("{") <= max_depth:
        return 0
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    steps = np.frombuffer(brackets.encode("ascii").translate(_STEPS), dtype=np.int8)
    return int(np.cumsum(steps, dtype=np.int64).max())
