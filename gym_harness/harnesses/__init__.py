"""Harness adapters, one module per wire dialect, and the registry of their names.

Adapter modules are imported only when a harness is asked for by name, so
``import gym_harness`` stays cheap.
"""

from __future__ import annotations

import inspect
from typing import Any

from gym_harness._imports import import_attr
from gym_harness.config import FIELD_NAMES
from gym_harness.errors import ConfigError
from gym_harness.harnesses.base import EpisodeContext, Feed, Harness

__all__ = ["HARNESSES", "EpisodeContext", "Feed", "Harness", "harness_class", "make_harness"]

#: Registered harness names and where their classes live.
HARNESSES: dict[str, str] = {
    "command": "gym_harness.harnesses.line:CommandHarness",
    "reference": "gym_harness.harnesses.line:ReferenceHarness",
    "claude_code": "gym_harness.harnesses.claude_code:ClaudeCodeHarness",
    "codex": "gym_harness.harnesses.codex:CodexHarness",
    "acp": "gym_harness.harnesses.acp:ACPHarness",
    "opencode": "gym_harness.harnesses.acp:OpenCodeHarness",
    "qwen_code": "gym_harness.harnesses.acp:QwenCodeHarness",
    "gemini_cli": "gym_harness.harnesses.acp:GeminiCLIHarness",
    "claude_agent_acp": "gym_harness.harnesses.acp:ClaudeAgentACPHarness",
    "codex_acp": "gym_harness.harnesses.acp:CodexACPHarness",
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


def make_harness(harness: Harness | str, options: dict[str, Any]) -> Harness:
    """Return ``harness`` itself, or the registered harness built with ``options``.

    Raises:
        ConfigError: An unknown name, options given with an instance, or options the
            harness's constructor does not take (the message lists the ones it does).
    """
    if isinstance(harness, Harness):
        if options:
            raise ConfigError(
                f"Unknown keyword(s) {sorted(options)}: HarnessEnv takes HarnessConfig fields "
                f"{sorted(FIELD_NAMES)}; harness options go to the Harness you construct."
            )
        return harness
    if not isinstance(harness, str):
        raise ConfigError(f"harness must be a Harness or a registered name, got {harness!r}.")
    cls = harness_class(harness)
    params = inspect.signature(cls).parameters
    unknown = sorted(k for k in options if k not in params)
    if unknown:
        accepted = sorted(k for k in params if k not in ("self", "args", "kwargs"))
        raise ConfigError(
            f"Unknown keyword(s) {unknown} for the {harness!r} harness; it accepts {accepted}, "
            f"and every HarnessConfig field {sorted(FIELD_NAMES)}."
        )
    try:
        return cls(**options)
    except TypeError as exc:
        raise ConfigError(f"Bad options for the {harness!r} harness: {exc}.") from exc
