"""The runnable example of the TRL docs runs: ``examples/trl_grpo.py --tiny`` trains two
GRPO steps on CPU through ``gym_harness.training.trl.rollout_func``, with the tiny model
the script builds (nothing downloaded), on the Reference agent in model mode.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "trl", reason="needs trl, torch and transformers: pip install 'gym_harness[train]'"
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo.py"


@pytest.mark.timeout(900)
def test_the_trl_example_trains_two_steps_on_cpu(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--tiny", "--output-dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=880,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()  # the example's JSON lines, beside TRL's own log lines
    logged = [json.loads(line) for line in lines if line.startswith('{"')]
    assert [entry["step"] for entry in logged if "loss" in entry] == [1, 2]
