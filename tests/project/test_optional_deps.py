"""Optional dependencies: missing, or only a folder of the same name, is one clear ConfigError.

A folder named like a package (Ray's own ``/tmp/ray``, when Python runs in ``/tmp``)
imports as an empty namespace package when the package is not installed; the check
must say "install the extra", never fail later on a missing attribute.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gym_harness.errors import ConfigError
from gym_harness.utils.imports import import_optional

WORKTREE = Path(__file__).resolve().parents[2]
ABSENT = "gym_harness_absent_extra"  # a module no environment installs

#: Run in a directory that holds an empty ``ray/``: the installed Ray is hidden (a path
#: finder that looks in the working directory only), as if Ray were not installed.
WITHOUT_RAY = """
import importlib.machinery, json, os, sys

class NoInstalledRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            return importlib.machinery.PathFinder.find_spec(name, [os.getcwd()])
        return None

sys.meta_path.insert(0, NoInstalledRay())
from gym_harness.errors import ConfigError
from gym_harness.rollout.ray import RayVectorEnv
try:
    RayVectorEnv("gym_harness/Reference-v0", 1)
except ConfigError as exc:
    print(json.dumps({"error": str(exc), "ray": repr(sys.modules.get("ray"))}))
"""


@pytest.mark.timeout(60)
def test_a_stray_ray_folder_gives_the_config_error_that_names_the_extra(tmp_path: Path) -> None:
    (tmp_path / "ray").mkdir()
    env = {**os.environ, "PYTHONPATH": str(WORKTREE)}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["error"].startswith(
        "gym_harness.vector.ray needs ray: pip install 'gym_harness[ray]' (on every node)."
    )
    assert f"Only a folder named 'ray' was found ('{tmp_path / 'ray'}')" in report["error"]
    assert report["ray"] == "None"  # the namespace package is not left in sys.modules


def test_a_missing_package_names_its_extra() -> None:
    with pytest.raises(ConfigError) as exc:
        import_optional(ABSENT, extra="demo", what="gym_harness.demo")
    assert str(exc.value) == f"gym_harness.demo needs {ABSENT}: pip install 'gym_harness[demo]'."
    assert isinstance(exc.value.__cause__, ImportError)


def test_a_folder_of_the_same_name_is_not_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ABSENT).mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"pip install 'gym_harness\[demo\]'\. Only a folder"):
        import_optional(ABSENT, extra="demo", what="gym_harness.demo")
    assert ABSENT not in sys.modules


def test_a_module_without_the_api_used_is_not_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / f"{ABSENT}.py").write_text("VERSION = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, ABSENT, raising=False)
    try:
        with pytest.raises(ConfigError, match=r"lacks \['init'\]: another module"):
            import_optional(
                ABSENT, extra="demo", what="gym_harness.demo", needs=("VERSION", "init")
            )
        assert import_optional(ABSENT, extra="demo", what="x", needs=("VERSION",)).VERSION == 1
    finally:
        sys.modules.pop(ABSENT, None)


#: What ``import gym_harness`` must not load: the trainers and engines of the extras, and
#: the HTTP client the chat-completions policy makes on first use.
HEAVY = ("verl", "torch", "trl", "transformers", "ray", "bfcl_eval", "openenv", "vllm", "httpx2")
#: The package and the parts a user imports before any trainer or engine runs.
LIGHT_IMPORTS = """
import json, sys
import gym_harness, gym_harness.policies, gym_harness.rollout, gym_harness.rollout.cli
import gym_harness.training
policy = gym_harness.ChatCompletionsPolicy("http://127.0.0.1:9/v1", "m", temperature=0.5)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in sys.argv[1:])))
"""


@pytest.mark.timeout(60)
def test_import_gym_harness_loads_no_trainer_engine_or_http_client() -> None:
    env = {**os.environ, "PYTHONPATH": str(WORKTREE)}
    done = subprocess.run(
        [sys.executable, "-c", LIGHT_IMPORTS, *HEAVY],
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
