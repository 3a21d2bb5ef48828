"""Every CLI offers the env's tools in model mode, whatever the model name.

``gymnasium.make("gym_harness/<CLI>-v0", mode="model")`` with no ``model=``: the CLI
runs with its own default model name, in the loopback-only namespace, and its first
model call (the first observation) must list the env's tool under the name the CLI
gives it. A model name the CLI does not know must do the same.
"""

from __future__ import annotations

import json
from typing import Any

import gymnasium
import pytest
from support.cli import CLIS, Calls, cli_path, real_cli

from gym_harness import HarnessEnv

#: The gymnasium id of each CLI harness.
IDS = {
    "claude_code": "gym_harness/ClaudeCode-v0",
    "codex": "gym_harness/Codex-v0",
    "opencode": "gym_harness/OpenCode-v0",
    "qwen_code": "gym_harness/QwenCode-v0",
    "gemini_cli": "gym_harness/GeminiCLI-v0",
}


def offered(observation: dict[str, Any]) -> list[str]:
    """The tool names the model call offers the policy."""
    return [str((t.get("function") or t).get("name")) for t in observation["tools"]]


def first_observation(cli: str, monkeypatch: pytest.MonkeyPatch, **changes: Any) -> list[str]:
    command, key_var = CLIS[cli]
    monkeypatch.setenv(key_var, "test-key")  # a dummy: the env gives the CLI its own
    env = gymnasium.make(
        IDS[cli],
        mode="model",
        executable=cli_path(command),
        tools=Calls().tools(),
        startup_timeout_s=60,
        turn_timeout_s=120,
        idle_timeout_s=90,
        **changes,
    )
    try:
        obs, info = env.reset(options={"task": {"id": "t", "prompt": "add 20 and 22"}})
        assert info["error_type"] == "", info
        observation = json.loads(obs)
        assert observation["request_id"], observation
        assert HarnessEnv.of(env).harness.model is changes.get("model")  # type: ignore[attr-defined]
        return offered(observation)
    finally:
        env.close()


@real_cli(timeout=240)
@pytest.mark.parametrize("cli", list(IDS))
def test_the_first_call_offers_the_env_tools_with_the_default_model(
    cli: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = first_observation(cli, monkeypatch)
    assert any(n.endswith("add") and "env" in n for n in names), names


@real_cli(timeout=240)
@pytest.mark.parametrize("cli", ["codex"])
def test_an_unknown_model_name_offers_them_too(cli: str, monkeypatch: pytest.MonkeyPatch) -> None:
    names = first_observation(cli, monkeypatch, model="not-a-known-model")
    assert any(n.endswith("add") and "env" in n for n in names), names
