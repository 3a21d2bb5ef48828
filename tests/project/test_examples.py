"""The runnable example of the README's "Training with TRL" runs, up to TRL's trainer.

``examples/trl_grpo.py --dry-run`` builds the ``rollout_func`` with OpenEnv's own
``build_harness_rollout_func`` and calls it as TRL does, on the Reference agent in model
mode with a scripted policy; the trainer itself (torch, a model, a vLLM server) is not run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openenv.core.harness")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo.py"


@pytest.mark.timeout(300)
def test_the_trl_example_runs_up_to_the_trainer() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(rows) == 2
    for row in rows:  # two model steps each: the tool call, then the answer
        assert row["prompt_ids"] == [1, 2, 3, 4, 8, 9, 10, 11]
        assert row["completion_ids"] == [5, 6, 7, 12, 13, 14]
        assert row["logprobs"] == [-0.5] * 6
        assert row["env_reward"] == 1.0
