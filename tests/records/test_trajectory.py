"""What leaves an episode: StepInfo, Trajectory.to_record and HarnessEnv.of."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import gymnasium
import pytest

from gym_harness import (
    HarnessEnv,
    Outcome,
    StepInfo,
    Trajectory,
    TurnRecord,
    TurnResult,
)
from gym_harness.rollout.local import run_episode

README = Path(__file__).resolve().parents[2] / "README.md"

#: Every rollout record's keys, in order (the local, Ray and lost-worker records alike).
RECORD_KEYS = [
    "episode_id",
    "harness",
    "task_id",
    "task",
    "startup_events",
    "turns",
    "reward",
    "outcome",
    "reset_s",
    "sandbox",
    "forked_from",
    "env_id",
    "episode_index",
    "seed",
    "rollout_id",
    "messages",
    "error_type",
    "error",
    "timings",
    "group_id",
    "parent_id",
    "fork_step",
]


def turn(n: int, *, done: bool = False, error_type: str = "", error: str = "") -> TurnRecord:
    result = TurnResult(response=f"reply {n}", done=done, error_type=error_type, error=error)
    return TurnRecord.of_turn(n, f"message {n}", result, 100.0 + n, 0.5, done, False)


def test_step_info_is_the_info_the_readme_documents() -> None:
    hints = typing.get_type_hints(StepInfo)
    line = re.search(r"### Info keys.*?\n\n(.*?)\n\n", README.read_text(), re.S)
    assert line is not None
    documented = dict(re.findall(r"`(\w+)` (\w+)", line.group(1)))
    assert list(documented) == list(hints)
    for key, hint in hints.items():
        kind = typing.get_origin(hint) or hint
        assert kind.__name__ == documented[key] or (key == "events" and kind is list), key


def test_reset_and_step_infos_have_exactly_the_step_info_keys() -> None:
    hints = typing.get_type_hints(StepInfo)
    env = gymnasium.make("gym_harness/Reference-v0")
    try:
        _, info = env.reset(options={"task_id": "add"})
        infos = [info, env.step('/call add {"a": 1, "b": 2}')[4]]
    finally:
        env.close()
    for info in infos:
        assert list(info) == list(hints)
        for key, hint in hints.items():
            assert isinstance(info[key], typing.get_origin(hint) or hint), key
    assert [i["turn"] for i in infos] == [0, 1] and infos[1]["tool_calls"] == 1


def test_to_record_of_a_running_episode_says_the_rollout_stopped_it() -> None:
    trajectory = Trajectory("e1", "reference", {"id": "t", "prompt": "p"}, reset_s=0.25)
    trajectory.turns += [turn(1), turn(2)]
    record = trajectory.to_record(env_id="id/Env-v0", index=1, seed=9, total_s=2.0)
    assert list(record) == RECORD_KEYS
    assert record["outcome"] == "max_turns" and record["error_type"] == record["error"] == ""
    assert record["messages"] == [
        {"role": "user", "content": "message 1"},
        {"role": "assistant", "content": "reply 1"},
        {"role": "user", "content": "message 2"},
        {"role": "assistant", "content": "reply 2"},
    ]
    assert record["timings"] == {"reset_s": 0.25, "turns_s": [0.5, 0.5], "total_s": 2.0}
    assert (record["env_id"], record["episode_index"], record["seed"]) == ("id/Env-v0", 1, 9)
    assert record["task_id"] == "t" and record["task"] == {"id": "t", "prompt": "p"}


def test_to_record_keeps_the_last_turns_fault_or_the_episodes() -> None:
    trajectory = Trajectory("e2", "reference")
    trajectory.turns += [turn(1, error_type=Outcome.HARNESS_CRASHED, error="exit 3")]
    record = trajectory.to_record(env_id="x", index=0, seed=0, total_s=1.0)
    assert record["outcome"] == record["error_type"] == "harness_crashed"
    assert record["error"] == "exit 3"
    lost = Trajectory("", "", {"id": "t", "prompt": "p"}).to_record(
        env_id="x", index=0, seed=0, total_s=0.0, fault=Outcome.WORKER_LOST, error="actor died"
    )
    assert list(lost) == RECORD_KEYS
    assert lost["outcome"] == lost["error_type"] == "worker_lost"
    assert lost["error"] == "actor died" and lost["turns"] == lost["messages"] == []


def test_run_episode_writes_the_trajectorys_record() -> None:
    env = gymnasium.make("gym_harness/Reference-v0")
    try:
        task = {"id": "fin", "prompt": "/done Jupiter"}
        record = run_episode(env, task, env_id="E", seed=4, index=0, max_turns=3, follow_up="F")
        again = HarnessEnv.of(env).trajectory.to_record(env_id="E", index=0, seed=4, total_s=0.0)
    finally:
        env.close()
    assert list(record) == RECORD_KEYS
    assert record["outcome"] == "done" and len(record["turns"]) == 1
    assert record["timings"]["total_s"] >= record["reset_s"] > 0
    same: dict[str, Any] = {**record, "timings": again["timings"]}
    assert same == again


def test_of_reaches_the_harness_env_under_its_wrappers() -> None:
    wrapped = gymnasium.make("gym_harness/Reference-v0", max_episode_steps=3)
    try:
        assert isinstance(wrapped, gymnasium.Wrapper)
        inner = HarnessEnv.of(wrapped)
        assert inner is wrapped.unwrapped and HarnessEnv.of(inner) is inner
        wrapped.reset(options={"task_id": "add"})
        assert inner.trajectory.task is not None and inner.trajectory.task["id"] == "add"
        assert inner.process is not None and (inner.process.pid or 0) > 0
    finally:
        wrapped.close()


@pytest.mark.parametrize("other", ["CartPole-v1", None])
def test_of_anything_else_is_a_type_error(other: str | None) -> None:
    env: Any = object() if other is None else gymnasium.make(other)
    with pytest.raises(TypeError, match="expected a HarnessEnv or a gymnasium wrapper of one"):
        HarnessEnv.of(env)


def test_the_transcript_and_its_html_show_the_prompt_once() -> None:
    env = gymnasium.make("gym_harness/Reference-v0", render_mode="ansi")
    try:
        prompt, _ = env.reset(options={"task_id": "add"})
        before = env.render()
        assert isinstance(before, str) and before.count(prompt) == 1  # in the header
        env.step(prompt)
        after = env.render()
        html = HarnessEnv.of(env).trajectory._repr_html_()
        env.reset(options={"task_id": "add"})
        env.step("another message")
        other = env.render()
    finally:
        env.close()
    assert isinstance(after, str) and after.count(prompt) == 1  # as turn 1's user message
    assert after.splitlines()[0].endswith("(reference), task add")
    assert ">task</span>" not in html and ">user</span>" in html  # the prompt as user only
    assert isinstance(other, str) and other.count(prompt) == 1  # not sent, so in the header
