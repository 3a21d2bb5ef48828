"""The one configurable test env: a ``HarnessEnv`` over a test harness.

Tests vary the harness, its tools and task, and any env keyword; everything else is the
env's own default. Real-CLI envs are built by ``tests/cli/conftest.py``; the scripted
model server is the ``srv`` fixture of ``support.model_server``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from gym_harness import HarnessEnv
from support import LINE_AGENT, MODEL_AGENT

__all__ = ["PROMPT", "line_env", "model_env"]

#: The task prompt of a model-mode test env unless a test gives its own.
PROMPT = "what is 2+3?"


def line_env(mode: str = "echo", **kwargs: Any) -> HarnessEnv:
    """A turn-mode env over the line-protocol test harness (``support/line_agent.py``).

    Args:
        mode: The line agent's behaviour (``echo``, ``crash``, ...).
        **kwargs: Env keywords; ``command`` replaces the line agent.
    """
    kwargs.setdefault("command", [sys.executable, str(LINE_AGENT), mode])
    return HarnessEnv("command", **kwargs)


def model_env(
    kind: str, tools: list[Callable[..., Any]], *, prompt: str = PROMPT, **kwargs: Any
) -> HarnessEnv:
    """A model-mode env with one task, over the reference harness or the model agent.

    Args:
        kind: ``"command"`` (``support/scripts/model_agent.py``) or ``"reference"``.
        tools: The env's tools.
        prompt: The one task's prompt (the model agent reads words such as ``side:``).
        **kwargs: Env keywords (``reward_fn``, timeouts, ``upstream``, ...).
    """
    options: dict[str, Any] = {
        "mode": "model",
        "tools": tools,
        "tasks": [{"id": "t", "prompt": prompt}],
        **kwargs,
    }
    if kind == "command":
        return HarnessEnv("command", command=[sys.executable, str(MODEL_AGENT)], **options)
    return HarnessEnv(kind, **options)
