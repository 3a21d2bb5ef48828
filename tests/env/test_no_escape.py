"""Nothing escapes a step: every harness fault is an outcome, and no
turn is ever shifted or lost. Each case goes through ``gymnasium.make`` with a real
hostile harness process (``tests/support/scripts/hostile.py``) and checks the outcome, that
every turn is in the trajectory, and that the next step answers its own message
or says that ``reset()`` is needed.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from typing import Any

import gymnasium
import pytest
from gymnasium.error import ResetNeeded
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import HOSTILE_SCRIPT

from gym_harness import (
    CallbackError,
    CommandHarness,
    EpisodeContext,
    HarnessConfig,
    HarnessEnv,
    HarnessEvent,
    Launch,
    Outcome,
    ProtocolError,
    RewardContext,
)
from gym_harness.harnesses import Feed
from gym_harness.harnesses.line import CommandSession

HOSTILE = str(HOSTILE_SCRIPT)


def make(*args: str, **kwargs: Any) -> gymnasium.Env[str, str]:
    kwargs.setdefault("turn_timeout_s", 30)
    return gymnasium.make(
        "gym_harness/Command-v0", command=[sys.executable, HOSTILE, *args], **kwargs
    )


def turns(env: gymnasium.Env[str, str]) -> list[Any]:
    return list(HarnessEnv.of(env).trajectory.turns)


def assert_reset_needed_then_fresh(env: gymnasium.Env[str, str]) -> None:
    """The episode is over: step says so; after reset, a step answers its own message."""
    with pytest.raises(ResetNeeded, match="reset"):
        env.step("after")
    env.reset()
    reply, _, terminated, truncated, info = env.step("fresh")
    assert (reply, terminated, truncated, info["error_type"]) == ("echo: fresh", False, False, "")


# -------------------------------------------------------------- 1. deep nesting


def test_deeply_nested_line_is_a_protocol_error_naming_the_bound() -> None:
    env = make()
    try:
        env.reset()
        _, _, terminated, truncated, info = env.step("deep")
        assert (terminated, truncated, info["error_type"]) == (True, False, "protocol_error")
        assert "1001 levels deep" in info["error"] and "MAX_DEPTH" in info["error"]
        assert [t.error_type for t in turns(env)] == ["protocol_error"]
        assert_reset_needed_then_fresh(env)
    finally:
        env.close()


def test_a_cut_line_is_a_protocol_error_naming_max_line_bytes() -> None:
    line = b'{"type":"text","text":"' + b"a" * 5000 + b'"}\n'
    env = make(max_line_bytes=1000)
    try:
        env.reset()
        _, _, terminated, _, info = env.step(f"raw 1 {line.hex()}")
        assert (terminated, info["error_type"]) == (True, "protocol_error")
        assert "max_line_bytes" in info["error"]
        assert len(turns(env)) == 1
        assert_reset_needed_then_fresh(env)
    finally:
        env.close()


class StrictSession(CommandSession):
    """A custom dialect's session that refuses a reply its dialect does not allow."""

    def feed(self, line: str) -> Feed:
        if "echo: forbidden" in line:
            raise ProtocolError("this dialect never replies 'forbidden'")
        return super().feed(line)


class StrictDialect(CommandHarness):
    """A custom adapter: the line protocol's launch, with a stricter session."""

    def launch(self, ctx: EpisodeContext, config: HarnessConfig) -> Launch:
        return Launch(super().launch(ctx, config).config, StrictSession())


def test_an_adapter_raising_protocol_error_is_a_protocol_error_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = gymnasium.make(
        "gym_harness/Command-v0",
        harness=StrictDialect(),
        command=[sys.executable, HOSTILE],
        turn_timeout_s=30,
    )
    try:
        env.reset()
        with caplog.at_level(logging.WARNING, logger="gym_harness"):
            _, _, terminated, truncated, info = env.step("forbidden")
        assert (terminated, truncated) == (True, False)
        assert info["error_type"] == Outcome.PROTOCOL_ERROR
        assert info["error"] == "this dialect never replies 'forbidden'"
        assert not [r for r in caplog.records if r.exc_info]  # the harness's fault, not a bug
        assert [t.error_type for t in turns(env)] == ["protocol_error"]
        assert_reset_needed_then_fresh(env)
    finally:
        env.close()


# -------------------------------------------------------------- 2. exceptions out of step()


def test_a_raising_on_event_keeps_the_turn_and_the_next_reply_is_its_own() -> None:
    def fussy_watcher(event: HarnessEvent) -> None:
        raise RuntimeError("the watcher broke")

    env = make(on_event=fussy_watcher)
    try:
        env.reset()
        with pytest.raises(CallbackError, match="fussy_watcher") as caught:
            env.step("one")
        assert isinstance(caught.value.__cause__, RuntimeError)
        assert "the watcher broke" in str(caught.value)
        (first,) = turns(env)
        assert (first.response, first.error_type) == ("echo: one", "")
        with pytest.raises(CallbackError):  # it raises again on the next turn, not shifted
            env.step("two")
        HarnessEnv.of(env).on_event = None
        reply, _, _, _, info = env.step("three")
        assert (reply, info["error_type"]) == ("echo: three", "")
        assert [t.response for t in turns(env)] == ["echo: one", "echo: two", "echo: three"]
    finally:
        env.close()


class Interrupted(BaseException):
    """Stands for a KeyboardInterrupt that lands mid-turn."""


def test_a_base_exception_mid_turn_ends_the_episode_instead_of_shifting() -> None:
    def interrupting(event: HarnessEvent) -> None:
        raise Interrupted

    env = make(on_event=interrupting)
    try:
        env.reset()
        with pytest.raises(Interrupted):
            env.step("one")
        with pytest.raises(ResetNeeded, match="raised Interrupted mid-turn"):
            env.step("two")
        HarnessEnv.of(env).on_event = None
        env.reset()
        reply, *_ = env.step("three")
        assert reply == "echo: three"
    finally:
        env.close()


# -------------------------------------------------------------- 3. writes bounded by the deadline


def test_an_action_the_harness_never_reads_is_a_turn_timeout() -> None:
    env = make("deaf", turn_timeout_s=2)
    try:
        env.reset()
        _, _, terminated, truncated, info = env.step("x" * (3 << 20))  # > the pipe buffer
        assert (terminated, truncated, info["error_type"]) == (False, True, "turn_timeout")
        assert "stdin" in info["error"]
        assert [t.error_type for t in turns(env)] == ["turn_timeout"]
        with pytest.raises(ResetNeeded):
            env.step("after")
    finally:
        env.close()


class BigInterruptSession(CommandSession):
    """A dialect's session whose interrupt is larger than the pipe buffer."""

    def interrupt_lines(self) -> list[str]:
        return ["x" * (4 << 20)]


class BigInterrupt(CommandHarness):
    """The line protocol's launch, with that session."""

    def launch(self, ctx: EpisodeContext, config: HarnessConfig) -> Launch:
        return Launch(super().launch(ctx, config).config, BigInterruptSession())


def test_a_blocked_interrupt_is_a_turn_timeout() -> None:
    env = gymnasium.make(
        "gym_harness/Command-v0",
        harness=BigInterrupt(),
        command=[sys.executable, HOSTILE],
        turn_timeout_s=1,
    )
    try:
        env.reset()
        _, _, terminated, truncated, info = env.step("stall")  # stops reading stdin
        assert (terminated, truncated, info["error_type"]) == (False, True, "turn_timeout")
        assert len(turns(env)) == 1
        assert_reset_needed_then_fresh(env)
    finally:
        env.close()


# -------------------------------------------------------------- 4. reward_fn


def broken_reward(ctx: RewardContext) -> float:
    return 1.0 / 0


def test_a_raising_reward_is_reward_error_and_the_turn_is_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = make(reward_fn=broken_reward)
    try:
        env.reset()
        with caplog.at_level(logging.ERROR, logger="gym_harness"):
            reply, reward, terminated, truncated, info = env.step("one")
        assert (reply, reward, terminated, truncated) == ("echo: one", 0.0, True, False)
        assert info["error_type"] == "reward_error" == Outcome.REWARD_ERROR
        assert "broken_reward" in info["error"] and "ZeroDivisionError" in info["error"]
        (logged,) = [r for r in caplog.records if r.exc_info]
        assert logged.exc_info is not None and logged.exc_info[0] is ZeroDivisionError
        ((first),) = turns(env)
        assert (first.response, first.error_type, first.reward) == (
            "echo: one",
            "reward_error",
            0.0,
        )
        HarnessEnv.of(env).reward_fn = None
        assert_reset_needed_then_fresh(env)
    finally:
        env.close()


def test_a_hanging_reward_is_reward_timeout() -> None:
    release = threading.Event()
    calls: list[int] = []

    def slow_reward(ctx: RewardContext) -> float:
        calls.append(ctx.turn)
        release.wait(30)
        return 1.0

    env = make(reward_fn=slow_reward, reward_timeout_s=0.5)
    try:
        env.reset()
        reply, reward, terminated, truncated, info = env.step("one")
        assert (reply, reward, terminated, truncated) == ("echo: one", 0.0, False, True)
        assert info["error_type"] == "reward_timeout" and "reward_timeout_s=0.5" in info["error"]
        assert len(turns(env)) == 1
        with pytest.raises(ResetNeeded):
            env.step("two")
        env.reset()
        # The first call still runs: the reward is not called a second time meanwhile.
        _, _, _, truncated, info = env.step("three")
        assert truncated and "still running" in info["error"]
        assert calls == [1]
    finally:
        release.set()
        env.close()


# -------------------------------------------------------------- 5. liveness is the pid we started


def test_the_harness_dying_while_a_child_holds_stdout_is_a_crash() -> None:
    env = make()
    try:
        env.reset()
        reply, _, terminated, truncated, info = env.step("forkdie")
        assert (terminated, truncated, info["error_type"]) == (True, False, "harness_crashed")
        assert info["exit_code"] == -9
        assert reply == "forking"
        assert len(turns(env)) == 1
        assert_reset_needed_then_fresh(env)
    finally:
        env.close()


# -------------------------------------------------------------- 6. exit_code


def test_exit_code_is_the_harness_own_status_else_zero() -> None:
    env = make()
    try:
        env.reset()
        _, _, _, _, info = env.step("one")
        assert info["exit_code"] == 0
        _, _, terminated, _, info = env.step("/done")  # we stop it after this turn
        assert terminated and (info["error_type"], info["exit_code"]) == ("", 0)
        env.reset()
        _, _, terminated, _, info = env.step("exit 3")
        assert terminated and (info["error_type"], info["exit_code"]) == ("harness_crashed", 3)
        assert len(turns(env)) == 1
        assert_reset_needed_then_fresh(env)
    finally:
        env.close()


# -------------------------------------------------------------- arbitrary output (hypothesis)

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
_json_values = st.recursive(
    _scalars,
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3)
    ),
    max_leaves=12,
)
_KINDS = ["text", "tool_call", "tool_result", "llm_usage", "error", "ready", "other", "mystery"]


def _typed(kind: str, extra: dict[str, Any]) -> bytes:
    return json.dumps({**extra, "type": kind}).encode() + b"\n"


def _deep(depth: int, kind: str) -> bytes:
    opener, closer = (b"[", b"]") if kind == "list" else (b'{"a":', b"}")
    return b'{"type":"text","text":' + opener * depth + b"0" + closer * depth + b"}\n"


#: One harness output line (or a piece of one): anything a hostile harness could print.
_LINES = st.one_of(
    st.binary(max_size=300),  # random bytes: NUL, invalid UTF-8, newlines or none
    _json_values.map(lambda v: json.dumps(v).encode() + b"\n"),
    st.builds(_typed, st.sampled_from(_KINDS), st.dictionaries(st.text(max_size=8), _json_values)),
    st.builds(_deep, st.integers(1, 3000), st.sampled_from(["list", "dict"])),
    st.integers(1, 20_000).map(lambda n: b'{"type":"text","n":' + b"9" * n + b"}\n"),
    st.integers(1, 400).map(lambda n: b'{"type":"text","x":1e' + b"9" * n + b"}\n"),
    st.sampled_from(
        [b"\x00\n", b"\xff\xfe\xfd\n", b'{"type":"text","text":"\xc3\x28"}\n', b"{", b"\n", b"\r\n"]
    ),
).filter(lambda line: b"turn_complete" not in line)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("plain_text", [False, True])
def test_arbitrary_output_never_escapes_and_never_shifts(plain_text: bool) -> None:
    env = make(allow_plain_text=plain_text, turn_timeout_s=10, idle_timeout_s=10)
    state = {"step": 0, "lines": 0, "in_episode": 0}
    env.reset()

    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(st.lists(_LINES, min_size=1, max_size=4), st.integers(0, 9))
    def one_step(lines: list[bytes], exit_roll: int) -> None:
        state["step"] += 1
        n = state["step"]
        data = b"".join(lines)
        state["lines"] += data.count(b"\n") + 1
        how = "rawexit" if exit_roll == 0 else "raw"  # sometimes: exit after the bytes
        reply, reward, terminated, truncated, info = env.step(f"{how} {n} {data.hex()}")
        state["in_episode"] += 1
        assert len(turns(env)) == state["in_episode"]  # every turn is recorded
        assert isinstance(reward, float) and isinstance(info["error_type"], str)
        if info["error_type"] == "":
            assert reply == f"reply-{n}"  # its own reply, never an earlier one
        else:
            assert Outcome(info["error_type"]).terminates or Outcome(info["error_type"]).truncates
            assert not (reply.startswith("reply-") and reply != f"reply-{n}")
        if terminated or truncated:
            with pytest.raises(ResetNeeded):
                env.step("after")
            env.reset()
            state["in_episode"] = 0

    try:
        one_step()
    finally:
        env.close()
    assert state["lines"] >= 500
