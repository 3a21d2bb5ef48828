"""Every registered adapter: a picklable factory that launches a fresh session per episode.

Offline: ``launch`` writes its files into a temporary home and nothing is spawned.
The sessions' dialects are tested per harness (``test_claude_code``, ``test_codex``,
``test_acp``, ``test_parsers``); here is what all of them share.
"""

from __future__ import annotations

import json
import pickle
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cli import episode_ctx

from gym_harness import (
    HARNESSES,
    EpisodeContext,
    Feed,
    Harness,
    HarnessConfig,
    HarnessEnv,
    HarnessSession,
    Launch,
    Outcome,
)
from gym_harness.harnesses.acp import ACPSession
from gym_harness.harnesses.line import CommandSession
from gym_harness.harnesses.registry import make_harness

#: Harnesses that run a user-given argv need one; the others ignore it.
COMMAND = (sys.executable, "-c", "pass")


def launch(harness: Harness, tmp_path: Path, **ctx: object) -> Launch:
    config = harness.default_config().replace(command=COMMAND)
    tmp_path.mkdir(exist_ok=True)
    return harness.launch(episode_ctx(tmp_path, **ctx), config)


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_the_factory_pickles_before_and_after_launch_and_keeps_no_episode_state(
    name: str, tmp_path: Path
) -> None:
    harness = make_harness(name, {})
    before = pickle.dumps(harness)
    first = launch(harness, tmp_path / "one")
    second = launch(harness, tmp_path / "two")
    # A launch leaves the factory as it was: all an episode has lives in its session.
    assert pickle.dumps(harness) == before
    clone = pickle.loads(before)
    assert type(clone) is type(harness) and vars(clone) == vars(harness)
    assert isinstance(first, Launch) and isinstance(first.session, HarnessSession)
    assert first.session is not second.session
    assert first.config.command[0] == second.config.command[0]


@pytest.mark.parametrize("name", ["codex", "acp", "opencode"])
def test_each_episode_numbers_its_requests_afresh(name: str, tmp_path: Path) -> None:
    harness = make_harness(name, {})
    first = launch(harness, tmp_path / "one").session
    (init,) = first.startup_lines()
    first.message_lines("hi")  # the first episode goes on; the second starts over
    (again,) = launch(harness, tmp_path / "two").session.startup_lines()
    assert json.loads(init)["id"] == json.loads(again)["id"] == 1
    assert json.loads(first.message_lines("more")[0])["id"] == 3


@pytest.mark.parametrize(("name", "ready"), [("claude_code", True), ("codex", False)])
def test_readiness_at_spawn_is_the_sessions_to_say(name: str, ready: bool, tmp_path: Path) -> None:
    session = launch(make_harness(name, {}), tmp_path).session
    assert session.ready_at_spawn is ready
    assert bool(session.startup_lines()) is not ready  # a handshake, or nothing to wait for


def test_a_line_protocol_session_waits_for_ready_and_needs_no_bridge_check() -> None:
    session = CommandSession()
    assert not session.ready_at_spawn
    assert session.feed('{"type": "ready"}').ready

    def never() -> bool:
        raise AssertionError("a harness that shows its tools never asks the bridge")

    assert session.missing_tools(never) == ""


def test_an_acp_session_asks_the_bridge_until_the_tools_were_listed(tmp_path: Path) -> None:
    launched = launch(make_harness("opencode", {}), tmp_path, tool_names=("add", "echo"))
    session = launched.session
    assert isinstance(session, ACPSession)
    asked: list[bool] = []

    def listed(answer: bool) -> bool:
        asked.append(answer)
        return answer

    why = session.missing_tools(lambda: listed(False))
    assert "['add', 'echo']" in why and "'env'" in why and "first turn" in why
    assert session.missing_tools(lambda: listed(True)) == ""
    assert session.missing_tools(lambda: listed(False)) == ""  # confirmed once is enough
    assert asked == [False, True]


def test_an_acp_session_without_env_tools_has_nothing_to_confirm(tmp_path: Path) -> None:
    session = launch(make_harness("acp", {}), tmp_path, tool_names=()).session

    def never() -> bool:
        raise AssertionError("no env tools: nothing to ask the bridge")

    assert session.missing_tools(never) == ""


def test_the_handshake_carries_what_the_factory_built_for_the_episode(tmp_path: Path) -> None:
    launched = launch(make_harness("acp", {}), tmp_path)
    session = launched.session
    (init,) = session.startup_lines()
    reply = session.feed(json.dumps({"jsonrpc": "2.0", "id": json.loads(init)["id"], "result": {}}))
    (new,) = (json.loads(line) for line in reply.replies)
    assert new["method"] == "session/new"
    assert new["params"]["cwd"] == str(tmp_path / "ws")
    (server,) = new["params"]["mcpServers"]
    assert (server["name"], server["url"]) == ("env", "http://127.0.0.1:9/mcp")
    assert "bridge-secret-token" not in json.dumps(launched.config.command)


# ---------------------------------------------------------------- a dialect of one's own

#: A harness of the simplest dialect: it answers each line with that line, uppercased.
UPPER = [
    sys.executable,
    "-c",
    "import sys\nfor line in sys.stdin:\n    print(line.strip().upper(), flush=True)",
]


class UpperSession(HarnessSession):
    """Ready at spawn; a message is one line, and the next line is the whole reply."""

    def __init__(self, check_tools: bool) -> None:
        self.check_tools = check_tools

    @property
    def ready_at_spawn(self) -> bool:
        return True

    def message_lines(self, text: str) -> list[str]:
        return [text]

    def feed(self, line: str) -> Feed:
        return Feed(turn_complete=True, response=line, done=line == "BYE")

    def missing_tools(self, listed: Callable[[], bool]) -> str:
        if self.check_tools and not listed():
            return "the harness never listed the env tools"
        return ""


class UpperHarness(Harness):
    """The factory: the argv, and a fresh ``UpperSession`` per episode."""

    name = "upper"

    def __init__(self, *, check_tools: bool = False) -> None:
        self.check_tools = check_tools

    def launch(self, ctx: EpisodeContext, config: HarnessConfig) -> Launch:
        return Launch(config.replace(command=UPPER), UpperSession(self.check_tools))


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_a_dialect_of_ones_own_is_a_factory_and_a_session() -> None:
    env = HarnessEnv(UpperHarness(), tools=[add], turn_timeout_s=30)
    try:
        for _ in range(2):  # a fresh session per episode
            env.reset()
            reply, _, terminated, _, info = env.step("hello")
            assert (reply, terminated, info["error_type"]) == ("HELLO", False, "")
            reply, _, terminated, _, _ = env.step("bye")
            assert (reply, terminated) == ("BYE", True)
    finally:
        env.close()


def test_a_sessions_tool_check_fails_the_first_turn_as_startup_failed() -> None:
    env = HarnessEnv(UpperHarness(check_tools=True), tools=[add], turn_timeout_s=30)
    try:
        env.reset()
        _, _, terminated, _, info = env.step("hello")  # the bridge never saw a tools/list
        assert (terminated, info["error_type"]) == (True, Outcome.STARTUP_FAILED)
        assert info["error"] == "the harness never listed the env tools"
    finally:
        env.close()
