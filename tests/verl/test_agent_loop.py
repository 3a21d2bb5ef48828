"""verl's own ``AgentLoopWorker`` runs ``HarnessAgentLoop`` on Reference in model mode (CPU).

The worker is built the way verl's trainer builds it: from verl's composed
``ppo_trainer`` config, with the tiny local model and tokenizer saved to disk
(``gym_harness.training.tiny``; no hub) and an ``agent_loop_config_path`` YAML that names
``gym_harness.verl.HarnessAgentLoop``. ``worker.generate_sequences`` instantiates the loop
per sample with hydra, awaits its ``run`` and pads the outputs into verl's batch.

The engine is verl's own ``FullyAsyncLLMServerClient`` (the fully-async trainer's client)
over a deterministic stand-in for a rollout replica: each model call is first aborted half
way (``stop_reason="aborted"``, as a weight sync aborts it, at ``global_steps`` 3), then
resumed by verl's client with the prompt + the ids so far (at ``global_steps`` 4). The
loop sees one whole completion per call. The replica answers with a tool call of ``add``
first, then with an answer, so every episode makes two model calls.

verl pins ``transformers<5.11``, so these tests run in verl's own virtualenv
(``.ci/verl-tests.sh``); elsewhere they are skipped.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from gym_harness.errors import ConfigError
from gym_harness.utils.imports import import_optional

try:
    import_optional("verl", extra="verl", what="tests/verl")
except ConfigError as exc:
    pytest.skip(f"{exc} (.ci/verl-tests.sh builds its virtualenv)", allow_module_level=True)

# verl's import chain warns about Ray's and its own deprecated names; none of it is ours.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    warnings.simplefilter("ignore", FutureWarning)
    import hydra
    from hydra import compose, initialize_config_dir
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopWorker,
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )
    from verl.protocol import DataProto
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient
    from verl.workers.rollout.replica import TokenOutput

    from gym_harness.verl import HarnessAgentLoop

from gym_harness import RewardContext
from gym_harness.training.tiny import tiny_model, tiny_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TASK = {
    "id": "add",
    "prompt": "Add 1234 and 4321 with the add tool.",
    "meta": {"expect": "5555"},
}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1234, "b": 4321}}\n</tool_call>'
AGENT_LOOPS = """\
- name: harness
  _target_: gym_harness.verl.HarnessAgentLoop
  env: gym_harness/Reference-v0
  env_kwargs:
    reward_fn: gym_harness.agents.demo:demo_reward
- name: harness_one_call
  _target_: gym_harness.verl.HarnessAgentLoop
  env: gym_harness/Reference-v0
  max_turns: 1
- name: harness_chains
  _target_: gym_harness.verl.HarnessAgentLoop
  env: gym_harness/Reference-v0
  all_chains: true
"""


class Replica:
    """A rollout replica's ``generate`` with known ids: ``add`` first, then the answer.

    The first request of each model call returns the first half of its ids, aborted (a
    weight sync); the request that resumes it (the prompt + those ids) returns the rest.
    Log-probabilities are ``-0.01 * (position + 1)`` over the whole completion.
    """

    def __init__(self, tokenizer: Any, answer: str, call: str = CALL) -> None:
        self.tokenizer = tokenizer
        self.answer = answer
        self.call = call
        self.planned: dict[tuple[int, ...], list[int]] = {}
        self.requests: list[dict[str, Any]] = []
        self.generate = self  # ``replica.generate.remote(...)``, as on a Ray actor handle

    async def remote(self, *, prompt_ids: list[int], **kwargs: Any) -> TokenOutput:
        self.requests.append({"prompt_ids": list(prompt_ids), **kwargs})
        for prompt, ids in self.planned.items():
            sent = list(prompt_ids[len(prompt) :])
            if tuple(prompt_ids[: len(prompt)]) == prompt and sent == ids[: len(sent)] and sent:
                rest = ids[len(sent) :]
                lps = [-0.01 * (k + 1) for k in range(len(sent), len(ids))]
                return TokenOutput(
                    token_ids=rest,
                    log_probs=lps,
                    stop_reason="completed",
                    num_preempted=0,
                    extra_fields={"global_steps": 4},
                )
        text = self.tokenizer.decode(prompt_ids)
        reply = self.answer if "<tool_response>" in text else self.call
        ids = self.tokenizer.encode(reply + "<|im_end|>", add_special_tokens=False)
        self.planned[tuple(prompt_ids)] = ids
        half = len(ids) // 2
        return TokenOutput(
            token_ids=ids[:half],
            log_probs=[-0.01 * (k + 1) for k in range(half)],
            stop_reason="aborted",
            num_preempted=1,
            extra_fields={"global_steps": 3},
        )


class StubClient(FullyAsyncLLMServerClient):
    """verl's fully-async client with its one server in this process (no Ray, no balancer)."""

    def __init__(self, config: Any, replica: Replica) -> None:
        super().__init__(config=config, load_balancer_handle=None)
        self.replica = replica

    async def _acquire_server(self, request_id: str, **extra: Any) -> tuple[str, Any]:
        return "stub", self.replica

    def _release_server(self, server_id: str, request_id: str | None = None) -> None:
        pass


@pytest.fixture(scope="module")
def verl_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """verl's composed trainer config over the tiny model, with the agent-loop YAML."""
    import verl

    root = tmp_path_factory.mktemp("verl")
    model_dir = root / "model"
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(model_dir)
    tiny_model(tokenizer).save_pretrained(model_dir)
    loops = root / "agent_loops.yaml"
    loops.write_text(AGENT_LOOPS)
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.prompt_length=2048",
                "actor_rollout_ref.rollout.response_length=512",
                "actor_rollout_ref.rollout.calculate_log_probs=True",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
            ],
        )
    yield config


def run_worker(
    config: Any, answer: str, agent_name: str, rows: list[dict[str, Any]]
) -> tuple[DataProto, Replica, AgentLoopWorker]:
    """verl's worker on ``rows`` with a replica that answers ``answer`` after ``add``."""
    worker = AgentLoopWorker(config, llm_client=None)
    replica = Replica(worker.tokenizer, answer)
    worker.llm_client = StubClient(config, replica)
    n = len(rows)
    batch = DataProto.from_single_dict(
        {
            "raw_prompt": _objects([[{"role": "user", "content": TASK["prompt"]}]] * n),
            "extra_info": _objects(rows),
            "agent_name": _objects([agent_name] * n),
            "index": np.arange(n),
        },
        meta_info={"global_steps": 3, "validate": False},
    )
    return asyncio.run(worker.generate_sequences(batch)), replica, worker


def _objects(values: list[Any]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _unpad(out: DataProto, b: int) -> dict[str, list[Any]]:
    """Sample ``b`` of verl's padded batch: its prompt and response as the loop gave them."""
    batch = out.batch
    width = batch["prompts"].size(1)
    attention = batch["attention_mask"][b].bool()
    prompt_keep, response_keep = attention[:width], attention[width:]
    return {
        "prompt": batch["prompts"][b][prompt_keep].tolist(),
        "response": batch["responses"][b][response_keep].tolist(),
        "mask": batch["response_mask"][b][response_keep].tolist(),
        "logprobs": batch["rollout_log_probs"][b][response_keep].tolist(),
        "score": batch["rm_scores"][b].sum().item(),
    }


def test_two_call_episodes_give_sampled_then_inserted_ids_through_verls_worker(
    verl_config: Any,
) -> None:
    tasks = [TASK, {**TASK, "id": "add-please", "prompt": TASK["prompt"] + " Please."}]
    out, replica, worker = run_worker(
        verl_config, "The sum is 5555.", "harness", [{"task": task} for task in tasks]
    )
    tokenizer = worker.tokenizer
    assert len(replica.planned) == 2 * 2  # two episodes, two model calls each
    # every call was aborted once and resumed with the prompt + the ids so far
    assert len(replica.requests) == 2 * len(replica.planned)
    assert list(out.non_tensor_batch["model_calls"]) == [2, 2]
    assert list(out.non_tensor_batch["tool_calls"]) == [1, 1]
    assert list(out.non_tensor_batch["outcome"]) == ["", ""]
    # the weights that sampled each episode: 3 before the weight sync, 4 after it
    assert list(out.non_tensor_batch["min_global_steps"]) == [3, 3]
    assert list(out.non_tensor_batch["max_global_steps"]) == [4, 4]
    for b, task in enumerate(tasks):
        row = _unpad(out, b)
        prompt, response, mask = row["prompt"], row["response"], row["mask"]
        assert task["prompt"] in tokenizer.decode(prompt)
        first = replica.planned[tuple(prompt)]  # what the engine sampled for call 1
        (second_prompt,) = [
            key
            for key in replica.planned
            if len(key) > len(prompt) and key[: len(prompt)] == tuple(prompt)
        ]
        second = replica.planned[second_prompt]
        # call 2's prompt is the chain: call 1's prompt + its completion + what is new
        assert list(second_prompt[: len(prompt) + len(first)]) == prompt + first
        inserted = list(second_prompt[len(prompt) + len(first) :])
        # response = sampled ids of call 1 ‖ inserted ids ‖ sampled ids of call 2
        assert response == first + inserted + second
        assert mask == [1] * len(first) + [0] * len(inserted) + [1] * len(second)
        text = tokenizer.decode(inserted)
        assert "<tool_response>\n5555\n</tool_response>" in text
        assert text.endswith("<|im_start|>assistant\n")
        # logprobs aligned: the engine's over sampled ids (both halves), 0.0 where inserted
        engine = [-0.01 * (k + 1) for k in range(len(first))]
        engine2 = [-0.01 * (k + 1) for k in range(len(second))]
        assert row["logprobs"] == pytest.approx(engine + [0.0] * len(inserted) + engine2)
        # reward_score = reward_fn's (demo_reward: the answer holds the expected text)
        assert row["score"] == 1.0


def test_reward_score_is_reward_fns(verl_config: Any) -> None:
    out, _, _ = run_worker(verl_config, "I do not know.", "harness", [{"task": TASK}])
    assert _unpad(out, 0)["score"] == 0.0  # demo_reward: "5555" is not in the answer
    assert list(out.non_tensor_batch["outcome"]) == [""]


def truncation_reward(ctx: RewardContext) -> float:
    """-1 for an episode cut by a limit, else 1."""
    return -1.0 if ctx.truncated else 1.0


def test_an_episode_cut_at_max_turns_is_scored_as_truncated(verl_config: Any) -> None:
    rows = [{"task": TASK, "env_kwargs": {"reward_fn": truncation_reward}}]
    out, replica, _ = run_worker(verl_config, "5555", "harness_one_call", rows)
    (ids,) = replica.planned.values()  # the second call was never answered
    row = _unpad(out, 0)
    assert row["response"] == ids and row["mask"] == [1] * len(ids)
    assert row["score"] == -1.0
    assert list(out.non_tensor_batch["outcome"]) == ["max_turns"]


def instantiate(config: Any, name: str, replica: Replica | None) -> Any:
    """The loop registered as ``name``, made as verl's worker makes one (``_run_agent_loop``),
    inside a running event loop (verl's loop keeps the one it was made in)."""
    worker = AgentLoopWorker(config, llm_client=None)
    client = None if replica is None else StubClient(config, replica)

    async def make() -> Any:
        return hydra.utils.instantiate(
            config=_agent_loop_registry[name],
            trainer_config=DictConfigWrap(config=config),
            server_manager=client,
            tokenizer=worker.tokenizer,
            processor=None,
            hf_model_type=None,
            dataset_cls=worker.dataset_cls,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap([]),
        )

    return worker, make


def test_all_chains_gives_verls_v1_trainer_a_list(verl_config: Any) -> None:
    replica = Replica(tiny_tokenizer(), "5555")
    worker, make = instantiate(verl_config, "harness_chains", replica)
    replica.tokenizer = worker.tokenizer

    async def run() -> Any:
        loop = await make()
        return await loop.run({"temperature": 1.0, "logprobs": True}, extra_info={"task": TASK})

    outputs = asyncio.run(run())
    assert isinstance(outputs, list) and len(outputs) == 1  # one unbroken chain
    (output,) = outputs
    assert sum(output.response_mask) == sum(len(ids) for ids in replica.planned.values())
    assert output.reward_score == 1.0
    assert output.extra_fields["model_calls"] == 2
    assert output.num_turns == 2


def test_a_sample_with_no_env_says_what_to_set(verl_config: Any) -> None:
    worker, _ = instantiate(verl_config, "harness", None)

    async def run() -> Any:
        loop = HarnessAgentLoop(
            trainer_config=DictConfigWrap(config=verl_config),
            server_manager=None,
            tokenizer=worker.tokenizer,
            processor=None,
            dataset_cls=worker.dataset_cls,
            data_config=DictConfigWrap(verl_config.data),
        )
        return await loop.run({}, raw_prompt=[{"role": "user", "content": "hi"}])

    with pytest.raises(ConfigError, match="needs an env"):
        asyncio.run(run())


def test_the_env_runs_off_the_event_loop(verl_config: Any) -> None:
    """The harness's tool waits for a coroutine on verl's event loop: it can run only if
    the env's step does not hold the loop."""
    started, released = threading.Event(), threading.Event()

    def hang() -> str:
        """Wait for the test."""
        started.set()
        return "released" if released.wait(60) else "timed out"

    call = '<tool_call>\n{"name": "hang", "arguments": {}}\n</tool_call>'
    replica = Replica(tiny_tokenizer(), "done", call=call)
    worker, make = instantiate(verl_config, "harness", replica)
    replica.tokenizer = worker.tokenizer

    async def release() -> bool:
        deadline = time.monotonic() + 120
        while not started.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        released.set()
        return started.is_set()

    async def run() -> Any:
        loop = await make()
        row = {"task": TASK, "env_kwargs": {"tools": [hang]}}
        episode = loop.run({"temperature": 1.0, "logprobs": True}, extra_info=row)
        return await asyncio.gather(episode, release())

    output, tool_started = asyncio.run(run())
    assert tool_started
    assert output.extra_fields["model_calls"] == 2 and output.extra_fields["outcome"] == ""
    inserted = [i for i, m in zip(output.response_ids, output.response_mask, strict=True) if not m]
    assert "<tool_response>\nreleased\n</tool_response>" in worker.tokenizer.decode(inserted)
