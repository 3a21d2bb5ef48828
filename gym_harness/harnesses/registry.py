"""The registry of harness names: ``HARNESSES``, ``harness_class``, ``make_harness``.

Adapter modules are imported only when a harness is asked for by name, so
``import gym_harness`` stays cheap.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Sequence
from typing import Any

from gym_harness.config import FIELD_NAMES
from gym_harness.errors import ConfigError
from gym_harness.harnesses.base import Harness
from gym_harness.utils.imports import import_attr

__all__ = ["HARNESSES", "closest_name", "harness_class", "make_harness"]

#: Registered harness names and where their classes live.
HARNESSES: dict[str, str] = {
    "command": "gym_harness.harnesses.line:CommandHarness",
    "reference": "gym_harness.harnesses.line:ReferenceHarness",
    "claude_code": "gym_harness.harnesses.claude_code:ClaudeCodeHarness",
    "codex": "gym_harness.harnesses.codex:CodexHarness",
    "acp": "gym_harness.harnesses.acp:ACPHarness",
    "opencode": "gym_harness.harnesses.acp_presets:OpenCodeHarness",
    "qwen_code": "gym_harness.harnesses.acp_presets:QwenCodeHarness",
    "gemini_cli": "gym_harness.harnesses.acp_presets:GeminiCLIHarness",
    "claude_agent_acp": "gym_harness.harnesses.acp_presets:ClaudeAgentACPHarness",
    "codex_acp": "gym_harness.harnesses.acp_presets:CodexACPHarness",
}


def harness_class(name: str) -> type[Harness]:
    """Return the adapter class registered as ``name``.

    Raises:
        ConfigError: No harness has that name.
    """
    try:
        target = HARNESSES[name]
    except KeyError:
        raise ConfigError(
            f"Unknown harness {name!r}; registered harnesses: {sorted(HARNESSES)}, "
            "or pass a Harness instance."
        ) from None
    cls: type[Harness] = import_attr(target, "harness")
    return cls


def make_harness(
    harness: Harness | str, options: dict[str, Any], env_class: type | None = None
) -> Harness:
    """Return ``harness`` itself, or the registered harness built with ``options``.

    Args:
        harness: A ``Harness`` instance or a registered name.
        options: Keywords for the harness's constructor.
        env_class: The env class whose keyword-only parameters the error for an unknown
            keyword lists with the harness's own.

    Raises:
        ConfigError: An unknown name, options given with an instance, or options the
            harness's constructor does not take (the message suggests the closest
            keyword and lists every one accepted).
    """
    if isinstance(harness, Harness):
        if options:
            note = " Harness options go to the Harness you construct, not to HarnessEnv."
            raise ConfigError(_unknown_keywords(sorted(options), [], "", env_class, note))
        return harness
    if not isinstance(harness, str):
        raise ConfigError(f"harness must be a Harness or a registered name, got {harness!r}.")
    cls = harness_class(harness)
    params = inspect.signature(cls).parameters
    unknown = sorted(k for k in options if k not in params)
    if unknown:
        accepted = sorted(k for k in params if k not in ("self", "args", "kwargs"))
        raise ConfigError(_unknown_keywords(unknown, accepted, harness, env_class))
    try:
        return cls(**options)
    except TypeError as exc:
        raise ConfigError(f"Bad options for the {harness!r} harness: {exc}.") from exc


def _keyword_only(callable_: Any) -> list[str]:
    params = inspect.signature(callable_).parameters.values()
    return [param.name for param in params if param.kind is param.KEYWORD_ONLY]


def closest_name(name: str, known: Sequence[str]) -> str | None:
    """The name in ``known`` that ``name`` most likely misspells, if one is close enough."""
    found = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return found[0] if found else None


def _unknown_keywords(
    unknown: list[str],
    harness_options: list[str],
    harness: str,
    env_class: type | None,
    note: str = "",
) -> str:
    """The error for keywords nobody takes: on its first line the closest known names, on
    the next every known one."""
    env_options = [] if env_class is None else sorted(_keyword_only(env_class))
    known = [*env_options, *harness_options, *sorted(FIELD_NAMES)]
    hints = [
        f"did you mean {close!r} for {name!r}?"
        for name in unknown
        if (close := closest_name(name, known)) is not None
    ]
    owner = f"the {harness!r} harness" if harness else "a Harness instance"
    first = f"Unknown keyword(s) {unknown} for HarnessEnv with {owner}"
    first += (f": {' '.join(hints)}" if hints else ".") + note
    parts = [f"HarnessEnv takes {env_options};"]
    if harness_options:
        parts.append(f"the {harness!r} harness takes {harness_options};")
    parts.append(f"and every HarnessConfig field {sorted(FIELD_NAMES)}.")
    return first + "\n" + " ".join(parts)
