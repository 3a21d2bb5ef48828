"""TRL's async harness worker (``trl.experimental.async_grpo``) scores our rollouts.

TRL's ``HarnessRolloutWorker`` spawns a child process that builds its rollout loop
(``HarnessRolloutWorker._loop_cls``) from the worker's keywords and runs it; the loop calls
the factory callable it was given (``sampling=`` its training policy without an adapter,
nothing with one), creates a session per generation, drives it, and pushes scored
samples. The worker itself needs vLLM installed, so the test builds that same loop with
those keywords in this process and runs it as the child does, in a thread:

* white box (``ModelModeAdapter``): the loop renders each model call of the Reference
  agent in model mode with the tokenizer, asks a loopback ``/v1/completions`` server
  (answering as vLLM does, with token ids and logprobs) for the completion, and parses it
  back into a tool call or an answer;
* black box (capture): the loop passes ``sampling=``, runs the turn
  (``wait_for_completion``) of an agent whose model is a loopback upstream answering like
  vLLM, and trains on ``fetch_training_trace()``.

Either way every generation comes back as samples whose reward is our ``reward_fn``'s:
scorable, not the "unscorable" a rejected factory or session gives.

Needs TRL (with transformers, torch), datasets, aiohttp (what TRL's async worker needs)
and the openenv extra: skipped without them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import queue
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("openenv.core.harness")
pytest.importorskip("trl.experimental.async_grpo.openenv_harness")
pytest.importorskip("datasets")
pytest.importorskip("aiohttp")

import datasets
from support import TOKEN_AGENT
from support.cli import Calls
from support.model_server import ScriptedModelServer
from trl.chat_template_utils import qwen3_chat_template
from trl.experimental.async_grpo.openenv_harness import HarnessRolloutWorker

from gym_harness import RewardContext
from gym_harness.openenv import HarnessSessionFactory, ModelModeAdapter
from gym_harness.training.tiny import tiny_tokenizer

#: Generations of the one prompt (one group).
GENERATIONS = 2
TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 20, "b": 22}}\n</tool_call><|im_end|>'
ANSWER = "The sum is 42.<|im_end|>"


def reward(ctx: RewardContext) -> float:
    """0.75 when the reply gives the sum, else 0.25 (either tells it came from here)."""
    return 0.75 if "42" in ctx.response else 0.25


def byte_tokenizer() -> Any:
    """The tiny byte-level tokenizer with Qwen3's chat template (TRL's copy): no hub."""
    tokenizer = tiny_tokenizer(chat_template=qwen3_chat_template)
    tokenizer.add_tokens(["<tool_response>", "</tool_response>"])
    return tokenizer


@pytest.fixture
def vllm(tmp_path: Any) -> Iterator[tuple[str, Any, list[list[int]]]]:
    """A loopback ``/v1/completions`` that answers as vLLM does (ids and logprobs): a call
    of the ``add`` tool, or the sum once the prompt holds a tool response.

    Yields its URL, its tokenizer, and the completion ids it sampled, in order.
    """
    tokenizer = byte_tokenizer()
    sampled: list[list[int]] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            prompt = tokenizer.decode(body["prompt"])
            text = ANSWER if "<tool_response>" in prompt else TOOL_CALL
            ids = tokenizer.encode(text, add_special_tokens=False)
            with lock:
                sampled.append(ids)
            choice = {"token_ids": ids, "logprobs": {"token_logprobs": [-0.25] * len(ids)}}
            data = json.dumps({"choices": [choice]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", tokenizer, sampled
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def run_worker_loop(tokenizer: Any, url: str, **worker_kwargs: Any) -> list[Any]:
    """Build TRL's harness rollout loop from the keywords its worker forwards, run it as the
    worker's child does, and return the samples of the first group."""
    from accelerate.state import PartialState

    PartialState()  # what the worker's child does first (TRL's logger needs it)
    samples: queue.Queue[Any] = queue.Queue()
    rows = [{"prompt": [{"role": "user", "content": "add 20 and 22"}]}]
    loop = HarnessRolloutWorker._loop_cls(
        model_name="tiny",
        dataset=datasets.Dataset.from_list(rows),
        reward_funcs=[],
        processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
        rollout_buffer=samples,
        model_version_value=_Value(0),
        heartbeat_value=_Value(0.0),
        failed_event=threading.Event(),
        exception_info_queue=queue.Queue(maxsize=1),
        metrics_queue=queue.Queue(maxsize=4096),
        num_generations=GENERATIONS,
        max_inflight_tasks=GENERATIONS,
        vllm_server_url=url,
        max_tokens=64,
        queue_maxsize=0,
        dataset_start_index=0,
        **worker_kwargs,
    )
    thread = threading.Thread(target=loop.run, name="trl-rollout-loop", daemon=True)
    thread.start()
    got: list[Any] = []
    try:
        for _ in range(300):  # at most 5 minutes
            if len(got) >= GENERATIONS or not thread.is_alive():
                break
            with contextlib.suppress(queue.Empty):
                got.append(samples.get(timeout=1))
    finally:
        with contextlib.suppress(RuntimeError):  # the loop ended by itself (it failed)
            loop._loop.call_soon_threadsafe(loop._stop_event.set)  # the worker's stop()
        thread.join(120)
    assert not thread.is_alive(), "TRL's rollout loop did not stop"
    assert not loop._failed_event.is_set(), loop._exception_info_queue.get_nowait()
    return got


class _Value:
    """What the loop reads of an ``mp.Value``: ``.value`` (one process here)."""

    def __init__(self, value: float) -> None:
        self.value = value


@pytest.mark.timeout(600)
def test_white_box_rollouts_are_scored(vllm: tuple[str, Any, list[list[int]]]) -> None:
    url, tokenizer, sampled = vllm
    calls = Calls()
    factory = functools.partial(
        HarnessSessionFactory,
        {"harness": "reference", "mode": "model", "tools": calls.tools()},
        reward_fn=reward,
    )
    samples = run_worker_loop(
        tokenizer,
        url,
        harness_session_factory=factory,
        harness_adapter=ModelModeAdapter(factory),
    )
    assert len(samples) >= GENERATIONS
    for sample in samples:
        assert sample.metrics["rewards/harness_reward"] == 0.75  # reward_fn's: the sum given
        trained = sample.input_ids[sample.completion_mask.astype(bool)].tolist()
        assert trained and tokenizer.decode(trained).count("The sum is 42.") >= 1
    with calls.lock:
        assert calls.seen[:GENERATIONS] == [(20, 22)] * GENERATIONS  # tools ran on the bridge
    assert ANSWER.removesuffix("<|im_end|>") in tokenizer.decode(sampled[-1])


@pytest.mark.timeout(600)
def test_black_box_rollouts_are_scored(vllm: tuple[str, Any, list[list[int]]]) -> None:
    url, tokenizer, _ = vllm
    with ScriptedModelServer() as upstream:
        factory = functools.partial(
            HarnessSessionFactory,
            {"harness": "reference", "policy": "openai", "model": "m"},
            command=[sys.executable, str(TOKEN_AGENT), "plain"],
            capture=True,
            upstream=upstream.base_url,
            capture_tokens=True,
            reward_fn=reward,
            turn_timeout_s=180,
        )
        samples = run_worker_loop(tokenizer, url, harness_session_factory=factory)
        requests = [r.body for r in upstream.requests("chat")]
    assert len(samples) >= GENERATIONS
    for sample in samples:
        assert sample.metrics["rewards/harness_reward"] == 0.25  # reward_fn's ("you said: ...")
        assert sample.completion_mask.sum() > 0
    # The worker's training policy reached the upstream on every request (temperature 1.0).
    assert requests and all(body["temperature"] == 1.0 for body in requests)
