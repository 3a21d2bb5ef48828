"""Train a harness's model with TRL's GRPOTrainer, white-box, through OpenEnv.

The harness (here the Reference agent; any CLI works the same: ``harness="codex"``,
``"claude_code"``, ...) runs in ``mode="model"``: each model call it makes is one
``model_step`` of the trainer's policy, and the token ids the policy sampled go to the
trainer unchanged. OpenEnv's own ``build_harness_rollout_func`` turns our session factory
and adapter into the ``rollout_func`` TRL calls.

    python examples/trl_grpo.py --dry-run   # one rollout with a scripted policy (no GPU)
    python examples/trl_grpo.py --model Qwen/Qwen3-0.6B --engine http://127.0.0.1:8000

Needs ``pip install 'gym_harness[openenv]' && pip install --no-deps 'openenv==0.10.0'``;
training also needs ``trl``, ``torch``, ``datasets`` and an OpenAI-compatible vLLM server
for the policy (``vllm serve MODEL``), which returns the engine's own token ids.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable
from typing import Any

from openenv.core.harness import (
    HarnessRunLimits,
    ModelStep,
    ModelStepResult,
    ResourceSession,
    build_harness_rollout_func,
)
from openenv.core.llm_client import LLMResponse, ToolCall

from gym_harness import RewardContext
from gym_harness.openenv import HarnessSessionFactory, ModelModeAdapter

PROMPTS = ["What is 20 + 22? Use the add tool.", "Add 7 and 35 with the add tool."]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def reward(ctx: RewardContext) -> float:
    """1.0 when the final reply gives 42."""
    return 1.0 if "42" in ctx.response else 0.0


def make_rollout_func(
    model_step_builder: Callable[[Any, ResourceSession], ModelStep], harness: str = "reference"
) -> Callable[[list[Any], Any], dict[str, list[Any]]]:
    """TRL's ``rollout_func(prompts, trainer)``: one model-mode episode per prompt."""
    factory = HarnessSessionFactory(
        {"harness": harness, "mode": "model"}, tools=[add], reward_fn=reward
    )
    return build_harness_rollout_func(
        session_factory=factory,
        harness_adapter=ModelModeAdapter(),
        model_step_builder=model_step_builder,
        limits=HarnessRunLimits(max_turns=8),
    )


def scripted_step(trainer: Any, session: ResourceSession) -> ModelStep:
    """A stand-in policy for the dry run: calls the tool once, then answers; made-up ids."""
    ids = itertools.count(1)

    def step(messages: list[dict[str, Any]], tools: list[Any], sampling: dict[str, Any]) -> Any:
        if not any(m.get("role") == "tool" for m in messages):
            args = {"a": 20, "b": 22}
            response = LLMResponse(content="", tool_calls=[ToolCall("c1", tools[0].name, args)])
        else:
            response = LLMResponse(content="The answer is 42.")
        prompt, completion = [next(ids) for _ in range(4)], [next(ids) for _ in range(3)]
        return ModelStepResult(response, prompt, completion, [-0.5] * len(completion))

    return step


def engine_step(base_url: str, model: str) -> Callable[[Any, ResourceSession], ModelStep]:
    """A policy served by vLLM: the engine's own prompt ids, sampled ids and logprobs."""

    def builder(trainer: Any, session: ResourceSession) -> ModelStep:
        import httpx2

        def step(messages: list[dict[str, Any]], tools: list[Any], sampling: dict[str, Any]) -> Any:
            body = {
                "model": model,
                "messages": messages,
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": t.name,
                            "description": t.description,
                            "parameters": t.input_schema,
                        },
                    }
                    for t in tools
                ],
                "return_token_ids": True,  # vLLM: prompt_token_ids and token_ids come back
                "logprobs": True,
                **sampling,
            }
            answer = httpx2.post(f"{base_url}/v1/chat/completions", json=body, timeout=600).json()
            choice = answer["choices"][0]
            calls = [
                ToolCall(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in choice["message"].get("tool_calls") or []
            ]
            return ModelStepResult(
                LLMResponse(content=choice["message"].get("content") or "", tool_calls=calls),
                prompt_ids=answer["prompt_token_ids"],
                completion_ids=choice["token_ids"],
                logprobs=[e["logprob"] for e in choice["logprobs"]["content"]],
            )

        return step

    return builder


def env_reward(completions: list[Any], env_reward: list[float], **kwargs: Any) -> list[float]:
    """TRL reward function: the env's reward, which the rollout function returned."""
    return list(env_reward)


def train(model: str, engine: str) -> None:
    """GRPO over the harness (needs trl, torch, datasets, and a vLLM server at ``engine``)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS * 32]),
        args=GRPOConfig(output_dir="grpo-harness", num_generations=4, max_steps=10),
        rollout_func=make_rollout_func(engine_step(engine, model)),
    )
    trainer.train()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="one scripted rollout, no GPU")
    parser.add_argument("--model", default="Qwen/Qwen3-0.6B")
    parser.add_argument("--engine", default="http://127.0.0.1:8000", help="vLLM server")
    args = parser.parse_args(argv)
    if not args.dry_run:
        train(args.model, args.engine)
        return 0
    rows = make_rollout_func(scripted_step)(PROMPTS, None)  # as TRL calls it
    for i in range(len(PROMPTS)):
        row = {key: rows[key][i] for key in ("prompt_ids", "completion_ids", "logprobs")}
        print(json.dumps({**row, "env_reward": rows["env_reward"][i]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
