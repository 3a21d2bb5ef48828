"""TRL's ``GRPOTrainer(rollout_func=...)`` over any harness in model mode.

:func:`rollout_func` returns the callable TRL 1.16 calls as ``rollout_func(prompts,
trainer)``. ``prompts`` is the trainer's per-process slice of the batch, each prompt
already repeated ``num_generations`` times by TRL's sampler; each entry is one episode
(one harness), and the callable returns one row per entry:

* ``prompt_ids``, ``completion_ids``, ``logprobs``, ``env_mask``: the episode's token
  chain (:mod:`gym_harness.training.chain`): the first call's prompt, then ``c1 ‖ d1 ‖ c2
  ‖ …`` with ``env_mask`` 1 on the ids the trainer's model sampled and 0 on the ids the
  environment inserted (tool results, the next generation prompt), so TRL scores every
  sampled token in the context it was sampled in and trains none of the inserted ones.
* ``env_reward``: the episode's reward (``reward_fn``'s; a truncation's score for an
  episode cut by a limit; ``None`` for one that never started). Pass :func:`env_reward`
  in ``reward_funcs`` to train on it.
* ``rollout_outcome``, ``rollout_error``, ``rollout_calls``, ``rollout_trained_calls``,
  ``rollout_breaks``, ``policy_versions``: what happened, for reward functions and logs.

The episodes of a call run concurrently (``concurrency`` at once, each with its own
harness, through the vector env's ``send``/``recv``). Called by a trainer (an object with
``add_callback``, as every ``transformers.Trainer``), the vector env's workers, keepers and
bridges stay up from one call to the next and end when ``train()`` does (a callback's
``on_train_end``; ``close()`` ends them earlier); each call then starts only the episodes'
harnesses. Called with anything else, each call makes its vector env and closes it.

The policy that answers the episodes' model calls is the trainer's model: TRL's vLLM
engine when ``use_vllm=True`` (weights synced by TRL before each rollout), else
``generate`` with the trainer's model on its device (the CPU path). Log-probabilities
are ``log_softmax(logits / temperature)`` of the sampled ids, the quantity TRL
recomputes for the loss.

Importing this module imports no torch or trl; the callable imports them when it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gym_harness.errors import ConfigError
from gym_harness.tasks import as_task
from gym_harness.training.groups import EpisodeRow, GroupRollout, Sampler
from gym_harness.training.tool_calls import completion_action

__all__ = ["HarnessRolloutFunc", "TrainerSampler", "env_reward", "rollout_func", "task_of"]

_INSTALL = "pip install 'gym_harness[train]'"


def rollout_func(
    env_id_or_config: str | Mapping[str, Any],
    *,
    concurrency: int = 8,
    max_turns: int | None = None,
    action: Callable[[str, Mapping[str, Any]], dict[str, Any]] = completion_action,
    sampler: Callable[[Any], Sampler] | None = None,
    end_of_turn_ids: Sequence[int] = (),
    chat_template_kwargs: Mapping[str, Any] | None = None,
    **env_kwargs: Any,
) -> HarnessRolloutFunc:
    """The ``rollout_func`` for TRL's ``GRPOTrainer``: one model-mode episode per prompt entry.

    Args:
        env_id_or_config: A registered env id (``"gym_harness/Codex-v0"``) or a dict of
            ``HarnessEnv`` keywords; the env runs in ``mode="model"``.
        concurrency: Most episodes at once (each a harness and a worker process).
        max_turns: Most model calls per episode (default: the env id's step limit); an
            episode cut by it is scored as a truncation and still gives its row.
        action: Turns a completion's text into the action (default: Hermes/Qwen
            ``<tool_call>{json}</tool_call>`` tool calls).
        sampler: ``sampler(trainer)`` gives the policy (default :class:`TrainerSampler`).
        end_of_turn_ids: Ids that end an assistant turn besides the tokenizer's eos.
        chat_template_kwargs: Passed to the chat template (e.g. ``enable_thinking``).
        **env_kwargs: More ``HarnessEnv`` keywords (``tools``, ``reward_fn``, ``model`` ...).

    Returns:
        The callable, ``func(prompts, trainer) -> dict`` (see the module docstring).

    Raises:
        ConfigError: Bad settings (checked here, before any training starts).

    Example:
        >>> from gym_harness.training.trl import env_reward, rollout_func  # doctest: +SKIP
        >>> func = rollout_func("gym_harness/Reference-v0")  # doctest: +SKIP
        >>> trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=args,
        ...                       train_dataset=dataset, rollout_func=func)  # doctest: +SKIP
    """
    return HarnessRolloutFunc(
        env_id_or_config,
        concurrency=concurrency,
        max_turns=max_turns,
        action=action,
        sampler=sampler,
        end_of_turn_ids=end_of_turn_ids,
        chat_template_kwargs=chat_template_kwargs,
        **env_kwargs,
    )


class HarnessRolloutFunc:
    """TRL's ``rollout_func(prompts, trainer)`` (built by :func:`rollout_func`).

    ``last_rows`` holds the :class:`~gym_harness.training.groups.EpisodeRow`s of the last
    call, in prompt order. The vector env kept for a trainer ends at the end of its
    ``train()``, at ``close()``, or when the interpreter exits.
    """

    def __init__(
        self,
        env_id_or_config: str | Mapping[str, Any],
        *,
        concurrency: int,
        max_turns: int | None,
        action: Callable[[str, Mapping[str, Any]], dict[str, Any]],
        sampler: Callable[[Any], Sampler] | None,
        end_of_turn_ids: Sequence[int],
        chat_template_kwargs: Mapping[str, Any] | None,
        **env_kwargs: Any,
    ) -> None:
        self._make_sampler = sampler or TrainerSampler
        self._options: dict[str, Any] = {
            "concurrency": concurrency,
            "max_turns": max_turns,
            "action": action,
            "end_of_turn_ids": tuple(end_of_turn_ids),
            "chat_template_kwargs": dict(chat_template_kwargs or {}),
        }
        self._env = (env_id_or_config, env_kwargs)
        # Checks the settings now: a bad one fails at construction, not at the first step.
        self._group(_NoTokenizer(), _no_sampler, lambda: 0)
        self.last_rows: list[EpisodeRow] = []
        self._kept: GroupRollout | None = None  # the group of the trainer below
        self._trainer: Any = None  # the trainer whose train() end closes the kept group

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """One episode per prompt entry; the rows TRL takes (see the module docstring)."""
        group = self._group_for(trainer)
        rows = group.run([task_of(prompt) for prompt in prompts])
        self.last_rows = rows
        return {
            "prompt_ids": [row.prompt_ids for row in rows],
            "completion_ids": [row.completion_ids for row in rows],
            "logprobs": [row.logprobs for row in rows],
            "env_mask": [row.env_mask for row in rows],
            "env_reward": [row.reward for row in rows],
            "rollout_outcome": [row.outcome for row in rows],
            "rollout_error": [row.error for row in rows],
            "rollout_calls": [row.calls for row in rows],
            "rollout_trained_calls": [row.trained_calls for row in rows],
            "rollout_breaks": [row.breaks for row in rows],
            "policy_versions": [row.policy_versions for row in rows],
        }

    def close(self) -> None:
        """End the vector env kept between calls (workers, harnesses). Idempotent."""
        kept, self._kept = self._kept, None
        if kept is not None:
            kept.close()

    def _close_for(self, trainer: Any) -> None:
        """End the kept group if it is ``trainer``'s (its ``train()`` ended)."""
        if self._trainer is trainer:
            self.close()

    def _group_for(self, trainer: Any) -> GroupRollout:
        """The group that runs ``trainer``'s rollouts: kept while it trains, else new."""
        if self._kept is not None and self._trainer is trainer:
            return self._kept
        keep = self._trainer is trainer or _close_at_train_end(
            trainer, lambda: self._close_for(trainer)
        )
        group = self._group(
            _tokenizer(trainer),
            self._make_sampler(trainer),
            lambda: int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0),
            keep_envs=keep,
        )
        if keep:
            self.close()  # another trainer's
            self._kept, self._trainer = group, trainer
        return group

    def _group(
        self,
        tokenizer: Any,
        sampler: Sampler,
        policy_version: Callable[[], int],
        keep_envs: bool = False,
    ) -> GroupRollout:
        env_id_or_config, env_kwargs = self._env
        return GroupRollout(
            env_id_or_config,
            tokenizer=tokenizer,
            sampler=sampler,
            policy_version=policy_version,
            keep_envs=keep_envs,
            **self._options,
            **env_kwargs,
        )


def _close_at_train_end(trainer: Any, close: Callable[[], None]) -> bool:
    """Have ``trainer`` call ``close`` when its ``train()`` ends; False if it takes no
    callbacks (then nothing is kept between calls)."""
    add_callback = getattr(trainer, "add_callback", None)
    if add_callback is None:
        return False
    from transformers import TrainerCallback

    class CloseAtTrainEnd(TrainerCallback):
        """Ends the rollout function's kept workers and harnesses with the training run."""

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            close()

    add_callback(CloseAtTrainEnd())
    return True


def env_reward(
    completions: list[Any], env_reward: list[float | None], **kwargs: Any
) -> list[float | None]:
    """A TRL reward function: the episode's reward the rollout function returned.

    ``None`` (an episode that never started) leaves the completion unscored: TRL gives it
    no advantage.
    """
    return list(env_reward)


def task_of(prompt: Any) -> dict[str, Any]:
    """A TRL prompt entry as a task (:func:`gym_harness.tasks.as_task`)."""
    return as_task(prompt)


class TrainerSampler:
    """The trainer's model as the policy: TRL's vLLM engine, or ``generate`` on its device.

    Args:
        trainer: A ``GRPOTrainer``. With ``use_vllm=True`` (server or colocate mode) the
            prompts go to TRL's vLLM generation (one training process); otherwise the
            trainer's model generates with the trainer's generation config.

    Raises:
        ConfigError: trl or torch is missing, or vLLM runs with more than one training
            process (its generation is a collective call every process must make alike).
    """

    def __init__(self, trainer: Any) -> None:
        try:
            import torch  # noqa: F401
            import trl  # noqa: F401
        except ImportError as exc:
            raise ConfigError(f"gym_harness.training.trl needs trl and torch: {_INSTALL}") from exc
        self.trainer = trainer
        if getattr(trainer, "use_vllm", False) and trainer.accelerator.num_processes > 1:
            raise ConfigError(
                "gym_harness.training.trl samples with vLLM from one training process; run "
                "the trainer in one process (the vLLM server may use several GPUs), or pass "
                "sampler=..."
            )

    def __call__(self, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        """Sample one completion per prompt."""
        if getattr(self.trainer, "use_vllm", False):
            return self._vllm(prompts)
        return self._generate(prompts)

    def _vllm(self, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        _, completions, logprobs, _ = self.trainer.vllm_generation.generate(
            prompts=prompts, images=None, num_generations=1
        )
        return [
            (list(ids), [float(top[0]) for top in lps])
            for ids, lps in zip(completions, logprobs, strict=True)
        ]

    def _generate(self, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        import torch
        from trl.models import unwrap_model_for_generation

        trainer = self.trainer
        tokenizer = _tokenizer(trainer)
        pad = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        width = max(len(p) for p in prompts)
        device = trainer.accelerator.device
        input_ids = torch.tensor(
            [[pad] * (width - len(p)) + list(p) for p in prompts], device=device
        )
        attention = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device
        )
        temperature = float(getattr(trainer, "temperature", 1.0) or 1.0)
        ends = set(getattr(trainer, "eos_token_ids", None) or [tokenizer.eos_token_id])
        with (
            unwrap_model_for_generation(
                trainer.model_wrapped,
                trainer.accelerator,
                generation_kwargs=getattr(trainer, "generation_kwargs", None),
            ) as model,
            torch.no_grad(),
        ):
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                generation_config=trainer.generation_config,
                return_dict_in_generate=True,
                output_logits=True,
            )
        sampled = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float() / temperature
        logps = torch.log_softmax(logits, dim=-1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
        results = []
        for ids, lps in zip(sampled.tolist(), logps.tolist(), strict=True):
            stop = next((k + 1 for k, token in enumerate(ids) if token in ends), len(ids))
            results.append((ids[:stop], lps[:stop]))
        return results


def _tokenizer(trainer: Any) -> Any:
    """The trainer's tokenizer (a processor's inner tokenizer)."""
    processing = trainer.processing_class
    return getattr(processing, "tokenizer", processing)


class _NoTokenizer:
    """Stands in for the tokenizer while the settings are checked at construction."""

    eos_token_id = 0

    def apply_chat_template(self, conversation: Any, /, **kwargs: Any) -> Any:
        raise NotImplementedError

    def decode(self, ids: Any, /, **kwargs: Any) -> str:
        raise NotImplementedError


def _no_sampler(prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    raise NotImplementedError
