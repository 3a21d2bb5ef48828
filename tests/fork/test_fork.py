"""HarnessEnv.fork: one episode's state as a new, independent env.

Model mode forks by replay: real harness processes (the Reference agent, the line-protocol
``model_agent.py``) are answered with the parent's recorded completions over the env's
loopback model endpoint, and run the env's tools over the real MCP bridge again.
"""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest
from gymnasium.error import ResetNeeded
from support import LIGHT_MODEL_AGENT, LINE_AGENT
from support.envs import model_env
from support.model_server import ScriptedModelServer

from gym_harness import ConfigError, ForkDiverged, ForkUnsupported, HarnessEnv
from gym_harness.fork import native
from gym_harness.harnesses.registry import HARNESSES, harness_class
from gym_harness.utils.trees import tree_size

RAN: list[tuple[int, int]] = []  # every call of the ``add`` tool, in this process


def add(a: int, b: int) -> int:
    """Add two integers."""
    RAN.append((a, b))
    return a + b


def now() -> str:
    """The time, in nanoseconds (a tool whose answer changes every call)."""
    return str(time.time_ns())


KINDS = ["reference", "command"]


def call(name: str, **arguments: Any) -> str:
    return json.dumps({"content": "", "tool_calls": [{"name": name, "arguments": arguments}]})


def to_call_3(env: HarnessEnv, tool: str = "add") -> str:
    """Reset and answer calls 1 and 2 with tool calls: the observation is call 3."""
    obs, info = env.reset(seed=0)
    assert info["error_type"] == "", info["error"]
    for a in (2, 5):
        arguments = {"a": a, "b": 3} if tool == "add" else {}
        obs, _, terminated, _, info = env.step(call(tool, **arguments))
        assert not terminated and info["error_type"] == "", info["error"]
    return obs


@pytest.mark.parametrize("kind", KINDS)
def test_a_model_mode_fork_replays_to_the_parents_call_and_goes_its_own_way(kind: str) -> None:
    RAN.clear()
    env = model_env(kind, [add])
    child = None
    try:
        obs = to_call_3(env)
        assert RAN == [(2, 3), (5, 3)]
        parent_id = env.trajectory.episode_id
        child, child_obs, info = env.fork()
        assert RAN == [(2, 3), (5, 3)] * 2  # the child's harness ran the env tool again
        mine, theirs = json.loads(obs), json.loads(child_obs)
        assert theirs["messages"] == mine["messages"] and theirs["tools"] == mine["tools"]
        assert theirs["request_id"] and theirs["request_id"] != mine["request_id"]
        assert info["fork"]["method"] == "replay" and info["fork"]["replayed"] == 3
        assert (info["fork"]["diverged_at"], info["fork"]["difference"]) == (None, "")
        assert info["episode_id"] == child.trajectory.episode_id != parent_id
        assert child.trajectory.forked_from == {"episode_id": parent_id, "step": 2}
        assert child.trajectory.calls == env.trajectory.calls  # a copy of the parent's record
        assert child.workspace != env.workspace
        before = env.trajectory.to_dict()

        final, _, terminated, _, info = child.step("the child says 8")
        assert terminated and info["error_type"] == "", info["error"]
        assert json.loads(final)["messages"][-1]["content"] == "the child says 8"
        assert env.trajectory.to_dict() == before  # the child changed nothing of the parent's
        record = child.trajectory.to_record(env_id="e", index=0, seed=0, total_s=1.0)
        assert record["forked_from"] == {"episode_id": parent_id, "step": 2}
        assert [c["completion"]["content"] for c in record["calls"]][-1] == "the child says 8"

        final, _, terminated, _, info = env.step("the parent says 8, too")
        assert terminated and info["error_type"] == "", info["error"]
        assert json.loads(final)["messages"][-1]["content"] == "the parent says 8, too"
        assert env.trajectory.forked_from is None
        assert env.trajectory.to_dict()["forked_from"] is None
    finally:
        if child is not None:
            child.close()
        env.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_tool_that_returns_the_time_diverges(kind: str) -> None:
    env = model_env(kind, [now])
    try:
        obs = to_call_3(env, "now")
        with pytest.raises(ForkDiverged, match=r"diverged at model call 2: messages\[\d+\]"):
            env.fork(strict=True)
        child, child_obs, info = env.fork()  # not strict: made, and the difference told
        try:
            assert info["fork"]["diverged_at"] == 2 and info["fork"]["replayed"] == 3
            assert "messages[" in info["fork"]["difference"]
            assert json.loads(child_obs)["messages"] != json.loads(obs)["messages"]
            assert child.step("done")[2]
        finally:
            child.close()
        assert env.step("done")[2]  # the parent goes on as if nothing happened
    finally:
        env.close()


def test_only_a_running_episode_forks() -> None:
    env = model_env("command", [add])
    try:
        with pytest.raises(ResetNeeded, match=r"fork\(\) needs a running episode"):
            env.fork()
        env.reset(seed=0)
        assert env.step("it is 5")[2]  # the episode ended
        with pytest.raises(ResetNeeded, match="turn 1 ended the episode"):
            env.fork()
    finally:
        env.close()
    with pytest.raises(ResetNeeded, match="close"):
        env.fork()


def test_a_turn_mode_harness_without_a_fork_path_is_unsupported_before_anything_starts() -> None:
    env = HarnessEnv("command", command=[sys.executable, str(LINE_AGENT)])
    try:
        env.reset(seed=0)
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        with pytest.raises(ForkUnsupported, match="'command' harness cannot fork this turn-mode"):
            env.fork()
        assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
        assert env.step("still here")[0]
    finally:
        env.close()


def test_max_fork_bytes_is_checked_at_construction() -> None:
    with pytest.raises(ConfigError, match="max_fork_bytes must be a positive int"):
        HarnessEnv("reference", max_fork_bytes=0)


def _refused(url: str) -> bool:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=2.0):
            return False
    except OSError:
        return True


def _status(url: str, token: str) -> int:
    request = urllib.request.Request(
        url, data=b"{}", headers={"Authorization": f"Bearer {token}"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=5.0) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_fifty_forks_of_one_parent_leave_nothing_behind() -> None:
    """No process, keeper, token, server or workspace of a closed child is left."""
    command = [sys.executable, str(LIGHT_MODEL_AGENT), "--pause", "0"]
    env = HarnessEnv("command", command=command, mode="model", tasks=[{"id": "t", "prompt": "hi"}])
    try:
        env.reset(seed=0)
        obs, *_ = env.step("first answer")  # call 2 of the turn is the observation
        assert env.process is not None and env.process.pid is not None
        mcp_url = psutil.Process(env.process.pid).environ()["GYM_HARNESS_MCP_URL"]
        running = {p.pid for p in psutil.Process().children(recursive=True)}
        for _ in range(50):
            child, child_obs, info = env.fork(strict=True)
            assert json.loads(child_obs)["messages"] == json.loads(obs)["messages"]
            assert info["fork"]["replayed"] == 2
            assert child.process is not None and child.process.pid is not None
            pid, workspace = child.process.pid, child.workspace
            assert workspace is not None and workspace.is_dir()
            environ = psutil.Process(pid).environ()
            urls = [environ["GYM_HARNESS_MCP_URL"], environ["GYM_HARNESS_MODEL_BASE_URL"]]
            token = environ["GYM_HARNESS_MCP_TOKEN"]
            child.close()
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
            assert not workspace.parent.exists()  # the child's episode directory
            assert all(_refused(url) for url in urls)  # its servers stopped
            assert _status(mcp_url, token) == 401  # its token opens nothing of the parent's
        assert {p.pid for p in psutil.Process().children(recursive=True)} <= running
        assert env.step("second answer")[2]
    finally:
        env.close()


def reference_turns(server: ScriptedModelServer, **kwargs: Any) -> HarnessEnv:
    """A turn-mode Reference agent whose ``openai`` policy is ``server`` (it recalls)."""
    return HarnessEnv(
        "reference",
        policy="openai",
        model="m",
        base_url=server.openai_base_url,
        connect_ports=[server.port],
        **kwargs,
    )


def test_a_turn_mode_fork_resumes_the_reference_agents_session() -> None:
    with ScriptedModelServer(recall=True) as server:
        env = reference_turns(server)
        child = None
        try:
            env.reset(seed=0)
            assert env.step("first apple")[0] == "you said: first apple"
            reply = env.step("second banana")[0]
            assert reply == "you said: first apple | second banana"
            assert env.workspace is not None
            (env.workspace / "notes.txt").write_text("from the parent's first two turns")
            parent_id = env.trajectory.episode_id

            child, obs, info = env.fork()
            assert obs == reply and info["error_type"] == "", info["error"]
            assert info["fork"]["method"] == "native" and info["fork"]["step"] == 2
            assert child.trajectory.forked_from == {"episode_id": parent_id, "step": 2}
            assert [t.message for t in child.trajectory.turns] == ["first apple", "second banana"]
            assert child.workspace is not None and child.workspace != env.workspace
            assert (
                child.workspace / "notes.txt"
            ).read_text() == "from the parent's first two turns"

            (child.workspace / "notes.txt").write_text("the child's")
            assert child.step("child cherry")[0] == (
                "you said: first apple | second banana | child cherry"
            )
            assert env.step("parent date")[0] == (
                "you said: first apple | second banana | parent date"
            )
            assert (env.workspace / "notes.txt").read_text() == "from the parent's first two turns"
            assert child.step("child again")[0].endswith("child cherry | child again")
        finally:
            if child is not None:
                child.close()
            env.close()


def test_a_fork_past_max_fork_bytes_fails_before_anything_starts() -> None:
    with ScriptedModelServer(recall=True) as server:
        env = reference_turns(server, max_fork_bytes=64)
        try:
            env.reset(seed=0)
            env.step("first")
            assert env.workspace is not None
            (env.workspace / "big.bin").write_bytes(b"x" * 65)
            before = {p.pid for p in psutil.Process().children(recursive=True)}
            with pytest.raises(ForkUnsupported, match="more than max_fork_bytes=64 bytes"):
                env.fork()
            assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
            (env.workspace / "big.bin").unlink()
            assert env.step("second")[0] == "you said: first | second"
        finally:
            env.close()


def test_a_fork_of_more_entries_than_a_fork_copies_fails_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with ScriptedModelServer(recall=True) as server:
        env = reference_turns(server)
        try:
            env.reset(seed=0)
            env.step("first")
            assert env.workspace is not None
            trees = [env.workspace, env.workspace.parent / "home"]
            bound = tree_size(trees, 1 << 30).entries + 2  # a million, made quick
            monkeypatch.setattr(native, "MAX_ENTRIES", bound)
            for i in range(bound + 1 - tree_size(trees[:1], 1 << 30).entries):
                (env.workspace / f"empty{i}").touch()  # no bytes, one entry each
            before = {p.pid for p in psutil.Process().children(recursive=True)}
            with pytest.raises(ForkUnsupported, match=f"more than {bound} entries"):
                env.fork()
            assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
            (env.workspace / "empty0").unlink()
            assert env.step("second")[0] == "you said: first | second"
            child, _, _ = env.fork()  # at the bound: forks
            child.close()
        finally:
            env.close()


#: The harnesses with no turn-mode fork path (ACP gives no way to resume a copied session).
NO_FORK_PATH = ["acp", "opencode", "qwen_code", "gemini_cli", "claude_agent_acp", "codex_acp"]


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_every_harness_without_a_fork_path_says_so_by_name(name: str) -> None:
    """Before a session has what a fork needs (none yet), every adapter refuses, naming
    itself; the ones without any fork path say they have no way to resume a session."""
    with pytest.raises(ForkUnsupported, match=f"the {name!r} harness cannot fork") as raised:
        harness_class(name)().fork_session(None)
    lacks = "no way to resume a copy of its saved session" in str(raised.value)
    assert lacks == (name in NO_FORK_PATH)
