"""Harness adapters, one module per wire dialect, and the registry of their names.

Adapter modules are imported only when a harness is asked for by name, so
``import gym_harness`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from gym_harness.errors import ConfigError
from gym_harness.harnesses.base import EpisodeContext, Feed, Harness

__all__ = ["HARNESSES", "EpisodeContext", "Feed", "Harness", "harness_class"]

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
    module_name, _, attr = target.partition(":")
    cls: Any = getattr(importlib.import_module(module_name), attr)
    return cls
