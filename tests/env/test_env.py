"""HarnessEnv through real harness processes: the outcome table, the info
contract, tasks, tools, rewards and the gymnasium API."""

from __future__ import annotations
import __future__

import asyncio
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import gymnasium
import psutil
import pytest
from gymnasium.error import ResetNeeded
from gymnasium.utils.env_checker import check_env
from support import LINE_AGENT
from support.envs import line_env

import gym_harness
from gym_harness import ConfigError, HarnessEnv, RewardContext, ToolConflictError, tool_tags

AGENT = str(LINE_AGENT)
INFO_TYPES = {
    "turn": int,
    "error_type": str,
    "error": str,
    "events": list,
    "tool_calls": int,
    "elapsed_s": float,
    "exit_code": int,
    "stderr_tail": str,
    "episode_id": str,
    "task_id": str,
}


class Rewards:
    """A reward function that records every context it saw."""

    def __init__(self) -> None:
        self.seen: list[RewardContext] = []

    def __call__(self, ctx: RewardContext) -> float:
        self.seen.append(ctx)
        return 0.5


def assert_info(info: dict[str, Any]) -> None:
    assert set(info) == set(INFO_TYPES)
    for key, kind in INFO_TYPES.items():
        assert type(info[key]) is kind, (key, info[key])


def assert_gone(pid: int) -> None:
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_check_env_passes_without_warnings() -> None:
    env = gymnasium.make("gym_harness/Reference-v0")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_env(env.unwrapped)
    finally:
        env.close()


def test_reference_episode_calls_a_tool_through_the_bridge() -> None:
    env = gymnasium.make("gym_harness/Reference-v0")
    try:
        prompt, info = env.reset(options={"task_id": "add"})
        assert "/call add" in prompt
        assert_info(info)
        assert info["task_id"] == "add"
        reply, reward, terminated, truncated, info = env.step(prompt)
        assert "5555" in reply
        assert reward == 1.0
        assert (terminated, truncated) == (False, False)
        assert info["tool_calls"] == 1
        assert info["error_type"] == ""
        assert_info(info)
        reply, reward, terminated, _, info = env.step("/done bye")
        assert terminated and info["error_type"] == ""
    finally:
        env.close()


def test_echo_turns_keep_info_contract_and_render_transcript() -> None:
    rewards = Rewards()
    env = line_env(reward_fn=rewards, render_mode="ansi")
    try:
        obs, info = env.reset(seed=1)
        assert obs == ""
        assert_info(info)
        for i in range(3):
            reply, reward, terminated, truncated, info = env.step(f"hi {i} ✓")
            assert reply == f"echo: hi {i} ✓"
            assert reward == 0.5 and not terminated and not truncated
            assert_info(info)
            assert info["turn"] == i + 1
            kinds = [e["type"] for e in info["events"]]
            assert kinds == ["text", "tool_call", "other", "turn_complete"]
        assert [c.turn for c in rewards.seen] == [1, 2, 3]
        assert rewards.seen[0].workspace == env.workspace
        text = env.render()
        assert text is not None and "echo: hi 2 ✓" in text
        assert len(env.trajectory.turns) == 3
    finally:
        env.close()


@pytest.mark.parametrize(
    ("message", "kwargs", "terminated", "truncated", "error_type"),
    [
        ("crash", {}, True, False, "harness_crashed"),
        ("garbage", {}, True, False, "protocol_error"),
        ("hang", {"turn_timeout_s": 0.6, "idle_timeout_s": 30}, False, True, "turn_timeout"),
        ("stall", {"idle_timeout_s": 0.4}, False, True, "idle_timeout"),
        ("/done", {}, True, False, ""),
    ],
)
def test_outcome_table(
    message: str, kwargs: dict[str, Any], terminated: bool, truncated: bool, error_type: str
) -> None:
    rewards = Rewards()
    env = line_env(reward_fn=rewards, stop_grace_s=0.5, **kwargs)
    try:
        env.reset()
        assert env.process is not None
        pid = env.process.pid
        _, reward, term, trunc, info = env.step(message)
        assert (term, trunc, info["error_type"]) == (terminated, truncated, error_type), info
        assert reward == 0.5 and rewards.seen[-1].error_type == error_type
        assert_info(info)
        assert_gone(pid)  # the episode ended, so its harness is gone already
        with pytest.raises(ResetNeeded):
            env.step("again")
        env.reset()  # the env recovers with a fresh harness
        assert env.step("ok")[0] == "echo: ok"
    finally:
        env.close()


def test_crash_reports_exit_code_and_partial_text() -> None:
    env = line_env()
    try:
        env.reset()
        reply, _, terminated, _, info = env.step("crash")
        assert terminated and info["error_type"] == "harness_crashed"
        assert "exit code 3" in info["error"]
        assert info["exit_code"] == 3
        assert reply == "about to crash"
    finally:
        env.close()


def test_episode_timeout_truncates() -> None:
    env = line_env(episode_timeout_s=0.5, idle_timeout_s=30)
    try:
        env.reset()
        _, _, terminated, truncated, info = env.step("hang")
        assert (terminated, truncated, info["error_type"]) == (False, True, "episode_timeout")
    finally:
        env.close()


@pytest.mark.parametrize(
    ("mode", "kwargs", "needle"),
    [
        ("exit_at_start", {}, "no API key configured"),
        ("never_ready", {"startup_timeout_s": 0.5}, "not ready within"),
        ("echo", {"command": [sys.executable, "-c", "pass"]}, "exit code 0"),
    ],
)
def test_startup_failure_ends_the_next_step(mode: str, kwargs: dict[str, Any], needle: str) -> None:
    rewards = Rewards()
    env = line_env(mode, reward_fn=rewards, **kwargs)
    try:
        _, info = env.reset()
        assert info["error_type"] == "startup_failed"
        _, reward, terminated, truncated, info = env.step("hello")
        assert (terminated, truncated, info["error_type"]) == (True, False, "startup_failed")
        assert needle in info["error"]
        assert reward == 0.5
    finally:
        env.close()


def test_flood_and_invalid_utf8_are_outcomes_not_exceptions() -> None:
    env = line_env()
    try:
        env.reset()
        reply, _, terminated, _, info = env.step("flood")
        assert reply == "echo: flood" and not terminated
        assert "x" * 100 in info["stderr_tail"]
        reply, _, terminated, _, _ = env.step("utf8")
        assert reply == "bad \ufffd\ufffd bytes" and not terminated
    finally:
        env.close()


def test_max_episode_steps_truncates_without_error() -> None:
    env = gymnasium.make(
        "gym_harness/Command-v0", command=[sys.executable, AGENT], max_episode_steps=2
    )
    try:
        env.reset()
        assert env.step("one")[3] is False
        _, _, terminated, truncated, info = env.step("two")
        assert (terminated, truncated, info["error_type"]) == (False, True, "")
    finally:
        env.close()


def test_live_events_arrive_during_the_turn() -> None:
    seen: list[str] = []
    env = line_env(on_event=lambda event: seen.append(event.type.value))
    try:
        env.reset()
        env.step("hello")
        assert seen == ["text", "tool_call", "other", "turn_complete"]
    finally:
        env.close()


def test_tasks_pick_by_seed_and_id_and_write_files(tmp_path: Path) -> None:
    template = tmp_path / "template"
    template.mkdir()
    (template / "README").write_text("from the template")
    tasks = [
        {"id": "a", "prompt": "task a", "files": {"src/x.py": "print(1)\n"}},
        {"id": "b", "prompt": "task b", "meta": {"level": 2}},
    ]
    env = line_env(tasks=tasks, workspace=template)
    try:
        first = [env.reset(seed=s)[0] for s in (0, 1, 2, 3)]
        again = [env.reset(seed=s)[0] for s in (0, 1, 2, 3)]
        assert first == again and set(first) <= {"task a", "task b"}
        obs, info = env.reset(options={"task_id": "a"})
        assert obs == "task a" and info["task_id"] == "a"
        assert env.workspace is not None
        assert (env.workspace / "src" / "x.py").read_text() == "print(1)\n"
        assert (env.workspace / "README").read_text() == "from the template"
        obs, info = env.reset(options={"task": {"id": "c", "prompt": "inline"}})
        assert obs == "inline" and info["task_id"] == "c"
        with pytest.raises(ConfigError, match="No task has id"):
            env.reset(options={"task_id": "zzz"})
    finally:
        env.close()


def test_tasks_from_jsonl_and_bad_tasks(tmp_path: Path) -> None:
    good = tmp_path / "tasks.jsonl"
    good.write_text('{"id": "t1", "prompt": "p1"}\n\n{"id": "t2", "prompt": "p2"}\n')
    assert [t.id for t in line_env(tasks=good).tasks] == ["t1", "t2"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "t1"}\nnot json\n')
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2"):
        line_env(tasks=bad)
    with pytest.raises(ConfigError, match="Cannot read tasks file"):
        line_env(tasks=tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="must be relative"):
        line_env(tasks=[{"id": "x", "prompt": "p", "files": {"../escape": "no"}}])
    with pytest.raises(ConfigError, match="unique"):
        line_env(tasks=[{"id": "x", "prompt": "p"}, {"id": "x", "prompt": "p"}])


def test_bad_config_raises_at_construction() -> None:
    with pytest.raises(ConfigError, match="turn_timeout_s"):
        line_env(turn_timeout_s=-1)
    with pytest.raises(ConfigError, match="Unknown keyword"):
        line_env(no_such_option=1)
    with pytest.raises(ConfigError, match="Unknown harness"):
        HarnessEnv("nope")
    with pytest.raises(ConfigError, match="needs a command"):
        HarnessEnv("command")
    with pytest.raises(ConfigError, match="render_mode"):
        line_env(render_mode="human")
    with pytest.raises(ConfigError, match="reward_fn"):
        line_env(reward_fn="no.such.module:fn")


def test_gymnasium_api_misuse_raises() -> None:
    env = line_env()
    try:
        with pytest.raises(ResetNeeded):
            env.step("too early")
        env.reset()
        with pytest.raises(TypeError, match="must be a str"):
            env.step(42)  # type: ignore[arg-type]
    finally:
        env.close()
        env.close()  # idempotent


@tool_tags("reward")
def secret_answer() -> str:
    """Part of the reward: never served."""
    return "42"


def visible(x: int) -> int:
    """A served tool."""
    return x + 1


def test_reserved_and_reward_tools_are_refused() -> None:
    env = HarnessEnv("reference", tools=[visible, secret_answer])
    try:
        env.reset()
        names = [spec.name for spec in env.list_tools()]
        assert names == ["visible"]
        msg = '/call reset {}\n/call secret_answer {}\n/call visible {"x": 1}'
        _, _, _, _, info = env.step(msg)
        results = [e["data"] for e in info["events"] if e["type"] == "tool_result"]
        assert [r["is_error"] for r in results] == [True, True, False]
        assert "2" in str(results[2]["content"])
        assert env.call_tool("visible", {"x": 41}).is_error is False
    finally:
        env.close()


def test_reserved_tool_name_is_a_config_error() -> None:
    def step(x: int) -> int:
        return x

    env = HarnessEnv("reference", tools=[step])
    try:
        with pytest.raises(ToolConflictError, match="reserved"):
            env.reset()
    finally:
        env.close()


def test_reset_and_step_from_a_running_event_loop() -> None:
    async def main() -> str:
        env = gymnasium.make("gym_harness/Reference-v0")
        try:
            env.reset(options={"task_id": "lookup"})
            reply = env.step('/call lookup {"key": "capital of france"}')[0]
            return str(reply)
        finally:
            env.close()

    assert "Paris" in asyncio.run(main())


def test_public_names_match_all() -> None:
    public = {name for name in dir(gym_harness) if not name.startswith("_")}
    modules = {n for n in public if isinstance(getattr(gym_harness, n), type(sys))}
    modules |= {n for n in public if isinstance(getattr(gym_harness, n), __future__._Feature)}
    assert sorted(gym_harness.__all__) == gym_harness.__all__
    assert set(gym_harness.__all__) == (public - modules) | {"__version__"}


def test_make_by_module_prefix_without_importing_gym_harness_first() -> None:
    code = (
        "import sys, gymnasium\n"
        "assert 'gym_harness' not in sys.modules\n"
        "env = gymnasium.make('gym_harness:gym_harness/Reference-v0')\n"
        "print(type(env.unwrapped).__name__, 'fastmcp' in sys.modules)\n"
        "env.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["HarnessEnv", "False"]  # and construction stays cheap


def test_after_close_step_and_reset_tell_one_story() -> None:
    env = line_env()
    env.reset()
    env.step("hi")
    env.close()
    with pytest.raises(ResetNeeded) as stepped:
        env.step("again")
    with pytest.raises(ConfigError) as reset:
        env.reset()
    for error in (stepped, reset):
        message = str(error.value)
        assert "make a new env" in message and "close() was called" in message, message
        assert "call reset()" not in message


def test_the_reference_harness_by_name_has_no_tools_tasks_or_reward() -> None:
    """As documented: ``HarnessEnv("reference")`` is the bare harness; the registered
    ``gym_harness/Reference-v0`` adds the demo's tools, tasks and reward."""
    bare = HarnessEnv("reference")
    demo = gymnasium.make("gym_harness/Reference-v0")
    try:
        prompt, _ = bare.reset(seed=0)
        assert (prompt, bare.tasks, bare.reward_fn, bare.list_tools()) == ("", (), None, [])
        prompt, _ = demo.reset(seed=0)
        inner = HarnessEnv.of(demo)
        assert prompt and len(inner.tasks) == 4 and inner.reward_fn is not None
        assert [t.name for t in inner.list_tools()] == ["add", "word_count", "lookup"]
    finally:
        bare.close()
        demo.close()
