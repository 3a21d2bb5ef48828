"""``import gym_harness`` loads no verl, torch or Ray; without verl, ``gym_harness.verl``
names the extra to install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKTREE = Path(__file__).resolve().parents[2]
HEAVY = ("verl", "torch", "transformers", "trl", "ray", "hydra", "omegaconf", "tensordict")

LOADED = f"""
import json, sys
import gym_harness, gym_harness.training, gym_harness.training.trl
env = gym_harness.HarnessEnv("reference", mode="model")
env.close()
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))))
"""

#: Hides any installed verl (a finder that finds no ``verl``), then imports the part.
WITHOUT_VERL = """
import json, sys

class NoVerl:
    def find_spec(self, name, path=None, target=None):
        if name == "verl" or name.startswith("verl."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoVerl())
from gym_harness.errors import ConfigError
try:
    import gym_harness.verl
except ConfigError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def _run(code: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(WORKTREE)},
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.timeout(120)
def test_import_gym_harness_loads_no_verl_torch_or_ray(tmp_path: Path) -> None:
    assert json.loads(_run(LOADED, tmp_path)) == []


@pytest.mark.timeout(120)
def test_without_verl_the_part_names_its_extra(tmp_path: Path) -> None:
    report = json.loads(_run(WITHOUT_VERL, tmp_path))
    assert report["error"].startswith(
        "gym_harness.verl needs verl: pip install 'gym_harness[verl]'"
    )
