"""The real-CLI tests' builder: a model-mode env over one installed CLI (``make_env``).

Each test module parametrizes ``cli`` over the CLIs it drives (``support.cli.CLIS``);
turn-mode envs over a CLI are ``support.cli.cli_env``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.cli import CLIS, Calls, cli_path

from gym_harness import HarnessEnv
from gym_harness.harnesses.base import Harness


@pytest.fixture
def make_env(monkeypatch: pytest.MonkeyPatch, cli: str) -> Callable[..., HarnessEnv]:
    """``make_env(calls, prompt, **changes)``: a model-mode env over the real CLI ``cli``.

    The env offers ``calls``' tools and one task with ``prompt``; ``changes`` are env or
    adapter keywords over the defaults below. ``harness=`` gives an adapter instance of the
    test's own instead of ``cli`` with model ``m1`` and the installed executable.
    """
    command, key_var = CLIS[cli]
    # A dummy key: the env gives the CLI its endpoint's own, and no real one may leak in.
    monkeypatch.setenv(key_var, "test-key")
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    executable = cli_path(command)

    def make(
        calls: Calls, prompt: str, *, harness: Harness | None = None, **changes: Any
    ) -> HarnessEnv:
        own: dict[str, Any] = {} if harness else {"model": "m1", "executable": executable}
        options: dict[str, Any] = {
            "startup_timeout_s": 60,
            "turn_timeout_s": 120,
            "idle_timeout_s": 90,
            **own,
            **changes,
        }
        return HarnessEnv(
            harness or cli,
            mode="model",
            tools=calls.tools(),
            tasks=[{"id": "t", "prompt": prompt}],
            **options,
        )

    return make
