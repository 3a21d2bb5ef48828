"""The suite tests' builder: a model-mode ``gym_harness/BFCL-v0`` (``bfcl_env``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import gymnasium
import pytest

from gym_harness.suites.bfcl import BFCLEnv


@pytest.fixture
def bfcl_env() -> Iterator[Callable[..., BFCLEnv]]:
    """``bfcl_env(category, **kwargs)``: a model-mode ``gym_harness/BFCL-v0`` on the
    reference harness, closed at the test's end."""
    made: list[gymnasium.Env[str, str]] = []

    def make(category: str = "base", **kwargs: Any) -> BFCLEnv:
        env = gymnasium.make("gym_harness/BFCL-v0", category=category, mode="model", **kwargs)
        made.append(env)
        unwrapped = env.unwrapped
        assert isinstance(unwrapped, BFCLEnv)
        return unwrapped

    yield make
    for env in made:
        env.close()
