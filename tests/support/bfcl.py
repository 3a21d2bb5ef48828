"""The BFCL suite's episode runner: one model-mode episode answered by a policy."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from gym_harness.suites.bfcl import BFCLEnv, BFCLTask, GroundTruthPolicy

__all__ = ["play"]


def play(
    env: BFCLEnv, task: BFCLTask, policy: Callable[[dict[str, Any]], Any] | None = None
) -> tuple[float, dict[str, Any], list[dict[str, Any]]]:
    """One model-mode episode of ``task``, each model call answered by ``policy`` (the
    ground truth by default). Returns the last reward, the last info and every request."""
    answer = policy or GroundTruthPolicy(task)
    obs, info = env.reset(options={"task_id": task.id})
    assert info["error_type"] == "", info
    requests = []
    for _ in range(200):
        request = json.loads(obs)
        requests.append(request)
        obs, reward, terminated, truncated, info = env.step(json.dumps(answer(request)))
        if terminated or truncated:
            return float(reward), info, requests
    raise AssertionError(f"{task.id}: the episode did not end in 200 steps")
