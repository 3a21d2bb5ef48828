"""Real-CLI envs check, before anything starts, that the CLI is installed and has a key.

The checks run at construction (``Harness.preflight``): a missing CLI names its npm
package and ``.ci/install-clis.sh``; a missing API key names the variable to set.
Nothing is spawned and no thread starts before they pass.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import psutil
import pytest
from support.cli import CLIS as SUPPORTED_CLIS

from gym_harness import ConfigError, HarnessEnv
from gym_harness.harnesses._common import NPM_PACKAGES

ROOT = Path(__file__).resolve().parents[2]

#: harness name -> (its command, the key variable its error must name)
CLIS = {
    **SUPPORTED_CLIS,
    "claude_agent_acp": ("claude-agent-acp", "ANTHROPIC_API_KEY"),
    "codex_acp": ("codex-acp", "OPENAI_API_KEY"),
}
KEY_VARS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY", "GEMINI_API_KEY")


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in KEY_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def installed(tmp_path: Path) -> dict[str, str]:
    """Executable stand-ins for every CLI (never run: the checks stop the env first)."""
    paths = {}
    for name, (command, _) in CLIS.items():
        path = tmp_path / command
        path.write_text("#!/bin/sh\nexit 1\n")
        path.chmod(0o755)
        paths[name] = str(path)
    return paths


def _nothing_started(threads_before: int) -> None:
    assert psutil.Process().children() == []
    assert threading.active_count() == threads_before


@pytest.mark.parametrize("name", sorted(CLIS))
def test_a_missing_api_key_fails_at_construction_naming_the_variable(
    name: str, installed: dict[str, str]
) -> None:
    threads = threading.active_count()
    with pytest.raises(ConfigError) as caught:
        HarnessEnv(name, executable=installed[name], base_url="http://127.0.0.1:9/v1")
    message = str(caught.value)
    key_var = CLIS[name][1]
    assert "needs an API key" in message and f"export {key_var}=" in message
    assert "api_key_env=" in message
    _nothing_started(threads)


@pytest.mark.parametrize("name", sorted(CLIS))
def test_a_missing_cli_says_how_to_install_it(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CLIS[name][1], "k")
    monkeypatch.setenv("PATH", "/nonexistent")
    threads = threading.active_count()
    with pytest.raises(ConfigError) as caught:
        HarnessEnv(name, base_url="http://127.0.0.1:9/v1")
    message = str(caught.value)
    assert f"npm install -g {NPM_PACKAGES[CLIS[name][0]]}" in message
    assert "bash .ci/install-clis.sh" in message
    assert f"pass executable='/abs/path/to/{CLIS[name][0]}'" in message  # Python's words
    _nothing_started(threads)


@pytest.mark.parametrize("name", sorted(CLIS))
def test_a_key_set_or_given_or_captured_passes(
    name: str, installed: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key_var = CLIS[name][1]
    base = {"executable": installed[name], "base_url": "http://127.0.0.1:9/v1"}
    HarnessEnv(name, **base, env={key_var: "k"}).close()  # in the harness's own env
    HarnessEnv(name, **base, capture=True, upstream="http://127.0.0.1:9").close()
    monkeypatch.setenv("MY_KEY", "k")
    HarnessEnv(name, **base, api_key_env="MY_KEY").close()
    monkeypatch.setenv(key_var, "k")
    HarnessEnv(name, **base).close()


def test_a_missing_cli_on_a_path_given_as_a_file() -> None:
    with pytest.raises(ConfigError, match="'/nonexistent/claude' is not an executable file"):
        HarnessEnv("claude_code", executable="/nonexistent/claude", env={"ANTHROPIC_API_KEY": "k"})


def test_opencode_without_an_endpoint_asks_for_a_model(installed: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="OpenCode needs a model: base_url="):
        HarnessEnv("opencode", executable=installed["opencode"])
    HarnessEnv("opencode", executable=installed["opencode"], model="anthropic/claude").close()


def test_install_hints_match_the_pinned_versions() -> None:
    pinned = json.loads((ROOT / ".ci" / "clis-package.json").read_text())["dependencies"]
    assert sorted(NPM_PACKAGES.values()) == sorted(f"{n}@{v}" for n, v in pinned.items())
