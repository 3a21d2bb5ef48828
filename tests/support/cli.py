"""Shared machinery of the real-CLI tests (Claude Code, Codex, the ACP agents).

`.ci/install-clis.sh` installs the CLIs at exact versions into `.clis/` (git-ignored).
A test that needs one calls `cli_path(name)`; it skips, with the reason, only
where npm itself is missing, and fails loudly where npm is there but the CLI is not.

The scenarios every CLI goes through live here once: an env tool that records its
calls (`Calls`), the scripted model that asks for it (`adding_model`), and the
episodes (`two_turns`, `stalled_turn`, `killed_turn`, `tree_after_close`,
`first_turn` for a broken MCP config). Each helper resets, drives and closes the
env; the tests keep the checks that tell one outcome from another.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from gym_harness import HarnessEnv
from gym_harness.harnesses import EpisodeContext, Harness
from gym_harness.harnesses.claude_code import ClaudeCodeHarness
from gym_harness.harnesses.codex import CodexHarness
from support.model_server import LoggedRequest, ScriptedModelServer

ROOT = Path(__file__).resolve().parents[2]
CLI_BIN = ROOT / ".clis" / "node_modules" / ".bin"
#: The bridge token offline tests put in their context (it must never reach argv).
TOKEN = "bridge-secret-token"

#: The five CLI harnesses (by name): the CLI command in ``.clis`` and the API-key variable
#: it reads.
CLIS: dict[str, tuple[str, str]] = {
    "claude_code": ("claude", "ANTHROPIC_API_KEY"),
    "codex": ("codex", "OPENAI_API_KEY"),
    "opencode": ("opencode", "OPENAI_API_KEY"),
    "qwen_code": ("qwen", "OPENAI_API_KEY"),
    "gemini_cli": ("gemini", "GEMINI_API_KEY"),
}

#: The two user messages of `two_turns`; the scripted model adds 20 and 22 in the first.
FIRST, SECOND = "please add the numbers", "second message"

_Test = TypeVar("_Test", bound=Callable[..., Any])


def cli_path(name: str) -> str:
    """Return the path of the installed CLI ``name`` (e.g. "claude", "codex").

    Skips the test when npm is not installed; fails when npm is there but the
    CLI is missing (run `bash .ci/install-clis.sh`).
    """
    path = CLI_BIN / name
    if path.exists():
        return str(path)
    if shutil.which("npm") is None:
        pytest.skip(f"npm is not installed, so the {name} CLI cannot be installed")
    pytest.fail(f"{name} CLI not found at {path}; run `bash .ci/install-clis.sh` first")
    raise AssertionError  # unreachable; pytest.fail raises


def real_cli(timeout: int) -> Callable[[_Test], _Test]:
    """Mark a test as driving a real CLI: ``cli``, ``slow``, a ``timeout`` and the
    loopback-only netns."""

    def mark(test: _Test) -> _Test:
        test = pytest.mark.usefixtures("isolated_network")(test)
        test = pytest.mark.timeout(timeout)(test)
        return pytest.mark.slow(pytest.mark.cli(test))

    return mark


def episode_ctx(tmp_path: Path, **changes: Any) -> EpisodeContext:
    """An offline episode context in ``tmp_path`` (bridge on a dead port, env tool ``add``)."""
    (tmp_path / "home").mkdir(mode=0o700, exist_ok=True)
    (tmp_path / "ws").mkdir(exist_ok=True)
    fields: dict[str, Any] = {
        "episode_id": "ep1",
        "workspace": tmp_path / "ws",
        "home": tmp_path / "home",
        "bridge_url": "http://127.0.0.1:9/mcp",
        "bridge_token": TOKEN,
        "tool_names": ("add",),
        **changes,
    }
    return EpisodeContext(**fields)


class Calls:
    """Env tools that record their calls (asserted on the tool's side).

    The tool runs in the bridge's thread, the test reads ``seen`` in its own: the lock
    guards the list.
    """

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def tools(self) -> list[Any]:
        def add(a: int, b: int) -> int:
            """Add two integers."""
            with self.lock:
                self.seen.append((a, b))
            return a + b

        return [add]


def adding_model(
    monkeypatch: pytest.MonkeyPatch, key_var: str, unset: tuple[str, ...] = ()
) -> Iterator[ScriptedModelServer]:
    """Body of a ``model`` fixture: a scripted model that calls ``add(20, 22)`` once.

    Args:
        monkeypatch: The test's monkeypatch; sets ``key_var`` (passed through by name).
        key_var: The CLI's API-key variable, set to ``"test-key"``.
        unset: Variables removed so the user's own credentials cannot interfere.
    """
    monkeypatch.setenv(key_var, "test-key")
    for name in unset:
        monkeypatch.delenv(name, raising=False)
    with ScriptedModelServer(tool="add", arguments={"a": 20, "b": 22}) as srv:
        yield srv


def tier_settings(
    tier: str, model: ScriptedModelServer, key_var: str | None = None
) -> dict[str, Any]:
    """The env settings that run a real CLI's turns under sandbox ``tier``: under
    ``"strict"`` the harness's loopback holds only the env's endpoints, so it reaches
    ``model`` through the env's capture proxy (``capture=True``, ``upstream=`` its origin),
    which sends the key in ``key_var`` on."""
    if tier == "strict":
        from gym_harness.process import sandbox

        missing = sandbox.report("strict")["missing"]
        if missing:
            pytest.skip(f"strict is not available here: {missing}")
        return {
            "sandbox": "strict",
            "capture": True,
            "upstream": model.base_url,
            "upstream_api_key_env": key_var,
        }
    return {"sandbox": tier}


def cli_env(harness: Harness | str, calls: Calls, **config: Any) -> HarnessEnv:
    """A HarnessEnv over ``harness`` with ``calls``' tools and the real-CLI timeouts."""
    config.setdefault("turn_timeout_s", 60)
    config.setdefault("idle_timeout_s", 30)
    return HarnessEnv(harness, tools=calls.tools(), **config)


@dataclass(frozen=True)
class Turn:
    """What `first_turn` saw: the reset's info, then the step's results."""

    reset_info: dict[str, Any]
    reply: str
    terminated: bool
    truncated: bool
    info: dict[str, Any]

    @property
    def outcome(self) -> tuple[bool, bool, str]:
        """``(terminated, truncated, error_type)`` of the step."""
        return self.terminated, self.truncated, self.info["error_type"]


def first_turn(env: HarnessEnv, message: str, before: Callable[[], object] | None = None) -> Turn:
    """Reset ``env``, call ``before()``, step once with ``message``, close ``env``."""
    try:
        _, reset_info = env.reset()
        if before is not None:
            before()
        reply, _, terminated, truncated, info = env.step(message)
        return Turn(reset_info, reply, terminated, truncated, info)
    finally:
        env.close()


@dataclass(frozen=True)
class TwoTurns:
    """The first turn of `two_turns` and the last request the model received."""

    reply: str
    info: dict[str, Any]
    last_request: LoggedRequest


def two_turns(
    env: HarnessEnv, calls: Calls, model: ScriptedModelServer, api: str | None = None
) -> TwoTurns:
    """Two turns: the first calls ``add`` through the bridge, the second keeps the context.

    Args:
        env: A fresh env over the CLI and ``calls``' tools; closed on return.
        calls: The tools' record.
        model: The scripted model (`adding_model`).
        api: The wire API whose last request must still hold turn 1 (``None``: any).
    """
    try:
        _, info = env.reset()
        assert info["error_type"] == "", info
        reply, _, terminated, truncated, info = env.step(FIRST)
        assert (terminated, truncated, info["error_type"]) == (False, False, ""), info
        assert calls.seen == [(20, 22)]  # seen on the tool's side, through the bridge
        assert "42" in reply
        assert info["tool_calls"] == 1
        reply2, _, _, _, info2 = env.step(SECOND)
        assert info2["error_type"] == "", info2
        assert SECOND in reply2
        assert calls.seen == [(20, 22)]
        # The agent's own turns offer tools; side requests (claude-agent-acp titles the
        # session with a model call of its own, at any moment) offer none.
        turns = [r for r in model.requests(api) if isinstance(r.body, dict) and r.body.get("tools")]
        last = turns[-1]
        sent = json.dumps(last.body)
        assert FIRST in sent and SECOND in sent  # turn 1 is still in the context
        return TwoTurns(reply, info, last)
    finally:
        env.close()


def stalled_turn(env: HarnessEnv, model: ScriptedModelServer) -> Turn:
    """A first turn while the model accepts every request and answers none."""
    try:
        return first_turn(env, "hello", before=model.stall)
    finally:
        model.release()


def process_tree(pid: int) -> list[int]:
    """``pid`` and every descendant it has now."""
    return [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]


def killed_turn(env: HarnessEnv, model: ScriptedModelServer) -> tuple[Turn, list[int]]:
    """A first turn during which the CLI gets SIGKILL once the model holds its request.

    Only the pid the env started is killed, never its descendants: a launcher's
    child that keeps stdout open must not hide the crash.

    Args:
        env: A fresh env; closed on return.
        model: The scripted model; stalled for the turn, released after.

    Returns:
        The turn and the pid that was killed.
    """
    pids: list[int] = []

    def kill_when_stalled() -> None:
        if model.wait_stalled(1, timeout=30):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # gone with its parent
                    os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_when_stalled)

    def arm() -> None:
        assert env.process is not None and env.process.pid is not None
        pids.append(env.process.pid)
        model.stall()
        killer.start()

    try:
        return first_turn(env, "hello", before=arm), pids
    finally:
        model.release()
        if killer.ident is not None:
            killer.join(timeout=35)


def tree_after_close(env: HarnessEnv) -> list[int]:
    """Reset, one turn, close; return the CLI's process tree as it was before the close."""
    try:
        env.reset()
        env.step("hello")
        assert env.process is not None and env.process.pid is not None
        return process_tree(env.process.pid)
    finally:
        env.close()


def assert_gone(pids: list[int]) -> None:
    """Every pid has exited (a zombie not yet reaped by its parent counts as exited)."""
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


PROMPT = "please add the numbers"


def env_tool(observation: dict[str, Any]) -> str | None:
    """The env tool ``add`` under the name this CLI gave it."""
    names = [t["function"]["name"] for t in observation["tools"]]
    return next((n for n in names if n.endswith("add") and "env" in n), None)


def adding_policy(observation: dict[str, Any]) -> str:
    """Call the env tool once, then answer with its result; side calls get plain text."""
    tool = env_tool(observation)
    results = [m for m in observation["messages"] if m["role"] == "tool" and m["name"] == tool]
    if tool is None:
        return "Adding numbers"  # a side call without tools (OpenCode's title)
    if results:
        return json.dumps({"content": f"the sum is {results[-1]['content']}"})
    call = {"name": tool, "arguments": {"a": 20, "b": 22}}
    return json.dumps({"content": "", "tool_calls": [call]})


def harness_for(cli: str, base_url: str) -> Any:
    if cli == "claude":
        return ClaudeCodeHarness(executable=cli_path("claude"), model="m1", base_url=base_url)
    if cli == "codex":
        return CodexHarness(executable=cli_path("codex"), model="m1", base_url=base_url + "/v1")
    raise AssertionError(cli)
