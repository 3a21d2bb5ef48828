"""The harness adapters' fixtures: the scripted model a real CLI talks to (``model``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.cli import adding_model
from support.model_server import ScriptedModelServer


@pytest.fixture
def model_key() -> str:
    """The API-key variable the CLI under test reads; a test module overrides it."""
    return "OPENAI_API_KEY"


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch, model_key: str) -> Iterator[ScriptedModelServer]:
    """A scripted model that calls ``add(20, 22)`` once, its key set in ``model_key``.

    ``ANTHROPIC_AUTH_TOKEN`` is removed: the user's own credentials cannot interfere.
    """
    yield from adding_model(monkeypatch, model_key, unset=("ANTHROPIC_AUTH_TOKEN",))
