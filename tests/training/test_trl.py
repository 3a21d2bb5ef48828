"""TRL's real ``GRPOTrainer.train()`` through ``gym_harness.training.trl.rollout_func``.

A tiny Qwen2-style model and a byte-level tokenizer with a chat template that renders
tools, tool calls and tool messages are built here (``gym_harness.training.tiny``; no
hub). The trainer's model samples every model call of ``Reference-v0`` episodes in model
mode on CPU; the test's ``action`` decides the tool use (a tool call first, then an
answer), so every episode makes two calls, while the ids and log-probabilities stay the
model's own. TRL's recomputed per-token log-probabilities are read in ``compute_loss``,
before the optimizer step, with TRL's own ``_get_per_token_logps_and_entropies`` on the
batch TRL built: the same weights that sampled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest

pytest.importorskip(
    "trl", reason="needs trl, torch and transformers: pip install 'gym_harness[train]'"
)

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from gym_harness import RewardContext, TokenChain
from gym_harness.training.tiny import tiny_model, tiny_tokenizer
from gym_harness.training.trl import HarnessRolloutFunc, rollout_func

pytestmark = [
    pytest.mark.timeout(1200),
    # TRL 1.16 reads and sets the gradient-checkpointing names transformers 5 renamed (its
    # GRPOConfig, and unwrap_model_for_generation, which TRL's own generation uses too).
    pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.* is deprecated:FutureWarning"),
]

PROMPT = "What is 2 + 3? Use the add tool."


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def reward(ctx: RewardContext) -> float:
    """The answer's length (1 to 3); -1 for an episode cut by a limit."""
    return -1.0 if ctx.truncated else float(len(ctx.response))


def steer(text: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """The policy's tool use: call ``add`` first, then answer ("5" once to three times,
    by the sampled text's length, so rewards differ within a group)."""
    if not any(m.get("role") == "tool" for m in request["messages"]):
        return {"content": "", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}
    return {"content": "5" * (1 + len(text) % 3)}


class RecordingTrainer(GRPOTrainer):
    """Keeps, per loss computation, TRL's batch and its recomputed per-token log-probs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[dict[str, Any]] = []
        self.workers: list[set[int]] = []  # this process's children after each rollout

    def compute_loss(
        self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                model, ids, mask, inputs["completion_ids"].size(1)
            )
        self.seen.append(
            {**{k: v for k, v in inputs.items() if torch.is_tensor(v)}, "logps": logps}
        )
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps: int, **options: Any
) -> tuple[RecordingTrainer, list[dict[str, list[Any]]], list[list[Any]], Any]:
    """Train ``steps`` GRPO steps; the trainer, each rollout's output, each rollout's
    rows and the rewards TRL's reward function got."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)
    func = rollout_func(
        "gym_harness/Reference-v0",
        tools=[add],
        reward_fn=reward,
        action=steer,
        concurrency=2,
        **options,
    )
    outputs: list[dict[str, list[Any]]] = []
    rows: list[list[Any]] = []
    rewards: list[Any] = []

    def recording(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        out = func(prompts, trainer)
        trainer.workers.append({p.pid for p in psutil.Process().children()})
        outputs.append(out)
        rows.append(list(func.last_rows))
        return out

    def env_reward(completions: list[Any], env_reward: list[Any], **kwargs: Any) -> list[Any]:
        rewards.append(list(env_reward))
        return list(env_reward)

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=2,
        num_generations=2,
        gradient_accumulation_steps=1,
        max_steps=steps,
        max_completion_length=8,
        learning_rate=0.05,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    trainer = RecordingTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[env_reward],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": PROMPT}]}] * 8),
        rollout_func=recording,
    )
    trainer.train()
    return trainer, outputs, rows, (rewards, tokenizer)


def _unpad(batch: dict[str, Any], b: int) -> tuple[list[int], list[int], Any, Any, Any]:
    prompt = batch["prompt_ids"][b][batch["prompt_mask"][b].bool()].tolist()
    keep = batch["completion_mask"][b].bool()
    completion = batch["completion_ids"][b][keep].tolist()
    return (
        prompt,
        completion,
        batch["tool_mask"][b][keep],
        batch["logps"][b][keep],
        batch["sampling_per_token_logps"][b][keep],
    )


def test_grpo_trains_two_steps_scoring_every_sampled_token_in_its_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, outputs, rows, (rewards, tokenizer) = train(tmp_path, monkeypatch, steps=2)
    assert trainer.state.global_step == 2
    # The rollout function's workers serve both steps and end with train().
    assert len(trainer.workers[0]) == 2 and trainer.workers[0] == trainer.workers[1]
    assert not psutil.Process().children()
    assert len(outputs) == len(trainer.seen) == 2  # one rollout per step, one loss each
    for step, (out, step_rows, batch, got) in enumerate(
        zip(outputs, rows, trainer.seen, rewards, strict=True)
    ):
        assert len(step_rows) == 2
        for row in step_rows:  # a tool call, then an answer, in one unbroken chain
            assert row.error == "" and row.outcome == "" and row.breaks == 0
            assert row.calls == row.trained_calls == 2
            assert 0 in row.env_mask and row.env_mask[0] == 1 and row.env_mask[-1] == 1
            assert [v for _, _, v in row.policy_versions] == [step, step]
            # rewards are reward_fn's: the answer's length, from the last call's sampled text
            start, end, _ = row.policy_versions[-1]
            text = tokenizer.decode(row.completion_ids[start:end], skip_special_tokens=True)
            assert row.reward == float(1 + len(text) % 3)
        assert got == out["env_reward"] == [row.reward for row in step_rows]
        assert out["env_mask"] == [row.env_mask for row in step_rows]

        for b in range(batch["completion_ids"].size(0)):
            prompt, completion, mask, logps, sampled = _unpad(batch, b)
            row = next(r for r in step_rows if r.completion_ids == completion)  # TRL shuffles
            assert prompt == row.prompt_ids  # trained ids = sampled ids, in their chain
            assert mask.tolist() == row.env_mask
            assert sampled.tolist() == pytest.approx(row.logprobs)
            trained = mask.bool()
            diff = (logps[trained] - sampled[trained]).abs().max().item()
            assert diff < 1e-3, f"step {step} row {b}: recomputed log-probs differ by {diff}"
            _check_inserted(tokenizer, row)


def _check_inserted(tokenizer: Any, row: Any) -> None:
    """The mask-0 ids are what the template renders after the first call's answer: the tool
    result and the next generation prompt (a length-cut answer gets its end-of-turn id)."""
    (s1, e1, _), (s2, _, _) = row.policy_versions
    inserted = row.completion_ids[e1:s2]
    assert set(row.env_mask[e1:s2]) == {0} and set(row.env_mask[s1:e1]) == {1}
    text = tokenizer.decode(inserted)
    assert "<tool_response>\n5\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    closing = row.completion_ids[e1 - 1] != tokenizer.eos_token_id
    assert text.startswith("<|im_end|>" if closing else "\n<|im_start|>user")


def test_max_turns_cuts_each_episode_and_train_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """max_turns=1 on an episode that needs two calls: every row has reward_fn's truncation
    score, and train() completes."""
    trainer, outputs, rows, (rewards, _) = train(tmp_path, monkeypatch, steps=1, max_turns=1)
    assert trainer.state.global_step == 1
    (step_rows,) = rows
    assert rewards == [[-1.0, -1.0]] and outputs[0]["rollout_outcome"] == ["max_turns"] * 2
    for row in step_rows:
        assert row.calls == row.trained_calls == 1 and set(row.env_mask) == {1}


def test_an_episode_that_never_starts_is_a_recorded_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A harness that cannot start: rows that train nothing, reward None, the reason said."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = tiny_tokenizer()
    func = rollout_func(
        {"harness": "command", "command": [str(tmp_path / "missing")]},
        sampler=lambda trainer: lambda prompts: [([tokenizer.eos_token_id], [0.0])] * len(prompts),
    )

    class Trainer:  # what the rollout function reads of a trainer when a sampler is given
        processing_class = tokenizer

    out = func([PROMPT, PROMPT], Trainer())
    assert out["env_reward"] == [None, None]
    assert all(m == [0] for m in out["env_mask"])
    assert all("never started" in e for e in out["rollout_error"])


def test_bad_settings_fail_when_the_rollout_function_is_made() -> None:
    with pytest.raises(Exception, match="concurrency"):
        rollout_func("gym_harness/Reference-v0", concurrency=0)
    with pytest.raises(Exception, match="model mode"):
        rollout_func("gym_harness/Reference-v0", mode="turns")
    assert isinstance(rollout_func("gym_harness/Reference-v0"), HarnessRolloutFunc)


# -- TokenChain on the tiny tokenizer --------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"type": "function", "id": "c1", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    ],
}


def _observation(messages: list[dict[str, Any]], **link: Any) -> dict[str, Any]:
    return {"messages": messages, "tools": TOOLS, **link}


@pytest.mark.parametrize("ended", [True, False], ids=["eos", "cut"])
@pytest.mark.parametrize("said", [True, False], ids=["extends-given", "inferred"])
def test_token_chain_extends_by_the_template_delta(ended: bool, said: bool) -> None:
    tokenizer = tiny_tokenizer()
    chain = TokenChain(tokenizer)
    user = [{"role": "user", "content": "2+3?"}]
    first = chain.prompt_ids(_observation(user))
    assert first == tokenizer.apply_chat_template(
        user, tools=TOOLS, add_generation_prompt=True, return_dict=False
    )
    sampled = tokenizer.encode("abc") + ([tokenizer.eos_token_id] if ended else [])
    chain.record(sampled, [-1.0] * len(sampled), policy_version=3)
    tool = {"role": "tool", "content": "5", "tool_call_id": "c1"}
    link = {"extends": True, "new_from": 2} if said else {}
    second = chain.prompt_ids(_observation([*user, CALL, tool], **link))
    assert second[: len(first) + len(sampled)] == first + sampled
    delta = tokenizer.decode(second[len(first) + len(sampled) :])
    expected = "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
    assert delta == ("" if ended else "<|im_end|>") + expected + "<|im_start|>assistant\n"
    chain.record([7], [-0.5], policy_version=4)
    (row,) = chain.rows()
    assert row.calls == 2 and row.prompt_ids == tuple(first)
    assert row.mask == (1,) * len(sampled) + (0,) * (len(second) - len(first) - len(sampled)) + (1,)
    assert row.policy_versions == ((0, len(sampled), 3), (len(row.mask) - 1, len(row.mask), 4))


def test_token_chain_breaks_where_the_history_was_rewritten() -> None:
    tokenizer = tiny_tokenizer()
    chain = TokenChain(tokenizer)
    user = [{"role": "user", "content": "2+3?"}]
    chain.prompt_ids(_observation(user))
    chain.record([1, tokenizer.eos_token_id], [-1.0, -1.0])
    compacted = [{"role": "user", "content": "summary: 2+3 asked"}]
    fresh = chain.prompt_ids(_observation(compacted, extends=False, new_from=0))
    assert fresh == tokenizer.apply_chat_template(
        compacted, tools=TOOLS, add_generation_prompt=True, return_dict=False
    )
    call = chain.record([2], [-1.0])
    assert not call.extends and "rewrote" in call.break_reason
    assert [row.calls for row in chain.rows()] == [1, 1]
    assert json.dumps(chain.longest().mask) == "[1, 1]"  # type: ignore[union-attr]
