"""verl's agent loop over any harness in model mode: :class:`HarnessAgentLoop`.

Registered with verl's registry as ``"gym_harness"`` (``@register``) when this module is
imported; an ``agent_loop_config_path`` YAML entry with ``_target_:
gym_harness.verl.HarnessAgentLoop`` registers it under a name of yours with its settings
(docs/verl.md has the YAML). One loop object runs one sample: :meth:`HarnessAgentLoop.run`
resets a ``HarnessEnv`` for the sample, answers each model call of the harness with
``await server_manager.generate(request_id, prompt_ids=..., sampling_params=...)`` on the
chain's prompt ids, and returns the episode's token chain as verl's ``AgentLoopOutput``.
The episode itself runs in :func:`gym_harness.verl.episode.run_episode`; this module only
binds it to verl's types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any
from uuid import uuid4

from gym_harness.errors import ConfigError
from gym_harness.tasks import as_task
from gym_harness.training.groups import model_env_kwargs
from gym_harness.training.tool_calls import completion_action
from gym_harness.utils.imports import import_attr, import_optional
from gym_harness.verl.episode import EpisodeResult, Generated, run_episode

_verl = import_optional("verl", extra="verl", what="gym_harness.verl")

from omegaconf import DictConfig, ListConfig, OmegaConf  # noqa: E402  (verl's own config)
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

__all__ = ["HarnessAgentLoop"]


@register("gym_harness")
class HarnessAgentLoop(AgentLoopBase):
    """verl's ``AgentLoopBase`` over a harness in model mode: one episode per sample.

    verl's ``AgentLoopWorker`` builds one per sample (with ``hydra.utils.instantiate``:
    ``trainer_config``, ``server_manager``, ``tokenizer``, ``processor``, ... and the keys
    of the loop's YAML entry) and awaits :meth:`run` on its event loop; the harness's
    blocking calls run in worker threads.

    Args:
        env: A registered env id (``"gym_harness/Codex-v0"``) or a dict of ``HarnessEnv``
            keywords; a dataset row's ``extra_info["env"]`` replaces it for that sample.
        env_kwargs: More ``HarnessEnv`` keywords (``tools``, ``reward_fn`` as
            ``"package.module:attr"`` strings, ``model``, timeouts ...); a row's
            ``extra_info["env_kwargs"]`` adds to them.
        max_turns: Most model calls per episode (default: the env id's step limit); an
            episode still running then is cut and scored as truncated (``ctx.truncated``).
        all_chains: Return a list with one output per token chain (verl's v1 trainer,
            ``verl.trainer.ppo.v1``, takes a list) instead of the chain with the most
            sampled ids (the one output the legacy ``AgentLoopWorker`` takes).
        action: Turns a completion's text into the action, or its import string (default:
            Hermes/Qwen ``<tool_call>{json}</tool_call>`` tool calls).
        end_of_turn_ids: Ids that end an assistant turn besides the tokenizer's eos.
        chat_template_kwargs: Passed to the chat template (default: verl's
            ``data.apply_chat_template_kwargs``).
        **kwargs: verl's constructor arguments (``trainer_config``, ``server_manager``,
            ``tokenizer``, ``processor``, ...).

    Raises:
        ConfigError: Bad settings, or the sample names no env.

    Example:
        >>> # agent_loop.yaml (actor_rollout_ref.rollout.agent.agent_loop_config_path):
        >>> # - name: harness
        >>> #   _target_: gym_harness.verl.HarnessAgentLoop
        >>> #   env: gym_harness/Reference-v0
        >>> #   env_kwargs: {reward_fn: "my_rewards:score"}
    """

    def __init__(
        self,
        *args: Any,
        env: str | Mapping[str, Any] | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        max_turns: int | None = None,
        all_chains: bool = False,
        action: str | Callable[[str, Mapping[str, Any]], dict[str, Any]] = completion_action,
        end_of_turn_ids: Sequence[int] = (),
        chat_template_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if max_turns is not None and int(max_turns) < 1:
            raise ConfigError(f"max_turns must be at least 1, got {max_turns}")
        self.env = _plain(env)
        self.env_kwargs = dict(_plain(env_kwargs) or {})
        self.max_turns = None if max_turns is None else int(max_turns)
        self.all_chains = bool(all_chains)
        self.action = import_attr(action, "action") if isinstance(action, str) else action
        self.end_of_turn_ids = tuple(int(i) for i in _plain(end_of_turn_ids) or ())
        template = _plain(chat_template_kwargs)
        self.chat_template_kwargs = dict(
            self.apply_chat_template_kwargs if template is None else template
        )
        if self.env is not None:
            model_env_kwargs(self.env, self.env_kwargs)  # a bad env fails here, not mid-training

    async def run(
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Run one episode for the dataset row ``kwargs``; its chain(s) as verl's output.

        The task is the row's ``extra_info["task"]`` (a task dict or a prompt) if given,
        else its ``raw_prompt`` (the last user message is the prompt).

        Args:
            sampling_params: verl's sampling parameters, passed to every ``generate``.
            **kwargs: The dataset row (``raw_prompt``, ``extra_info``, ``index`` ...).

        Returns:
            ``prompt_ids`` (the first call's prompt), ``response_ids`` (``c1 ‖ d1 ‖ c2 …``:
            sampled ids, then the ids the harness's tools and the template inserted),
            ``response_mask`` (1 sampled, 0 inserted), ``response_logprobs`` (0.0 where
            inserted), ``reward_score`` (``reward_fn``'s), ``num_turns``, ``metrics`` and
            ``extra_fields`` (``model_calls``, ``tool_calls``, ``outcome``, ``error``,
            ``chain_breaks``, ``min_global_steps``, ``max_global_steps``). A list of them,
            one per chain, with ``all_chains=True``.
        """
        extra = dict(_plain(kwargs.get("extra_info")) or {})
        env = _plain(extra.get("env", self.env))
        if env is None:
            raise ConfigError(
                "HarnessAgentLoop needs an env: set `env` in the agent loop's YAML entry, "
                "or give the dataset row an extra_info['env']"
            )
        env_kwargs, steps = model_env_kwargs(
            env, {**self.env_kwargs, **dict(_plain(extra.get("env_kwargs")) or {})}
        )
        task = as_task(_plain(extra["task"]) if "task" in extra else _plain(kwargs["raw_prompt"]))
        request_id = uuid4().hex

        async def generate(prompt_ids: list[int]) -> Generated:
            out = await self.server_manager.generate(
                request_id, prompt_ids=prompt_ids, sampling_params=sampling_params
            )
            version = out.extra_fields.get("global_steps")
            first = out.extra_fields.get("min_global_steps")
            return Generated(
                token_ids=list(out.token_ids),
                logprobs=[float(x) for x in out.log_probs or ()],
                policy_version=None if version is None else int(version),
                first_version=None if first is None else int(first),
                preempted=int(out.num_preempted or 0),
            )

        result = await run_episode(
            env_kwargs,
            task,
            tokenizer=self.tokenizer,
            generate=generate,
            action=self.action,
            max_turns=self.max_turns if self.max_turns is not None else steps,
            end_of_turn_ids=self.end_of_turn_ids,
            chat_template_kwargs=self.chat_template_kwargs,
        )
        outputs = self._outputs(result, task)
        if self.all_chains:
            return outputs
        return max(outputs, key=lambda out: sum(out.response_mask))

    def _outputs(self, result: EpisodeResult, task: Mapping[str, Any]) -> list[AgentLoopOutput]:
        """One ``AgentLoopOutput`` per chain (one that trains nothing when there is none)."""
        extra = {
            "model_calls": result.model_calls,
            "tool_calls": result.tool_calls,
            "outcome": result.outcome,
            "error": result.error,
            "chain_breaks": max(len(result.chains) - 1, 0),
            "min_global_steps": result.min_version,
            "max_global_steps": result.max_version,
        }
        chains = result.chains or [self._empty_chain(result, task)]
        limit = int(self.rollout_config.response_length)
        outputs = []
        for chain in chains:
            response = list(chain["completion_token_ids"])[:limit]
            outputs.append(
                AgentLoopOutput(
                    prompt_ids=self._cap_text_prompt_length(list(chain["prompt_token_ids"])),
                    response_ids=response,
                    response_mask=list(chain["mask"])[: len(response)],
                    response_logprobs=[float(x) for x in chain["logprobs"]][: len(response)],
                    reward_score=result.reward,
                    num_turns=len(chain.get("node_ids") or ()),
                    metrics=AgentLoopMetrics(
                        generate_sequences=result.generate_s,
                        tool_calls=result.env_s,
                        num_preempted=result.preempted,
                    ),
                    extra_fields=dict(extra),
                )
            )
        return outputs

    def _empty_chain(self, result: EpisodeResult, task: Mapping[str, Any]) -> dict[str, Any]:
        """A chain that trains nothing: the first prompt (or the task's), one masked end id."""
        prompt = result.first_prompt_ids
        if not prompt:
            messages = [{"role": "user", "content": str(task.get("prompt", ""))}]
            prompt = self.tokenizer.apply_chat_template(
                messages,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **self.chat_template_kwargs,
            )
        end = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
        return {
            "prompt_token_ids": [int(i) for i in prompt],
            "completion_token_ids": [int(end)],
            "mask": [0],
            "logprobs": [0.0],
            "node_ids": [],
        }


def _plain(value: Any) -> Any:
    """An OmegaConf value (a YAML entry's dict or list) as plain Python; anything else as is."""
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    if hasattr(value, "tolist") and not isinstance(value, str):  # a numpy array of a row
        return value.tolist()
    return value
