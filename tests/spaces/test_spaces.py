"""UnicodeText: membership, sampling, pickling, and use by gymnasium's checker and vector envs."""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
import pickle
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import psutil
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv
from gymnasium.vector.utils import batch_differing_spaces, create_empty_array
from hypothesis import given, settings
from hypothesis import strategies as st

from gym_harness.spaces.memory import TextBatchView, TextSegments
from gym_harness.spaces.text import UnicodeText

SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)


@given(st.text(max_size=50))
def test_contains_any_valid_text_within_bounds(text: str) -> None:
    assert UnicodeText(50).contains(text)
    assert text in UnicodeText(len(text), min_length=len(text))


@given(st.text(min_size=1, max_size=30))
def test_contains_checks_both_length_bounds(text: str) -> None:
    assert not UnicodeText(len(text) - 1).contains(text)
    assert not UnicodeText(100, min_length=len(text) + 1).contains(text)


@given(st.text(max_size=10), SURROGATES, st.text(max_size=10))
def test_a_lone_surrogate_is_not_contained(before: str, surrogate: str, after: str) -> None:
    assert not UnicodeText(100).contains(before + surrogate + after)


@pytest.mark.parametrize("value", [b"bytes", 3, None, ["a"], ("a",), np.array(["a"])])
def test_non_strings_are_not_contained(value: Any) -> None:
    assert not UnicodeText(10).contains(value)


def test_numpy_str_is_a_str() -> None:
    assert UnicodeText(10).contains(np.str_("héllo"))


@settings(max_examples=50)
@given(
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=0, max_value=300),
    st.integers(min_value=0, max_value=300),
)
def test_samples_are_members_and_valid_utf8(seed: int, a: int, b: int) -> None:
    space = UnicodeText(max(a, b), min_length=min(a, b), seed=seed)
    for _ in range(5):
        sample = space.sample()
        assert isinstance(sample, str)
        assert sample in space
        assert sample.encode("utf-8").decode("utf-8") == sample


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_sampling_is_reproducible_from_the_seed(seed: int) -> None:
    first = UnicodeText(200, seed=seed)
    second = UnicodeText(200)
    second.seed(seed)
    assert [first.sample() for _ in range(3)] == [second.sample() for _ in range(3)]


def test_samples_mix_ascii_and_non_ascii_across_planes() -> None:
    space = UnicodeText(1000, min_length=1000, seed=7)
    text = "".join(space.sample() for _ in range(5))
    ascii_share = sum(c.isascii() for c in text) / len(text)
    assert 0.4 < ascii_share < 0.6
    assert any(0x80 <= ord(c) <= 0xFFFF for c in text)
    assert any(ord(c) > 0xFFFF for c in text)
    assert "\n" in text


def test_sample_lengths_span_the_bounds() -> None:
    space = UnicodeText(3, min_length=1, seed=1)
    assert {len(space.sample()) for _ in range(200)} == {1, 2, 3}
    assert UnicodeText(0, seed=1).sample() == ""


def test_sample_mask_fixes_the_length() -> None:
    space = UnicodeText(20, seed=3)
    assert len(space.sample(mask=(12, None))) == 12
    assert len(space.sample(mask=(None, None))) <= 20


@pytest.mark.parametrize(
    ("mask", "probability"),
    [((21, None), None), ((5, np.ones(3, dtype=np.int8)), None), (5, None), (None, (3, None))],
)
def test_unsupported_sample_arguments_raise(mask: Any, probability: Any) -> None:
    with pytest.raises(ValueError, match=r"UnicodeText\.sample"):
        UnicodeText(20).sample(mask=mask, probability=probability)


@pytest.mark.parametrize(
    ("args", "error"),
    [((5, -1), ValueError), ((5, 6), ValueError), ((5.0, 0), TypeError), ((True, 0), TypeError)],
)
def test_bad_bounds_raise(args: tuple[Any, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match="UnicodeText"):
        UnicodeText(*args)


def test_equality_hash_and_repr() -> None:
    space = UnicodeText(10, min_length=2)
    assert space == UnicodeText(10, 2)
    assert space != UnicodeText(10, 1)
    assert space != UnicodeText(11, 2)
    assert space != gym.spaces.Text(10, min_length=2)
    assert hash(space) == hash(UnicodeText(10, 2))
    assert repr(space) == "UnicodeText(max_length=10, min_length=2)"
    assert eval(repr(space), {"UnicodeText": UnicodeText}) == space


def test_is_not_np_flattenable() -> None:
    assert UnicodeText(10).is_np_flattenable is False


def test_pickle_is_small_and_keeps_the_generator_state() -> None:
    space = UnicodeText(1_000_000, seed=5)
    space.sample()
    data = pickle.dumps(space)
    assert len(data) < 2048
    clone = pickle.loads(data)
    assert clone == space
    assert clone.sample(mask=(50, None)) == space.sample(mask=(50, None))
    assert copy.deepcopy(space) == space


@given(st.lists(st.text(max_size=20), max_size=5))
def test_jsonable_round_trip(batch: list[str]) -> None:
    space = UnicodeText(20)
    encoded = json.loads(json.dumps(space.to_jsonable(batch)))
    assert space.from_jsonable(encoded) == batch


class _EchoEnv(gym.Env[str, str]):
    """The smallest text env: the observation is the last action."""

    def __init__(self) -> None:
        self.observation_space = UnicodeText(64)
        self.action_space = UnicodeText(64)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        return "", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action not in self.action_space:
            raise ValueError(f"action not in {self.action_space}: {action!r}")
        return action, float(len(action)), False, False, {}


def test_passes_gymnasium_env_checker() -> None:
    env = _EchoEnv()
    check_env(env, skip_render_check=True)  # any checker warning fails (filterwarnings=error)
    env.close()


def test_sync_vector_env_batches_strings() -> None:
    envs = SyncVectorEnv([_EchoEnv, _EchoEnv])
    try:
        observations, _ = envs.reset(seed=0)
        assert observations == ("", "")
        actions = envs.action_space.sample()
        assert isinstance(actions, tuple) and all(a in UnicodeText(64) for a in actions)
        observations, rewards, *_ = envs.step(("héllo", "世界 🎉"))
        assert observations == ("héllo", "世界 🎉")
        assert list(rewards) == [5.0, 4.0]
    finally:
        envs.close()


def test_vector_helpers_know_the_space() -> None:
    assert create_empty_array(UnicodeText(5, min_length=2), n=3) == ("  ",) * 3
    batched = batch_differing_spaces([UnicodeText(5), UnicodeText(7, 1)])
    assert batched == gym.spaces.Tuple([UnicodeText(5), UnicodeText(7, 1)])


def test_async_vector_env_without_shared_memory() -> None:
    envs = AsyncVectorEnv([_EchoEnv, _EchoEnv], shared_memory=False)
    try:
        envs.reset(seed=0)
        observations, *_ = envs.step(("a\u00e9\U0001f600", "b"))
        assert observations == ("a\u00e9\U0001f600", "b")
    finally:
        envs.close()


# ---------------------------------------------------------------- AsyncVectorEnv, shared memory

BIG = 16 * 1024 * 1024


class _BigEchoEnv(_EchoEnv):
    """``_EchoEnv`` whose texts may be as long as HarnessEnv's (16M code points)."""

    def __init__(self) -> None:
        self.observation_space = UnicodeText(BIG)
        self.action_space = UnicodeText(BIG)


def _memfds() -> list[str]:
    """This process's open text segments (their /proc/self/fd links)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed between listdir and readlink (the listing's own fd)
            continue
        if "gym_harness-text" in target:
            found.append(target)
    return found


def _shm() -> set[str]:
    """Named shared memory this process holds (mapped or open), and any gym_harness name.

    Other programs on the machine create and remove their own /dev/shm entries
    meanwhile, so the directory as a whole is no measure of ours.
    """
    held = {
        line.split(maxsplit=5)[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if "/dev/shm/" in line and not line.endswith("(deleted)")
    }
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{name}")
            if target.startswith("/dev/shm/") and not target.endswith("(deleted)"):
                held.add(target)
    return held | {name for name in os.listdir("/dev/shm") if "gym_harness" in name}


# Lengths around nothing, one character, the pipe buffer, and 10 MB of 1- to 4-byte UTF-8.
TEXTS = [
    "",
    "a",
    "x" * 65_537,
    "héllo 世界 🎉\n\t\x00",
    ("0123456789abcde\n" * (10 * 1024 * 1024 // 16))[:-1] + "é",
    "世界🎉é" * (10 * 1024 * 1024 // 11),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_async_vector_env_shared_memory_round_trips_any_length(context: str) -> None:
    shm_before, fds_before = _shm(), _memfds()
    envs = AsyncVectorEnv([_BigEchoEnv, _BigEchoEnv], context=context)  # shared_memory=True
    try:
        observations, _ = envs.reset(seed=0)
        assert observations == ("", "")
        for first, second in zip(TEXTS, reversed(TEXTS), strict=True):  # long, then short
            observations, *_ = envs.step((first, second))
            assert type(observations) is tuple  # a deep copy: plain strings, as without it
            assert observations[0] == first and observations[1] == second
    finally:
        envs.close()
        del envs
        gc.collect()  # spawn's own named semaphores (gymnasium's error queue) go with it
        if context == "spawn":  # multiprocessing starts one tracker per parent for spawn
            resource_tracker._resource_tracker._stop()
    assert _shm() == shm_before  # no named segment, ever
    assert _memfds() == fds_before  # the parent's descriptors go with the vector env


@settings(max_examples=25, deadline=None)
@given(st.lists(st.text(max_size=300), min_size=2, max_size=2))
def test_shared_memory_segments_round_trip_text(texts: list[str]) -> None:
    segments = TextSegments(2)
    try:
        for index, text in enumerate(texts):
            segments.write(index, text)
        assert TextBatchView(segments) == tuple(texts)
        assert copy.deepcopy(TextBatchView(segments)) == tuple(texts)
    finally:
        segments.close()


def test_shared_memory_view_without_copy_shows_the_latest_step() -> None:
    envs = AsyncVectorEnv([_EchoEnv, _EchoEnv], copy=False)
    try:
        envs.reset(seed=0)
        view, *_ = envs.step(("first", "é"))
        assert list(view) == ["first", "é"] and view[-1] == "é" and view[:1] == ("first",)
        envs.step(("second", ""))
        assert list(view) == ["second", ""]
    finally:
        envs.close()


def test_shared_memory_segments_do_not_pickle_outside_a_process_start() -> None:
    segments = TextSegments(1)
    try:
        with pytest.raises(RuntimeError, match="inheritance"):
            pickle.dumps(segments)
    finally:
        segments.close()


@pytest.mark.timeout(60)
def test_close_terminate_leaves_no_segment_and_no_worker() -> None:
    shm_before = _shm()
    envs = AsyncVectorEnv([_BigEchoEnv, _BigEchoEnv])
    envs.reset(seed=0)
    envs.step(("a" * 1_000_000, "b"))
    workers = [psutil.Process(p.pid) for p in envs.processes]
    envs.close(terminate=True)
    _gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive
    assert _shm() == shm_before
