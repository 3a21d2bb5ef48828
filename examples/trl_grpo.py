"""Train a harness's model with TRL's GRPOTrainer: each model call the harness makes is
sampled by the trainer's model, and each episode is one training row.

The harness (here the Reference agent; any CLI works the same: ``--harness codex``,
``claude_code``, ...) runs in ``mode="model"``. ``gym_harness.training.trl.rollout_func``
is the ``rollout_func`` TRL calls: the ``num_generations`` episodes of each prompt run
concurrently, each call's prompt ids extend the previous call's prompt + completion (one
token chain per episode), and the row masks the ids the environment inserted.

    python examples/trl_grpo.py --tiny       # 2 steps on CPU, a tiny model built here
    trl vllm-serve --model Qwen/Qwen3-0.6B    # GPU: the policy's engine, in another shell
    python examples/trl_grpo.py --model Qwen/Qwen3-0.6B

Needs ``pip install 'gym_harness[train]'`` (trl, transformers, accelerate, datasets,
torch); the GPU path also needs vLLM (``pip install 'trl[vllm]'``). ``--tiny`` downloads
nothing: its model is random, so it decides the tool use itself (``add`` first, then the
model's text); the ids and log-probabilities stay the model's own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from gym_harness import RewardContext
from gym_harness.training.trl import env_reward, rollout_func

PROMPTS = ["What is 20 + 22? Use the add tool.", "Add 7 and 35 with the add tool."]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def reward(ctx: RewardContext) -> float:
    """1.0 when the final reply gives 42; 0.0 otherwise, and for an episode cut short."""
    return 0.0 if ctx.truncated else float("42" in ctx.response)


def tool_first(text: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """``--tiny``'s tool use: call ``add`` first, then answer with the model's text."""
    if not any(m.get("role") == "tool" for m in request["messages"]):
        return {"content": "", "tool_calls": [{"name": "add", "arguments": {"a": 20, "b": 22}}]}
    return {"content": text}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny local model on CPU")
    parser.add_argument("--model", default="Qwen/Qwen3-0.6B", help="the model to train (GPU)")
    parser.add_argument("--harness", default="reference", help="reference, codex, ...")
    parser.add_argument("--steps", type=int, default=2, help="training steps")
    parser.add_argument("--output-dir", default="grpo-harness")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    config: dict[str, Any] = {
        "output_dir": args.output_dir,
        "num_generations": 4,  # TRL repeats each prompt this many times: one episode each
        "per_device_train_batch_size": 4,
        "max_steps": args.steps,
        "max_completion_length": 256,  # per model call
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
    }
    options: dict[str, Any] = {}
    if args.tiny:
        from gym_harness.training.tiny import tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        model: Any = tiny_model(tokenizer)
        # TRL defaults to bf16, which a CPU run refuses: say CPU and float32.
        config.update(use_cpu=True, bf16=False, max_completion_length=16, num_generations=2)
        config.update(per_device_train_batch_size=2)
        options["action"] = tool_first
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = args.model
        # The engine that samples is TRL's vLLM server; TRL pushes the new weights to it
        # before every rollout (without use_vllm an engine of yours keeps the old weights).
        config.update(use_vllm=True, vllm_mode="server")
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=env_reward,
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS * 16]),
        args=GRPOConfig(**config),
        rollout_func=rollout_func(
            f"gym_harness/{_ENV_IDS.get(args.harness, args.harness)}",
            tools=[add],
            reward_fn=reward,
            max_turns=8,
            concurrency=8,
            **options,
        ),
    )
    trainer.train()
    for entry in trainer.state.log_history:  # one JSON line per logged step
        print(json.dumps({k: v for k, v in entry.items() if k in ("step", "loss", "reward")}))
    return 0


_ENV_IDS = {
    "reference": "Reference-v0",
    "codex": "Codex-v0",
    "claude_code": "ClaudeCode-v0",
    "opencode": "OpenCode-v0",
    "qwen_code": "QwenCode-v0",
    "gemini_cli": "GeminiCLI-v0",
}

if __name__ == "__main__":
    sys.exit(main())
