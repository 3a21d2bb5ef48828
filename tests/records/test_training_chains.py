"""Token chains: the observation's ``extends``/``new_from``, and the trace's ``chains``.

A scripted token-level policy builds each call's prompt ids by the chain rule (the
previous prompt ids, the previous completion ids, then its own ids for only the messages
from ``new_from`` on; the whole conversation anew where ``extends`` is false), with
synthetic ids: no tokenizer is needed to check that the trace merges what the actions
carried. The episodes are real: ``Reference-v0`` in model mode (the reference agent
calls the env's endpoint and runs the tool over the bridge), and the model-mode Command
agent (``support/scripts/model_agent.py``), whose ``compact`` word rewrites its history.
The merge itself is property-tested on records built in the test.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import gymnasium
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import MODEL_AGENT

import gym_harness  # noqa: F401  (registers the env ids)
from gym_harness import HarnessEnv
from gym_harness.model._link import link
from gym_harness.model.action import Completion, InvalidAction, ToolCall, parse_action
from gym_harness.model.request import ModelRequest, read_request
from gym_harness.outcome import Outcome
from gym_harness.records.training import record_trace, training_trace

ROLES = {"system": 1, "user": 2, "assistant": 3, "tool": 4}


def render(messages: list[dict[str, Any]]) -> list[int]:
    """Synthetic token ids of chat messages: a role id, a few content ids, an end id."""
    ids: list[int] = []
    for message in messages:
        text = str(message.get("content") or "") + json.dumps(message.get("tool_calls") or [])
        ids += [ROLES.get(message["role"], 5), *(100 + ord(c) % 100 for c in text[:6]), 9]
    return ids


class ChainPolicy:
    """Builds each call's prompt ids by the chain rule (``follow=False``: always anew)."""

    def __init__(self, follow: bool = True) -> None:
        self.follow = follow
        self.ids: list[int] | None = None  # the last prompt + completion
        self.prompts: list[list[int]] = []

    def act(self, obs: dict[str, Any], answer: dict[str, Any], completion: list[int],
            version: int | str | None = None) -> str:  # fmt: skip
        if self.follow and obs["extends"] and self.ids is not None:
            prompt = self.ids + render(obs["messages"][obs["new_from"] :])
        else:
            prompt = render(obs["messages"])
        self.ids = prompt + completion
        self.prompts.append(prompt)
        logprobs = [-0.5 - i / 8 for i in range(len(completion))]
        action = {**answer, "prompt_token_ids": prompt, "token_ids": completion,
                  "logprobs": logprobs}  # fmt: skip
        if version is not None:
            action["policy_version"] = version
        return json.dumps(action)


def reference_env(**kwargs: Any) -> Any:
    return gymnasium.make("gym_harness/Reference-v0", mode="model", **kwargs)


def use_tool(obs: dict[str, Any]) -> dict[str, Any]:
    name = next(t["function"]["name"] for t in obs["tools"] if t["function"]["name"] == "add")
    return {"content": "", "tool_calls": [{"name": name, "arguments": {"a": 2, "b": 3}}]}


def logprobs_of(completion: list[int]) -> list[float]:
    return [-0.5 - i / 8 for i in range(len(completion))]


@pytest.mark.timeout(240)
def test_a_tool_call_then_an_answer_is_one_chain_masked_over_the_inserted_ids() -> None:
    env = reference_env()
    policy = ChainPolicy()
    c1, c2 = [11, 12, 13], [21, 22]
    try:
        obs, info = env.reset(seed=0)
        first = json.loads(obs)
        assert info["error_type"] == "" and (first["extends"], first["new_from"]) == (False, 0)
        obs, _, term, _, info = env.step(policy.act(first, use_tool(first), c1, version=1))
        assert (term, info["error_type"]) == (False, ""), info["error"]
        second = json.loads(obs)
        # The conversation so far, the answer as the harness echoes it, then the tool result.
        assert second["extends"] is True
        assert second["messages"][: len(first["messages"])] == first["messages"]
        new = second["messages"][second["new_from"] :]
        assert second["new_from"] == len(first["messages"]) + 1
        assert [m["role"] for m in new] == ["tool"] and new[0]["content"] == "5"
        _, _, term, _, info = env.step(policy.act(second, {"content": "It is 5."}, c2, "v2"))
        assert (term, info["error_type"]) == (True, ""), info["error"]
        trajectory = HarnessEnv.of(env).trajectory
        record = trajectory.to_record(env_id="e", index=0, seed=0, total_s=1.0)
    finally:
        env.close()
    trace = trajectory.training_trace()
    (chain,) = trace["chains"]
    main = [c for c in trajectory.calls if not c.side]
    assert chain["node_ids"] == [f"call-{c.request_id}" for c in main]
    inserted = render(new)
    assert chain["prompt_token_ids"] == policy.prompts[0]
    assert chain["completion_token_ids"] == c1 + inserted + c2
    assert chain["mask"] == [1] * 3 + [0] * len(inserted) + [1] * 2
    assert chain["logprobs"] == logprobs_of(c1) + [0.0] * len(inserted) + logprobs_of(c2)
    end = 3 + len(inserted)
    assert chain["policy_versions"] == [[0, 3, 1], [end, end + 2, "v2"]]
    assert chain["break"] == ""
    # Every sampled token is scored in the context it was sampled in.
    assert policy.prompts[1] == chain["prompt_token_ids"] + chain["completion_token_ids"][:end]
    # The versions are on the calls, the per-call rows, and the record read back from disk.
    assert [c.policy_version for c in main] == [1, "v2"]
    assert [t["metadata"]["policy_version"] for t in trace["turns"]] == [1, "v2"]
    assert [c["policy_version"] for c in record["calls"]] == [1, "v2"]
    assert [(c["extends"], c["new_from"]) for c in record["calls"]] == [
        (False, 0),
        (True, second["new_from"]),
    ]
    assert record_trace(json.loads(json.dumps(record))) == trace


@pytest.mark.timeout(240)
def test_a_policy_that_does_not_extend_the_chain_breaks_it_and_says_where() -> None:
    env = reference_env()
    policy = ChainPolicy(follow=False)  # renders the whole conversation at every call
    try:
        first = json.loads(env.reset(seed=0)[0])
        second = json.loads(env.step(policy.act(first, use_tool(first), [11, 12]))[0])
        assert second["extends"] is True  # the harness kept its history; the policy did not
        env.step(policy.act(second, {"content": "It is 5."}, [21]))
        trajectory = HarnessEnv.of(env).trajectory
    finally:
        env.close()
    one, two = trajectory.training_trace()["chains"]
    size = len(policy.prompts[0]) + 2
    nodes = [f"call-{c.request_id}" for c in trajectory.calls if not c.side]
    assert (one["node_ids"], two["node_ids"]) == ([nodes[0]], [nodes[1]])
    assert one["break"] == (
        f"{nodes[1]}'s prompt_token_ids differ from the chain's prompt and completion so far "
        f"at token {len(policy.prompts[0])} of {size}: they are no extension of it"
    )
    assert (one["completion_token_ids"], one["mask"]) == ([11, 12], [1, 1])
    assert two["prompt_token_ids"] == policy.prompts[1] and two["break"] == ""
    assert (two["completion_token_ids"], two["mask"], two["policy_versions"]) == (
        [21],
        [1],
        [[0, 1, None]],
    )


@pytest.mark.timeout(240)
def test_a_harness_that_rewrites_its_history_does_not_extend_and_the_chain_breaks() -> None:
    env = HarnessEnv(
        "command",
        command=[sys.executable, str(MODEL_AGENT)],
        mode="model",
        tools=[add],
        tasks=[{"id": "t", "prompt": "compact: what is 2+3?"}],
    )
    policy = ChainPolicy()
    try:
        first = json.loads(env.reset(seed=0)[0])
        second = json.loads(env.step(policy.act(first, use_tool(first), [11, 12]))[0])
        assert second["messages"][0]["content"].startswith("summary: ")
        assert (second["extends"], second["new_from"]) == (False, 0)
        _, _, term, _, info = env.step(policy.act(second, {"content": "5"}, [21]))
        assert (term, info["error_type"]) == (True, ""), info["error"]
        trajectory = env.trajectory
    finally:
        env.close()
    one, two = trajectory.training_trace()["chains"]
    assert "differ from the chain's prompt and completion so far at token 1 " in one["break"]
    assert one["break"].endswith(
        "(the harness rewrote its history: its request did not extend the call before)"
    )
    assert two["prompt_token_ids"] == render(second["messages"]) and two["break"] == ""


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.mark.timeout(240)
def test_an_answer_past_the_policy_timeout_is_in_no_chain() -> None:
    env = reference_env(policy_timeout_s=1.0)
    policy = ChainPolicy()
    try:
        first = json.loads(env.reset(seed=0)[0])
        second = json.loads(env.step(policy.act(first, use_tool(first), [11, 12], 1))[0])
        until_timed_out(env)
        _, _, term, trunc, info = env.step(policy.act(second, {"content": "5"}, [21, 22], 2))
        assert (term, trunc, info["error_type"]) == (False, True, Outcome.POLICY_TIMEOUT)
        trajectory = HarnessEnv.of(env).trajectory
    finally:
        env.close()
    trace = trajectory.training_trace()
    late = f"call-{second['request_id']}"
    (chain,) = trace["chains"]
    assert (chain["completion_token_ids"], chain["policy_versions"]) == ([11, 12], [[0, 2, 1]])
    assert chain["break"] == ""  # no call after it failed to join it
    assert [t["completion_token_ids"] for t in trace["turns"]] == [[11, 12]]  # 21, 22: nowhere
    assert all(c.policy_version != 2 for c in trajectory.calls)
    lost = [c for c in trace["text_level_calls"] if c["node_id"] == late]
    assert lost and lost[0]["why"].startswith("the call ended without an answer: the policy did")


def until_timed_out(env: Any) -> None:
    """Wait (bounded) until a model call got the endpoint's 504 for the policy timeout."""
    endpoint = HarnessEnv.of(env)._mode.endpoint  # it says when its 504s went out
    assert endpoint is not None
    deadline = time.monotonic() + 60
    while endpoint.lapses()[0] < 1:
        assert time.monotonic() < deadline, "no model call timed out"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("version", "why"),
    [
        ("true", "got a boolean"),
        ("1.5", "got float"),
        ('""', "got an empty string"),
        ("[1]", "got a list"),
        ('"' + "v" * 257 + '"', "257 characters, over the limit of 256"),
    ],
)
def test_a_policy_version_must_be_an_int_or_a_short_string(version: str, why: str) -> None:
    with pytest.raises(InvalidAction, match=why):
        parse_action(f'{{"content": "x", "policy_version": {version}}}')
    assert parse_action('{"content": "x", "policy_version": 3}').policy_version == 3
    assert parse_action('{"content": "x"}').to_dict()["policy_version"] is None


# -- the merge, on records built here ------------------------------------------------------------

# One main call of a generated episode: how its prompt relates to the chain so far.
STEP = st.tuples(
    st.sampled_from(["follow", "follow", "fresh", "text", "lost", "side"]),
    st.lists(st.integers(0, 50), min_size=1, max_size=4),  # completion ids
    st.lists(st.integers(0, 50), max_size=3),  # inserted ids (or a fresh prompt's)
)


@settings(max_examples=200, deadline=None)
@given(st.lists(STEP, max_size=12))
def test_chains_score_every_sampled_token_in_the_context_it_was_sampled_in(
    steps: list[tuple[str, list[int], list[int]]],
) -> None:
    calls, ids, token_level = [], None, []
    for index, (kind, completion, extra) in enumerate(steps):
        call: dict[str, Any] = {"request_id": str(index), "side": kind == "side",
                                "completion": {"content": ""}, "policy_version": index}  # fmt: skip
        if kind in ("text", "lost"):  # no ids: answered text-level, or never answered
            calls.append({**call, "completion": None} if kind == "lost" else call)
            continue
        prompt = ids + extra if kind == "follow" and ids is not None else [99, *extra]
        logprobs = [-(i + 1) / 4 for i in range(len(completion))]
        call.update(prompt_token_ids=prompt, token_ids=completion, logprobs=logprobs)
        calls.append(call)
        if kind != "side":
            ids = prompt + completion
            token_level.append(call)
    chains = training_trace(calls)["chains"]
    assert [n for chain in chains for n in chain["node_ids"]] == [
        f"call-{c['request_id']}" for c in token_level
    ]
    assert all(chain["break"] for chain in chains[:-1])
    # The last chain ends with the episode, or before an answered text-level main call.
    last = max(
        (i for i, (kind, _, _) in enumerate(steps) if kind in ("follow", "fresh")), default=-1
    )
    text_after = any(kind == "text" for kind, _, _ in steps[last + 1 :])
    assert not chains or bool(chains[-1]["break"]) == text_after
    by_node = {f"call-{c['request_id']}": c for c in token_level}
    for chain in chains:
        tokens, mask = chain["completion_token_ids"], chain["mask"]
        assert len(tokens) == len(mask) == len(chain["logprobs"])
        assert all(lp == 0.0 for lp, m in zip(chain["logprobs"], mask, strict=True) if not m)
        sampled = set()
        for node, (start, end, version) in zip(
            chain["node_ids"], chain["policy_versions"], strict=True
        ):
            call = by_node[node]
            assert tokens[start:end] == call["token_ids"]
            assert chain["logprobs"][start:end] == call["logprobs"]
            assert version == call["policy_version"]
            # The context the call sampled in is the chain's prompt and completion before it.
            assert call["prompt_token_ids"] == chain["prompt_token_ids"] + tokens[:start]
            sampled.update(range(start, end))
        assert [i for i, m in enumerate(mask) if m] == sorted(sampled)
        assert len(chain["node_ids"]) >= 1


# -- extends: the echo of an answer, in each wire API ----------------------------------------------

ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
ANSWER = Completion(content="let me add", tool_calls=(ToolCall("call_1", "add", {"a": 1, "b": 2}),))


def chat(*messages: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> ModelRequest:
    body = {"model": "m", "messages": list(messages), "tools": [ADD] if tools is None else tools}
    request = read_request("/v1/chat/completions", json.dumps(body).encode())
    assert request is not None
    return request


USER = {"role": "user", "content": "add 1 and 2"}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "3"}


def echo(content: str = "let me add", arguments: str = '{"b": 2, "a": 1}', name: str = "add",
         call_id: str = "other_id") -> dict[str, Any]:  # fmt: skip
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": content, "tool_calls": [call]}


@pytest.mark.parametrize(
    ("after", "extends"),
    [
        (chat(USER, echo(), RESULT), (True, 2)),
        (chat(USER, echo(content=" let  me\nadd "), RESULT), (True, 2)),  # whitespace
        (chat(USER, echo(arguments='{"a":1,"b":2}', call_id="call_1"), RESULT), (True, 2)),
        (chat(USER, echo(content="let me subtract"), RESULT), (False, 0)),
        (chat(USER, echo(arguments='{"a": 1, "b": 3}'), RESULT), (False, 0)),
        (chat(USER, echo(name="sub"), RESULT), (False, 0)),
        (chat(USER, echo(), RESULT, tools=[ADD, ADD]), (False, 0)),  # the tools changed
        (chat({"role": "user", "content": "add 1 and 2!"}, echo(), RESULT), (False, 0)),
        (chat({"role": "system", "content": "be brief"}, USER, echo(), RESULT), (False, 0)),
        (chat(USER, echo()), (False, 0)),  # nothing new after the answer
        (chat(USER, RESULT), (False, 0)),  # the answer left out
    ],
)
def test_a_request_extends_the_last_call_when_its_echo_means_the_answer(
    after: ModelRequest, extends: tuple[bool, int]
) -> None:
    assert link(after, chat(USER), ANSWER) == extends


def test_an_empty_answer_may_be_left_out_of_the_history() -> None:
    more = {"role": "user", "content": "go on"}
    assert link(chat(USER, more), chat(USER), Completion()) == (True, 1)
    assert link(chat(USER, {"role": "assistant", "content": ""}, more), chat(USER),
                Completion()) == (True, 2)  # fmt: skip


def test_each_wire_api_echoes_the_answer_in_its_own_shape() -> None:
    def read(path: str, body: dict[str, Any]) -> ModelRequest:
        request = read_request(path, json.dumps(body).encode())
        assert request is not None
        return request

    add = {"name": "add", "input_schema": {"type": "object"}}
    first = {"model": "m", "system": "be brief", "tools": [add], "messages": [
        {"role": "user", "content": "add 1 and 2"}]}  # fmt: skip
    then = {**first, "messages": [*first["messages"],
        {"role": "assistant", "content": [{"type": "text", "text": "let me add"},
            {"type": "tool_use", "id": "toolu_9", "name": "add", "input": {"a": 1, "b": 2}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9",
                                      "content": "3"}]}]}  # fmt: skip
    assert link(read("/v1/messages", then), read("/v1/messages", first), ANSWER) == (True, 3)

    gemini = "/v1beta/models/m:generateContent"
    tools = [{"functionDeclarations": [{"name": "add", "parameters": {"type": "object"}}]}]
    first = {"tools": tools, "contents": [{"role": "user", "parts": [{"text": "add 1 and 2"}]}]}
    then = {**first, "contents": [*first["contents"],
        {"role": "model", "parts": [{"text": "let me add"},
                                    {"functionCall": {"name": "add", "args": {"a": 1, "b": 2}}}]},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "add", "response": {"output": "3"}}}]}]}  # fmt: skip
    assert link(read(gemini, then), read(gemini, first), ANSWER) == (True, 2)

    tools = [{"type": "function", "name": "add", "parameters": {"type": "object"}}]
    first = {"model": "m", "instructions": "be brief", "tools": tools,
             "input": [{"type": "message", "role": "user", "content": "add 1 and 2"}]}  # fmt: skip
    then = {**first, "input": [*first["input"],
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "let me add"}]},
        {"type": "function_call", "call_id": "c9", "name": "add", "arguments": '{"a":1,"b":2}'},
        {"type": "function_call_output", "call_id": "c9", "output": "3"}]}  # fmt: skip
    assert link(read("/v1/responses", then), read("/v1/responses", first), ANSWER) == (True, 3)


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
ARGUMENTS = st.dictionaries(st.text(max_size=4), st.integers() | TEXT, max_size=3)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["user", "system"]), TEXT), min_size=1, max_size=4),
    TEXT,
    st.lists(ARGUMENTS, max_size=3),
    st.integers(0, 2),
    st.booleans(),
)
def test_a_history_kept_as_the_policy_left_it_extends_whatever_its_formatting(
    before: list[tuple[str, str]],
    content: str,
    arguments: list[dict[str, Any]],
    spaces: int,
    compact: bool,
) -> None:
    messages = [{"role": role, "content": text} for role, text in before]
    calls = tuple(ToolCall(f"call_{i}", "add", args) for i, args in enumerate(arguments))
    answer = Completion(content=content, tool_calls=calls)
    echoed = {
        "role": "assistant",
        "content": " " * spaces + content,
        "tool_calls": [  # other ids, other JSON spacing
            {"id": f"x{i}", "type": "function",
             "function": {"name": "add", "arguments": json.dumps(c.arguments, indent=spaces)}}
            for i, c in enumerate(calls)
        ],
    }  # fmt: skip
    new = [
        {"role": "tool", "tool_call_id": "x0", "content": "3"},
        {"role": "user", "content": "go"},
    ]
    if compact:  # the harness rewrote the first message
        history = [{"role": "user", "content": "summary"}, *messages[1:], echoed, *new]
    else:
        history = [*messages, echoed, *new]
    got = link(chat(*history), chat(*messages), answer)
    kept = not compact or chat(*messages).messages[:1] == [{"role": "user", "content": "summary"}]
    assert got == ((True, len(messages) + 1) if kept else (False, 0))
