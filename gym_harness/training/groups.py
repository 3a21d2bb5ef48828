"""A batch of model-mode episodes run concurrently, one training row each: :class:`GroupRollout`.

Each task of the batch is one episode with its own harness (a sub-env of a
``HarnessVectorEnv``). Up to ``concurrency`` episodes run at once: the sub-envs of a wave
are reset on their tasks, then stepped as they become ready through the vector env's
``send``/``recv`` (EnvPool's pair), so the policy samples for whichever harnesses wait
while the others run their tools. Every model call's prompt ids come from the episode's
:class:`~gym_harness.training.chain.TokenChain`; the sampler returns the ids and their
log-probabilities; the action carries them (``token_ids``, ``logprobs``,
``prompt_token_ids``, ``policy_version``) with the text and tool calls parsed from the
completion.

**One row per episode, from the env's own trace.** When a wave has ended, each sub-env's
``training_trace()["chains"]`` (the calls the harness got, merged into token chains; a
completion that never reached the harness is not in it) gives the row: an episode's
calls usually form one chain; where the harness rewrote its history the chain breaks,
and the row is the chain with the most sampled tokens, never a concatenation across a
break. ``EpisodeRow.calls``, ``trained_calls`` and ``breaks`` say how many calls the
policy answered, how many the row trains, and how often the chain broke. An episode that
never started, or ended before its first model call, gives a row with one masked token,
``reward=None`` (started: its reward) and ``error`` saying why: a recorded failure, not
an exception.

**Workers kept between batches.** With ``keep_envs=True`` the vector env outlives a
``run``: its workers, each sub-env's keeper, MCP bridge and model endpoint stay up, and
the next batch only starts a fresh harness and workspace per episode (what ``reset()``
does). A trainer's rollout calls one batch per step, on the same env settings, so that
start-up is paid once per training run instead of once per step; ``close()`` (or the
``with`` block's end) ends them all.

**Limits and rewards.** An episode still running after ``max_turns`` model calls is cut
with ``HarnessEnv.truncate()``: ``reward_fn`` scores it with ``ctx.truncated``. The row's
reward is the episode's total (``trajectory.total_reward``), read when the wave ends.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium
import numpy as np

from gym_harness.errors import ConfigError, WorkerLost
from gym_harness.training.chain import ChatTokenizer, TokenChain
from gym_harness.training.tool_calls import completion_action
from gym_harness.vector.factory import make_vector_env

__all__ = ["EpisodeRow", "GroupRollout", "Sampler", "first_request", "model_env_kwargs"]

logger = logging.getLogger(__name__)


class Sampler(Protocol):
    """The policy: completions for a batch of prompts.

    Called with one list of prompt ids per waiting model call; returns, for each, the
    sampled ids and one log-probability per id.
    """

    def __call__(self, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        """Sample one completion per prompt."""
        ...


class Tokenizer(ChatTokenizer, Protocol):
    """A chat tokenizer that also decodes."""

    def decode(self, ids: Any, /, **kwargs: Any) -> str:
        """The text of ``ids``."""
        ...


@dataclass(frozen=True)
class EpisodeRow:
    """One episode's training row.

    Attributes:
        prompt_ids: The chain's first prompt.
        completion_ids: ``c1 ‖ d1 ‖ c2 ‖ …``.
        env_mask: 1 on sampled ids, 0 on inserted ones.
        logprobs: The sampler's log-probabilities, 0.0 where masked.
        policy_versions: ``[start, end, version]`` spans over ``completion_ids``.
        reward: The episode's reward (``None``: the episode never started).
        outcome: The last step's ``info["error_type"]`` ("" for a normal end).
        error: Why the row trains nothing ("" when it trains something).
        calls: The model calls the episode made.
        trained_calls: The calls the row trains.
        breaks: The chain breaks in the episode.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    logprobs: list[float]
    policy_versions: list[list[int]] = field(default_factory=list)
    reward: float | None = None
    outcome: str = ""
    error: str = ""
    calls: int = 0
    trained_calls: int = 0
    breaks: int = 0


@dataclass
class _Episode:
    """One task's episode while it runs (parent side)."""

    task: Mapping[str, Any]
    chain: TokenChain
    reward: float | None = None
    outcome: str = ""
    error: str = ""
    started: bool = False
    trace: Mapping[str, Any] | None = None


class GroupRollout:
    """Runs batches of model-mode episodes concurrently and returns one row per episode.

    Args:
        env_id_or_config: A registered env id, or a dict of ``HarnessEnv`` keywords.
        tokenizer: The policy's tokenizer (its chat template renders tool calls and tool
            messages; see :mod:`gym_harness.training.chain`).
        sampler: The policy (see :class:`Sampler`).
        concurrency: Most episodes at once (one harness and one worker process each).
        max_turns: Most model calls per episode (``None``: the env id's step limit; none
            for a dict, where the env's own limits end an episode). An episode still
            running then is cut with ``HarnessEnv.truncate()``, scored as truncated.
        action: Turns a completion's text into the action (default: Hermes tool calls).
        policy_version: Gives the version of the policy now sampling (e.g. the trainer's
            step), recorded with each call.
        end_of_turn_ids: Ids that end an assistant turn besides the tokenizer's eos.
        chat_template_kwargs: Passed to the chat template.
        context: The vector env's multiprocessing start method.
        keep_envs: Keep the vector env (workers, keepers, bridges) between ``run`` calls,
            until ``close()``; ``False``: each ``run`` makes its own and closes it.
        **env_kwargs: More ``HarnessEnv`` keywords (``mode="model"`` is set).

    Raises:
        ConfigError: Bad settings (a concurrency below 1, a mode other than model).

    Example:
        >>> with GroupRollout("gym_harness/Reference-v0", tokenizer=tokenizer,
        ...                   sampler=sampler, keep_envs=True) as group:  # doctest: +SKIP
        ...     for batch in batches:
        ...         rows = group.run(batch)
    """

    def __init__(
        self,
        env_id_or_config: str | Mapping[str, Any],
        *,
        tokenizer: Tokenizer,
        sampler: Sampler,
        concurrency: int = 8,
        max_turns: int | None = None,
        action: Callable[[str, Mapping[str, Any]], dict[str, Any]] = completion_action,
        policy_version: Callable[[], int] = lambda: 0,
        end_of_turn_ids: Sequence[int] = (),
        chat_template_kwargs: Mapping[str, Any] | None = None,
        context: str | None = None,
        keep_envs: bool = False,
        **env_kwargs: Any,
    ) -> None:
        if concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {concurrency}")
        if max_turns is not None and max_turns < 1:
            raise ConfigError(f"max_turns must be at least 1, got {max_turns}")
        self.env_kwargs, steps = model_env_kwargs(env_id_or_config, env_kwargs)
        self.max_turns = steps if max_turns is None else max_turns
        self.tokenizer = tokenizer
        self.sampler = sampler
        self.concurrency = concurrency
        self.action = action
        self.policy_version = policy_version
        self.end_of_turn_ids = tuple(end_of_turn_ids)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.context = context
        self.keep_envs = keep_envs
        self._envs: Any = None  # the kept vector env, between runs
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def __enter__(self) -> GroupRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the kept vector env: every worker, harness and workspace. Idempotent."""
        envs, self._envs = self._envs, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if envs is not None:
            envs.close()

    def run(self, tasks: Sequence[Mapping[str, Any]]) -> list[EpisodeRow]:
        """One episode per task (a task dict: ``prompt``, ``id``, ...); rows in task order.

        Without ``keep_envs`` the vector env lives for this call only: every harness,
        worker and workspace is gone when it returns (or raises). With it, the env stays
        for the next call (one with more tasks than it has sub-envs, up to
        ``concurrency``, gets a larger one); if this call raises, it is closed.
        """
        if not tasks:
            return []
        episodes = [_Episode(task, self._chain()) for task in tasks]
        envs = self._vector_env(min(self.concurrency, len(tasks)))
        done = False
        try:
            for start in range(0, len(episodes), envs.num_envs):
                wave = episodes[start : start + envs.num_envs]
                self._wave(envs, wave)
                self._finish(envs, wave)
            done = True
        finally:
            if not (done and self.keep_envs):
                self.close()
        return [self._row(episode) for episode in episodes]

    def _vector_env(self, size: int) -> Any:
        """The kept vector env if it has at least ``size`` sub-envs, else a new one.

        A kept env's sub-envs have all been reset by an earlier run (its first wave filled
        them), so a wave that uses only some of them still reads every sub-env's state.
        """
        if self._envs is not None and self._envs.num_envs >= size:
            return self._envs
        self.close()
        self._envs = make_vector_env(size, context=self.context, **self.env_kwargs)
        self._finalizer = weakref.finalize(self, self._envs.close)
        return self._envs

    # ------------------------------------------------------------------ a wave

    def _wave(self, envs: Any, wave: list[_Episode]) -> None:
        """Run ``wave[i]`` on sub-env ``i`` until every episode ended or met ``max_turns``."""
        waiting: dict[int, dict[str, Any]] = {}
        for members in _by_task(wave).values():
            mask = np.array([i in members for i in range(envs.num_envs)])
            task = dict(wave[members[0]].task)
            observations, infos = envs.reset(options={"task": task, "reset_mask": mask})
            for i in members:
                error_type = str(infos["error_type"][i])
                request, error = first_request(observations[i], error_type, infos["error"][i])
                wave[i].started = not str(infos["error_type"][i])
                if error:
                    wave[i].error = error
                    wave[i].outcome = str(infos["error_type"][i])
                else:
                    waiting[i] = request
        live = set(waiting)
        while live:
            if waiting:
                ids = sorted(waiting)
                actions = self._act([waiting[i] for i in ids], [wave[i].chain for i in ids])
                envs.send(actions, ids)
                waiting = {}
            observations, _, terminated, truncated, infos = envs.recv(1)
            for j, i in enumerate(int(i) for i in infos["env_id"]):
                episode = wave[i]
                if terminated[j] or truncated[j]:
                    live.discard(i)
                    episode.outcome = str(infos["error_type"][j])
                elif self.max_turns is not None and len(episode.chain.calls) >= self.max_turns:
                    live.discard(i)  # held at its next model call; truncate() ends it
                    episode.outcome = "max_turns"
                else:
                    waiting[i] = json.loads(observations[j])

    def _finish(self, envs: Any, wave: list[_Episode]) -> None:
        """Cut the episodes held at ``max_turns``; read every episode's reward and trace."""
        try:
            rewards = envs.call("truncate")
            trajectories = envs.call("trajectory")
        except WorkerLost as exc:  # a worker died under the call: the wave's rows train nothing
            for episode in wave:
                episode.error = episode.error or f"the episode's trace was lost: {exc}"
            return
        for episode, reward, trajectory in zip(wave, rewards, trajectories, strict=False):
            episode.reward = float(reward)
            episode.trace = trajectory.training_trace()

    def _act(self, requests: list[dict[str, Any]], chains: list[TokenChain]) -> list[str]:
        """Sample for each waiting request; the actions, with the ids they carry."""
        prompts = [
            chain.prompt_ids(request) for chain, request in zip(chains, requests, strict=True)
        ]
        samples = self.sampler(prompts)
        if len(samples) != len(prompts):
            raise ConfigError(
                f"the sampler returned {len(samples)} completions for {len(prompts)} prompts"
            )
        version = int(self.policy_version())
        actions = []
        for request, chain, prompt, (ids, logprobs) in zip(
            requests, chains, prompts, samples, strict=True
        ):
            chain.record(ids, logprobs, policy_version=version)
            text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
            action = {
                **self.action(text, request),
                "token_ids": list(ids),
                "logprobs": list(logprobs),
                "prompt_token_ids": prompt,
                "policy_version": version,
            }
            actions.append(json.dumps(action))
        return actions

    # ------------------------------------------------------------------ rows

    def _chain(self) -> TokenChain:
        return TokenChain(
            self.tokenizer,
            end_of_turn_ids=self.end_of_turn_ids,
            chat_template_kwargs=self.chat_template_kwargs,
        )

    def _row(self, episode: _Episode) -> EpisodeRow:
        chains = list((episode.trace or {}).get("chains") or [])
        best = max(chains, key=lambda chain: sum(chain["mask"]), default=None)
        if best is None or not sum(best["mask"]):
            error = episode.error or "the episode ended before the harness got an answer"
            logger.warning("episode of task %r trains nothing: %s", episode.task.get("id"), error)
            return self._empty_row(episode, error)
        return EpisodeRow(
            prompt_ids=list(best["prompt_token_ids"]),
            completion_ids=list(best["completion_token_ids"]),
            env_mask=list(best["mask"]),
            logprobs=list(best["logprobs"]),
            policy_versions=[list(span) for span in best["policy_versions"]],
            reward=episode.reward,
            outcome=episode.outcome,
            calls=len(episode.chain.calls),
            trained_calls=len(best["node_ids"]),
            breaks=len(chains) - 1,
        )

    def _empty_row(self, episode: _Episode, error: str) -> EpisodeRow:
        """A row that trains nothing: the task's prompt, one masked end-of-turn token."""
        prompt = [{"role": "user", "content": str(episode.task.get("prompt", ""))}]
        ids = episode.chain.render(prompt, None, generation_prompt=True)
        end = min(episode.chain.end_of_turn_ids)
        reward = episode.reward if episode.started else None
        calls = len(episode.chain.calls)
        return EpisodeRow(ids, [end], [0], [0.0], [], reward, episode.outcome, error, calls)


def model_env_kwargs(
    env_id_or_config: str | Mapping[str, Any], env_kwargs: Mapping[str, Any]
) -> tuple[dict[str, Any], int | None]:
    """The ``HarnessEnv`` keywords and step limit of an env id or config, in model mode.

    Raises:
        ConfigError: An unknown env id, neither an id nor a dict, or a mode other than model.
    """
    if isinstance(env_id_or_config, str):
        try:
            spec = gymnasium.spec(env_id_or_config)
        except gymnasium.error.Error as exc:
            raise ConfigError(f"unknown env id {env_id_or_config!r}: {exc}") from exc
        kwargs = {**spec.kwargs, **env_kwargs}
        steps = spec.max_episode_steps
    elif isinstance(env_id_or_config, Mapping):
        kwargs, steps = {**env_id_or_config, **env_kwargs}, None
    else:
        raise ConfigError(
            "pass an env id (str) or a dict of HarnessEnv keywords, "
            f"got {type(env_id_or_config).__name__}"
        )
    if kwargs.get("mode", "model") != "model":
        raise ConfigError(
            f"training rows come from model mode, got mode={kwargs['mode']!r}: drop mode= "
            "or pass mode='model'"
        )
    kwargs["mode"] = "model"
    return kwargs, steps


def _by_task(wave: list[_Episode]) -> dict[str, list[int]]:
    """Sub-env indices by task (one reset per distinct task)."""
    groups: dict[str, list[int]] = {}
    for i, episode in enumerate(wave):
        groups.setdefault(json.dumps(dict(episode.task), sort_keys=True, default=str), []).append(i)
    return groups


def first_request(observation: str, error_type: str, error: Any) -> tuple[dict[str, Any], str]:
    """The first request of a reset env (its observation and ``info``), or why there is none."""
    if error_type:
        return {}, f"the episode never started: {error_type}: {error}"
    request = json.loads(observation)
    if not request.get("request_id"):
        return {}, "the harness ended its turn before its first model call"
    return request, ""
