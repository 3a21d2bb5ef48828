"""BFCL-v0: the ground truth scores 1.0 under BFCL's own checker; what it refuses scores 0.0.

Every episode runs the reference harness in model mode: the test's policy answers each
model call (``GroundTruthPolicy``), the harness calls the env's BFCL tools over the
bridge, and the env scores the calls the bridge saw with BFCL's ``multi_turn_checker``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from support.bfcl import play

from gym_harness.errors import ConfigError, ForkUnsupported
from gym_harness.suites.bfcl import (
    CATEGORIES,
    BFCLEnv,
    GroundTruthPolicy,
    check,
    parse_call,
    scripted_user,
    tasks,
)
from gym_harness.suites.bfcl.data import ADDED_FUNCTIONS_PROMPT, load_category

MakeEnv = Callable[..., BFCLEnv]

#: Tasks whose ground truth no harness can reach through the tools BFCL offers: BFCL's
#: data calls a function at a turn before the one its ``missed_function`` offers it at.
UNREACHABLE = {
    "multi_turn_miss_func_49": "its ground truth calls tail at turn 1; BFCL withholds tail "
    "until turn 3",
}


def _ground_truth_failures(env: BFCLEnv, task_ids: list[str] | None = None) -> dict[str, Any]:
    """Play the ground truth on each task; return what did not score 1.0, and why."""
    failures: dict[str, Any] = {}
    for task in env.suite:
        if task_ids is not None and task.id not in task_ids:
            continue
        reward, info, _ = play(env, task)
        bfcl = info["bfcl"]
        if reward != 1.0 or not bfcl["valid"] or not all(bfcl["turn_valid"]):
            failures[task.id] = (reward, info["error_type"], bfcl["error_type"], bfcl["error"])
        else:
            assert bfcl["done"] and bfcl["turn"] == len(task.turns) == bfcl["turns"]
    return failures


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.xdist_group("bfcl-base")
def test_ground_truth_scores_one_on_every_base_task(bfcl_env: MakeEnv) -> None:
    env = bfcl_env("base")
    assert len(env.suite) == 200
    assert _ground_truth_failures(env) == {}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("category", ["miss_param", "miss_func", "long_context"])
def test_ground_truth_scores_one_on_the_other_categories(bfcl_env: MakeEnv, category: str) -> None:
    """Every tenth task of each (all of them were run by hand: the same result)."""
    env = bfcl_env(category)
    sample = [task.id for task in env.suite[::10]]
    if category == "miss_func":
        sample.append("multi_turn_miss_func_49")
    failures = _ground_truth_failures(env, sample)
    assert set(failures) == {t for t in UNREACHABLE if t in sample}, failures


def _first_with_calls(env: BFCLEnv, least: int = 2) -> Any:
    return next(t for t in env.suite if len(t.ground_truth[0]) >= least)


def test_a_dropped_call_scores_zero_with_the_checkers_reason(bfcl_env: MakeEnv) -> None:
    env = bfcl_env("base")
    task = _first_with_calls(env)
    answers = [list(turn) for turn in task.ground_truth]
    dropped = answers[0].pop()
    reward, info, _ = play(env, task, GroundTruthPolicy(task, answers))
    bfcl = info["bfcl"]
    assert reward == 0.0, (dropped, bfcl)
    assert bfcl["done"] and not bfcl["valid"]
    assert bfcl["error_type"].startswith("multi_turn:"), bfcl
    assert bfcl["failed_turn"] == 0 and bfcl["error"], bfcl
    assert bfcl["turn_valid"][0] is False
    # The same episode with the ground truth whole scores 1.0: the drop made the difference.
    assert play(env, task)[0] == 1.0


def test_a_changed_argument_scores_zero(bfcl_env: MakeEnv) -> None:
    env = bfcl_env("base")
    task = next(t for t in env.suite if any("cd(folder=" in c for c in t.ground_truth[0]))
    answers = [list(turn) for turn in task.ground_truth]
    at = next(i for i, c in enumerate(answers[0]) if c.startswith("cd(folder="))
    answers[0][at] = "cd(folder='no_such_folder')"
    reward, info, _ = play(env, task, GroundTruthPolicy(task, answers))
    assert reward == 0.0
    assert info["bfcl"]["error_type"] in (
        "multi_turn:instance_state_mismatch",
        "multi_turn:execution_response_mismatch",
    ), info["bfcl"]


def test_the_harness_sees_bfcls_names_and_schemas_less_the_excluded(bfcl_env: MakeEnv) -> None:
    env = bfcl_env("base")
    task = next(t for t in env.suite if t.excluded)
    obs, info = env.reset(options={"task_id": task.id})
    request = json.loads(obs)
    offered = {tool["function"]["name"]: tool["function"] for tool in request["tools"]}
    assert set(offered) == task.offered(0)
    assert not task.excluded & set(offered)
    function = next(iter(offered.values()))
    assert function["parameters"]["type"] == "object"
    assert {spec.name for spec in env.list_tools()} == set(offered)
    assert request["messages"][0]["content"] == task.turns[0]
    assert info["bfcl"]["next_user"] == task.turns[0] and info["bfcl"]["turn"] == 0


def test_the_withheld_function_appears_at_its_turn(bfcl_env: MakeEnv) -> None:
    env = bfcl_env("miss_func")
    task = env.suite[0]
    (at, held), *_ = task.missed.items()
    reward, info, requests = play(env, task)
    assert reward == 1.0, info["bfcl"]
    for request in requests:
        turn = sum(1 for m in request["messages"] if m["role"] == "user") - 1
        names = {tool["function"]["name"] for tool in request["tools"]}
        assert set(held) <= names if turn >= at else not set(held) & names, (turn, held)
    users = [m["content"] for m in requests[-1]["messages"] if m["role"] == "user"]
    assert users[at] == ADDED_FUNCTIONS_PROMPT
    assert task.ground_truth[at - 1] == ()  # the withheld turn: an apology, no call


def test_a_second_episode_of_a_task_starts_afresh(bfcl_env: MakeEnv) -> None:
    env = bfcl_env("base")
    task = env.suite[0]
    assert play(env, task)[0] == 1.0
    assert play(env, task)[0] == 1.0  # neither the backends nor the checker kept state


def test_tasks_lists_ids_and_turns() -> None:
    for category in CATEGORIES:
        listed = tasks(category)
        assert len(listed) == 200
        assert [t.id for t in listed][:2] == [
            f"multi_turn_{category}_0",
            f"multi_turn_{category}_1",
        ]
        assert all(
            t.turns == len(b.turns) >= 1
            for t, b in zip(listed, load_category(category), strict=True)
        )
    with pytest.raises(ConfigError, match="category must be one of"):
        tasks("live_simple")


def test_the_checker_and_the_call_parser_on_bfcls_strings() -> None:
    task = load_category("base")[0]
    assert check(task, [list(turn) for turn in task.ground_truth]).valid
    verdict = check(task, [])
    assert not verdict.valid and verdict.turn == 0
    assert verdict.error_type == "multi_turn:empty_turn_model_response"
    assert parse_call("mv(source='a.txt', destination='temp')", {}) == {
        "name": "mv",
        "arguments": {"source": "a.txt", "destination": "temp"},
    }
    assert parse_call("mean([1, 2])", {"mean": ["numbers"]})["arguments"] == {"numbers": [1, 2]}
    with pytest.raises(ConfigError, match="cannot read the BFCL call"):
        parse_call("import os", {})


def test_keywords_the_suite_sets_are_refused() -> None:
    with pytest.raises(ConfigError, match="sets \\['tools'\\] itself"):
        BFCLEnv(tools=[])
    with pytest.raises(ConfigError, match="category must be one of"):
        BFCLEnv(category="nope")


@pytest.mark.slow
def test_turn_mode_sends_each_user_turn_from_info_and_ends_with_the_last() -> None:
    """The reference harness's scripted policy makes no calls: the turns run, the checker
    says why the task failed."""
    import gymnasium

    env = gymnasium.make("gym_harness/BFCL-v0")
    try:
        task = env.unwrapped.suite[0]
        reply, info = env.reset(options={"task_id": task.id})
        message = scripted_user(reply, info)
        sent = []
        while message is not None:
            sent.append(message)
            reply, reward, terminated, truncated, info = env.step(message)
            if terminated or truncated:
                break
            message = scripted_user(reply, info)
        assert sent == list(task.turns)
        assert (terminated, truncated, reward) == (True, False, 0.0)
        assert info["bfcl"]["done"] and info["bfcl"]["failed_turn"] == 0
        assert info["bfcl"]["next_user"] == "" and scripted_user(reply, info) is None
        assert set(info) == set(env.reset(options={"task_id": task.id})[1])
    finally:
        env.close()


def test_import_gym_harness_loads_no_bfcl_eval() -> None:
    code = (
        "import sys, gymnasium, gym_harness\n"
        "assert 'gym_harness/BFCL-v0' in gymnasium.registry\n"
        "print(sorted(m for m in sys.modules if m.startswith(('bfcl_eval', 'mpmath'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_without_bfcl_eval_the_suite_says_how_to_install_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['bfcl_eval'] = None  # as if it were not installed\n"
        "try:\n"
        "    import gym_harness.suites.bfcl\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("ConfigError"), out
    assert "pip install 'gym_harness[bfcl]'" in out.stdout
    assert "pip install --no-deps 'bfcl-eval==" in out.stdout


@pytest.mark.slow
def test_make_vec_runs_bfcl_envs_in_workers() -> None:
    import gymnasium

    task = load_category("base")[1]
    envs = gymnasium.make_vec("gym_harness/BFCL-v0", num_envs=2, mode="model")
    try:
        obs, _ = envs.reset(options={"task_id": task.id})
        policies = [GroundTruthPolicy(task), GroundTruthPolicy(task)]
        rewards: list[float | None] = [None, None]
        for _ in range(40):
            actions = [
                json.dumps(p(json.loads(o))) if o else ""
                for p, o in zip(policies, obs, strict=True)
            ]
            obs, reward, terminated, truncated, info = envs.step(actions)
            for i in range(2):
                if (terminated[i] or truncated[i]) and rewards[i] is None:
                    rewards[i] = float(reward[i])
            if None not in rewards:
                break
        assert rewards == [1.0, 1.0], info
    finally:
        envs.close()


def test_an_episode_refuses_to_fork(bfcl_env: MakeEnv) -> None:
    env = bfcl_env("base")
    env.reset(options={"task_id": env.suite[0].id})
    with pytest.raises(ForkUnsupported, match="do not fork"):
        env.fork()


def test_a_call_the_checker_could_not_read_safely_is_refused_unrecorded(
    bfcl_env: MakeEnv,
) -> None:
    env = bfcl_env("base")
    task = load_category("base")[1]
    env.reset(options={"task_id": task.id})
    hostile = env.call_tool("ls", {"a=__import__('os').getpid(), b": True})
    assert hostile.is_error and "identifiers" in hostile.text
    withheld = env.call_tool("cp", {"source": "a", "destination": "b"})  # excluded here
    assert withheld.is_error and "not available" in withheld.text
    assert env.backends.calls() == [[]]
    assert not env.call_tool("ls", {"a": True}).is_error
    assert env.backends.calls() == [["ls(a=True)"]]


def test_math_past_a_thousand_digits_is_refused_unrecorded_and_the_rest_runs(
    bfcl_env: MakeEnv,
) -> None:
    # Each of these holds the interpreter for minutes if run (a C call), and the checker
    # would run it again from the record.
    env = bfcl_env("base")
    task = next(t for t in load_category("base") if "MathAPI" in t.involved_classes)
    env.reset(options={"task_id": task.id})
    costly = [
        ("power", {"base": 10, "exponent": 10**9}),
        ("power", {"base": -3, "exponent": int("9" * 4000)}),
        ("round_number", {"number": 5, "decimal_places": -(10**7)}),
        ("logarithm", {"value": 7, "base": 3, "precision": 10**6}),
        ("square_root", {"number": 2, "precision": 1e300}),
    ]
    for name, arguments in costly:
        refused = env.call_tool(name, arguments)
        assert refused.is_error and "at most 1000 digits" in refused.text, (name, refused)
    assert env.backends.calls() == [[]]
    cheap = [
        ("power", {"base": 2, "exponent": 3000}),  # 904 digits
        ("power", {"base": 10, "exponent": -(10**9)}),  # a float: 0.0 at once
        ("power", {"base": 2.0, "exponent": 10**9}),  # a float: overflows at once
        ("round_number", {"number": 5.5, "decimal_places": 0}),
        ("logarithm", {"value": 8, "base": 2, "precision": 1000}),
    ]
    answers = [env.call_tool(name, arguments) for name, arguments in cheap]
    assert answers[0].text == json.dumps({"result": 2**3000})
    assert not answers[1].is_error and "0.0" in answers[1].text
    assert answers[2].is_error and "Error during execution" in answers[2].text
    assert answers[3].text == json.dumps({"result": 6.0})
    assert answers[4].text == "{'result': mpf('3.0')}"  # as BFCL's executor writes it
    assert len(env.backends.calls()[0]) == len(cheap)
