"""The value types: exceptions pickle with their extras; configs, events, turn
results and tasks round-trip through JSON; bad config says what to fix."""

from __future__ import annotations

import dataclasses
import json
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gym_harness import (
    BridgeError,
    CaptureError,
    ConfigError,
    EventType,
    HarnessConfig,
    HarnessCrashed,
    HarnessError,
    HarnessEvent,
    HarnessStartError,
    ProcessSpec,
    ProtocolError,
    Task,
    ToolConflictError,
    TurnLimits,
    TurnResult,
    TurnTimeout,
    WorkerLost,
)
from gym_harness.config import INTERRUPT_GRACE_S

ERRORS = [
    HarnessError,
    ConfigError,
    HarnessStartError,
    HarnessCrashed,
    TurnTimeout,
    ProtocolError,
    BridgeError,
    ToolConflictError,
    CaptureError,
    WorkerLost,
]

json_scalars = st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
positive = st.floats(min_value=0.001, max_value=1e6, allow_nan=False)
configs = st.builds(
    HarnessConfig,
    command=st.lists(st.text(min_size=1), min_size=1, max_size=4),
    cwd=st.none() | st.text(min_size=1),
    env=st.dictionaries(st.text(min_size=1), st.text(), max_size=4),
    inherit_env=st.lists(st.text(min_size=1), max_size=4),
    startup_timeout_s=positive,
    turn_timeout_s=positive,
    idle_timeout_s=positive,
    episode_timeout_s=st.none() | positive,
    stop_grace_s=positive,
    stderr_tail_lines=st.integers(min_value=1, max_value=10_000),
    max_line_bytes=st.integers(min_value=1, max_value=1 << 30),
    allow_plain_text=st.booleans(),
    max_mcp_sessions=st.integers(min_value=1, max_value=1 << 16),
    tool_workers=st.integers(min_value=1, max_value=1024),
    cgroup=st.booleans(),
)
events = st.builds(
    HarnessEvent,
    type=st.sampled_from(EventType),
    data=st.dictionaries(st.text(), json_values, max_size=4),
    timestamp=st.floats(min_value=0, max_value=4e9),
)


@pytest.mark.parametrize("cls", ERRORS)
def test_every_exception_pickles_with_its_extras(cls: type[HarnessError]) -> None:
    exc = cls("what happened; what to do", exit_code=3, stderr_tail="boom\nbang", pid=1234)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls
    assert (back.message, back.exit_code, back.stderr_tail, back.pid) == (
        exc.message,
        3,
        "boom\nbang",
        1234,
    )
    assert "boom" in str(back)
    # gymnasium's AsyncVectorEnv re-raises a worker's error as type(exc)(value)
    assert type(back)(str(back.message)).message == exc.message


def test_config_error_is_also_a_value_error() -> None:
    with pytest.raises(ValueError, match="stop_grace_s"):
        HarnessConfig(stop_grace_s=0)


def test_worker_lost_pickles_with_the_sub_envs_index() -> None:
    exc = WorkerLost("the vector worker of sub-env 2 was killed", index=2, exit_code=-9, pid=7)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is WorkerLost
    assert (back.message, back.index, back.exit_code, back.pid) == (exc.message, 2, -9, 7)


@given(configs)
def test_config_round_trips_through_json(config: HarnessConfig) -> None:
    data = json.loads(json.dumps(config.to_dict()))
    assert HarnessConfig.from_dict(data) == config
    assert pickle.loads(pickle.dumps(config)) == config


@given(configs)
def test_config_splits_into_a_process_spec_and_turn_limits(config: HarnessConfig) -> None:
    spec, limits = config.process_spec(), config.turn_limits()
    for part in (spec, limits):
        for f in dataclasses.fields(part):
            if f.name != "interrupt_grace_s":
                assert getattr(part, f.name) == getattr(config, f.name), f.name
        assert pickle.loads(pickle.dumps(part)) == part
    assert limits.interrupt_grace_s == min(INTERRUPT_GRACE_S, config.stop_grace_s)
    assert {f.name for f in dataclasses.fields(spec)}.isdisjoint(
        f.name for f in dataclasses.fields(limits)
    )


def test_the_parts_default_like_the_config() -> None:
    assert HarnessConfig().process_spec() == ProcessSpec()
    assert HarnessConfig().turn_limits() == TurnLimits()


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"command": "python agent.py"}, "command"),
        ({"command": ["python", 3]}, "command"),
        ({"env": {"A": 1}}, "env"),
        ({"turn_timeout_s": 0}, "turn_timeout_s"),
        ({"idle_timeout_s": float("nan")}, "idle_timeout_s"),
        ({"episode_timeout_s": -5}, "episode_timeout_s"),
        ({"stderr_tail_lines": True}, "stderr_tail_lines"),
        ({"max_line_bytes": 0}, "max_line_bytes"),
        ({"allow_plain_text": "yes"}, "allow_plain_text"),
        ({"max_mcp_sessions": 0}, "max_mcp_sessions"),
        ({"tool_workers": 1.5}, "tool_workers"),
        ({"cgroup": 1}, "cgroup"),
        ({"no_such_field": 1}, "no_such_field"),
    ],
)
def test_bad_config_names_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        HarnessConfig().replace(**changes)


@given(events)
def test_event_round_trips_through_json(event: HarnessEvent) -> None:
    assert HarnessEvent.from_dict(json.loads(json.dumps(event.to_dict()))) == event


def test_unknown_event_type_reads_back_as_other() -> None:
    event = HarnessEvent.from_dict({"type": "brand_new", "data": {"x": 1}, "timestamp": 1.0})
    assert event.type is EventType.OTHER and event.data == {"x": 1}


@given(
    st.text(),
    st.lists(events, max_size=5),
    st.booleans(),
    st.sampled_from(["", "harness_crashed", "turn_timeout"]),
    st.text(),
)
def test_turn_result_round_trips_through_json(
    response: str, evs: list[HarnessEvent], done: bool, error_type: str, error: str
) -> None:
    result = TurnResult(response, tuple(evs), done, error_type, error)
    assert TurnResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


@given(
    st.text(min_size=1),
    st.text().filter(str.strip),  # a task's prompt is its first message: never blank
    st.dictionaries(st.from_regex(r"[a-z]{1,8}(/[a-z]{1,8}){0,2}", fullmatch=True), st.text()),
)
def test_task_round_trips_through_json(task_id: str, prompt: str, files: dict[str, str]) -> None:
    task = Task.from_dict({"id": task_id, "prompt": prompt, "files": files, "meta": {"k": 1}})
    assert Task.from_dict(json.loads(json.dumps(task.to_dict()))) == task
