"""One model-mode episode driven from an asyncio loop by a token-in, token-out engine.

:func:`run_episode` is the engine-neutral core of :class:`~gym_harness.verl.HarnessAgentLoop`:
it resets a ``HarnessEnv`` on a task, answers each model call of the harness with
``generate(prompt_ids)`` on the chain's prompt ids (:class:`~gym_harness.training.TokenChain`:
the previous call's prompt + completion + the ids of only what is new), parses the
completion into the action (text and tool calls) and steps the env with the ids it
carries. Every blocking call (the env's construction, ``reset``, ``step``, ``truncate``,
``close``, and the tokenizer's chat template and ``decode``) runs in a worker thread
(``asyncio.to_thread``), so the caller's event loop keeps serving the other episodes
while a harness runs its tools.

The rows come from the env's own training trace (``training_trace()["chains"]``): one per
unbroken chain, each the first call's prompt, then ``c1 ‖ d1 ‖ c2 …`` with a mask 1 on the
sampled ids and 0 on the inserted ones. Nothing here imports verl, torch or transformers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gym_harness.env import HarnessEnv
from gym_harness.errors import ConfigError
from gym_harness.training.chain import TokenChain
from gym_harness.training.groups import Tokenizer, first_request

__all__ = ["EpisodeResult", "Generated", "run_episode"]


@dataclass(frozen=True)
class Generated:
    """What the engine sampled for one model call.

    Attributes:
        token_ids: The sampled ids.
        logprobs: One log-probability per id.
        policy_version: The version of the weights that sampled them (verl's ``global_steps``:
            the last, for a generation resumed across a weight sync).
        first_version: The version that sampled the first of them (verl's
            ``min_global_steps``; ``None``: the same as ``policy_version``).
        preempted: How often the engine preempted the call (verl's ``num_preempted``).
    """

    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)
    policy_version: int | None = None
    first_version: int | None = None
    preempted: int = 0


@dataclass(frozen=True)
class EpisodeResult:
    """One episode's rows and what happened.

    Attributes:
        chains: The env's token chains (``training_trace()["chains"]``), in order; each a
            dict with ``prompt_token_ids``, ``completion_token_ids``, ``mask``, ``logprobs``,
            ``policy_versions`` and ``node_ids``.
        reward: The episode's reward (``reward_fn``'s; a cut episode scored as truncated).
        started: Whether the harness started (a startup failure has no reward to train on).
        outcome: The last step's ``info["error_type"]`` ("" for a normal end,
            ``"max_turns"`` for an episode cut by the call limit).
        error: Why the episode trains nothing, or ended early ("" when it trains).
        model_calls: The model calls the policy answered.
        tool_calls: The tool calls in those answers.
        first_prompt_ids: The first call's prompt ids (``[]`` without a call).
        min_version: The lowest policy version that answered a call.
        max_version: The highest.
        generate_s: Wall seconds spent waiting for the engine.
        env_s: Wall seconds spent in the env (the harness, its tools, the reward).
        preempted: The engine's preemptions over the episode.
    """

    chains: list[dict[str, Any]]
    reward: float
    started: bool
    outcome: str
    error: str
    model_calls: int
    tool_calls: int
    first_prompt_ids: list[int]
    min_version: int | None
    max_version: int | None
    generate_s: float
    env_s: float
    preempted: int


async def run_episode(
    env_kwargs: Mapping[str, Any],
    task: Mapping[str, Any],
    *,
    tokenizer: Tokenizer,
    generate: Callable[[list[int]], Awaitable[Generated]],
    action: Callable[[str, Mapping[str, Any]], dict[str, Any]],
    max_turns: int | None = None,
    end_of_turn_ids: Sequence[int] = (),
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> EpisodeResult:
    """Run one model-mode episode on ``task``, each model call answered by ``generate``.

    Args:
        env_kwargs: ``HarnessEnv`` keywords (``mode="model"``).
        task: The task dict (``prompt``, ``id``, ...) the env resets on.
        tokenizer: The policy's tokenizer (its chat template renders tool calls and tool
            messages; see :mod:`gym_harness.training.chain`).
        generate: ``await generate(prompt_ids)``: the engine's completion of a prompt.
        action: Turns the completion's text into the action's text and tool calls.
        max_turns: Most model calls (``None``: no limit but the env's own); an episode
            still running then is cut with ``HarnessEnv.truncate()``, scored as truncated.
        end_of_turn_ids: Ids that end an assistant turn besides the tokenizer's eos.
        chat_template_kwargs: Passed to the chat template.

    Returns:
        The episode's chains, reward and counts. Harness faults are outcomes here, as in
        ``step()``; the env is closed when this returns or raises.

    Raises:
        ConfigError: ``max_turns`` below 1, or the engine gave not one log-probability per
            sampled id (a call without them cannot be trained on).
    """
    if max_turns is not None and max_turns < 1:
        raise ConfigError(f"max_turns must be at least 1, got {max_turns}")
    chain = TokenChain(
        tokenizer, end_of_turn_ids=end_of_turn_ids, chat_template_kwargs=chat_template_kwargs
    )
    clock = _Clock()
    env = await clock.env(HarnessEnv, **env_kwargs)
    try:
        return await _drive(env, task, chain, tokenizer, generate, action, max_turns, clock)
    finally:
        await asyncio.to_thread(env.close)


async def _drive(
    env: HarnessEnv,
    task: Mapping[str, Any],
    chain: TokenChain,
    tokenizer: Tokenizer,
    generate: Callable[[list[int]], Awaitable[Generated]],
    action: Callable[[str, Mapping[str, Any]], dict[str, Any]],
    max_turns: int | None,
    clock: _Clock,
) -> EpisodeResult:
    observation, info = await clock.env(env.reset, options={"task": dict(task)})
    outcome = str(info["error_type"])
    started = not outcome
    request, error = first_request(observation, outcome, info["error"])
    tool_calls, versions, preempted = 0, [], 0
    first_prompt: list[int] = []
    while started and not error:
        if max_turns is not None and len(chain.calls) >= max_turns:
            outcome = "max_turns"  # held at its next model call; truncate() below ends it
            break
        prompt = await asyncio.to_thread(chain.prompt_ids, request)  # the chat template
        first_prompt = first_prompt or list(prompt)
        out = await clock.generate(generate, prompt)
        version = 0 if out.policy_version is None else int(out.policy_version)
        if out.policy_version is not None:
            versions.append(version)
        if out.first_version is not None:
            versions.append(int(out.first_version))
        preempted += out.preempted
        chain.record(out.token_ids, out.logprobs or None, policy_version=version)
        text = await asyncio.to_thread(
            tokenizer.decode, list(out.token_ids), skip_special_tokens=True
        )
        answer = {
            **action(text, request),
            "token_ids": list(out.token_ids),
            "logprobs": list(out.logprobs),
            "prompt_token_ids": prompt,
            "policy_version": version,
        }
        tool_calls += len(answer.get("tool_calls") or [])
        observation, _, terminated, truncated, info = await clock.env(env.step, json.dumps(answer))
        if terminated or truncated:
            outcome = str(info["error_type"])
            break
        request = json.loads(observation)
    reward = await clock.env(env.truncate) if started else 0.0
    trace = await clock.env(env.trajectory.training_trace)
    chains = [dict(c) for c in trace.get("chains") or [] if sum(c["mask"])]
    if not chains and not error:
        error = "the episode ended before the harness got an answer"
    return EpisodeResult(
        chains=chains,
        reward=float(reward),
        started=started,
        outcome=outcome,
        error=error,
        model_calls=len(chain.calls),
        tool_calls=tool_calls,
        first_prompt_ids=first_prompt,
        min_version=min(versions, default=None),
        max_version=max(versions, default=None),
        generate_s=clock.generate_s,
        env_s=clock.env_s,
        preempted=preempted,
    )


class _Clock:
    """Runs the env's blocking calls in a worker thread and the engine's on the loop,
    adding up the wall time of each."""

    def __init__(self) -> None:
        self.generate_s = 0.0
        self.env_s = 0.0

    async def env(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await asyncio.to_thread(call, *args, **kwargs)
        finally:
            self.env_s += time.perf_counter() - start

    async def generate(
        self, generate: Callable[[list[int]], Awaitable[Generated]], prompt: list[int]
    ) -> Generated:
        start = time.perf_counter()
        try:
            out = await generate(list(prompt))
        finally:
            self.generate_s += time.perf_counter() - start
        if len(out.logprobs) != len(out.token_ids):
            raise ConfigError(
                f"the engine returned {len(out.logprobs)} log-probabilities for "
                f"{len(out.token_ids)} ids: a training row needs one per sampled id; ask the "
                "engine for them (verl: actor_rollout_ref.rollout.calculate_log_probs=True)"
            )
        return out
