"""The notebooks run top to bottom on the embedded reference harness (no network, no key).

Each is executed with nbclient in a real kernel (a child process, which spawns
envs, harnesses and vector workers of its own); the autouse guard then checks
that nothing is left behind. They are committed with outputs stripped.
"""

from __future__ import annotations

import html
import importlib
import json
import re
import sys
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CELL_TIMEOUT_S = 120
pytestmark = pytest.mark.slow  # a whole rollout or runtime per test

NAMES = ["quickstart.ipynb", "custom_tools_and_rewards.ipynb", "you_are_the_model.ipynb"]


def _execute(path: Path) -> object:
    nbclient = pytest.importorskip(
        "nbclient", reason="nbclient is not installed: pip install -e '.[notebooks]'"
    )
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed")
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    # The kernel is this interpreter (the one with gym_harness installed), not whatever
    # "python3" kernelspec the machine has registered.
    client.kernel_manager_class = _this_python_kernel_manager()
    client.execute()
    return notebook


def _this_python_kernel_manager() -> type:
    from jupyter_client.manager import KernelManager

    class ThisPython(KernelManager):
        def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
            cmd = super().format_kernel_cmd(extra_arguments)
            return [sys.executable, *cmd[1:]] if cmd and "python" in Path(cmd[0]).name else cmd

    return ThisPython


def _outputs(notebook: object) -> str:
    text = []
    for cell in notebook.cells:  # type: ignore[attr-defined]
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                text.append(f"ERROR {out.get('ename')}: {out.get('evalue')}")
            text.append(out.get("text", ""))
            data = out.get("data", {})
            text.append(data.get("text/plain", ""))
            text.append(data.get("text/html", ""))
            if "image/png" in data:
                text.append("<image/png>")
    return "\n".join(text)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_committed_stripped(name: str) -> None:
    notebook = json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{name}: commit notebooks with outputs stripped"
            assert cell.get("execution_count") is None, f"{name}: stray execution count"


@pytest.mark.timeout(600)
def test_quickstart_runs() -> None:
    out = _outputs(_execute(NOTEBOOKS / "quickstart.ipynb"))
    assert "add -> 5555" in out  # the demo task's tool call, through the bridge
    assert "tool_call" in out and "tool_result" in out  # events printed live by on_event
    assert "capital of japan" in out and "Tokyo" in out
    assert "<b>outcome</b>" in out  # the HTML transcript of Trajectory._repr_html_
    assert html.escape('{"a": 1234, "b": 4321}') in out  # tool arguments, escaped
    assert "<image/png>" in out  # the latency plot
    assert "env 1: reward=" in out  # the vector env section


@pytest.mark.timeout(600)
def test_custom_tools_and_rewards_runs() -> None:
    out = _outputs(_execute(NOTEBOOKS / "custom_tools_and_rewards.ipynb"))
    assert "THE ORCHESTRATOR CAN CALL TOOLS TOO" in out
    assert "solved 4/5" in out  # sum-wrong earns nothing; the other four do
    assert "mean-and-finish" in out and "done" in out
    assert "<b>outcome</b>" in out


@pytest.mark.timeout(600)
def test_you_are_the_model_runs() -> None:
    out = _outputs(_execute(NOTEBOOKS / "you_are_the_model.ipynb"))
    keys = (
        "['api', 'extends', 'messages', 'model', 'new_from', 'request_id', 'sampling', "
        "'stream', 'tools']"
    )
    assert f"observation keys: {keys}" in out
    assert "-> last message tool: " in out  # the tool really ran; its result came back
    assert "reward: 1.0" in out  # the scripted policy answered with the tool's result
    assert "token_ids=(1, 2, 3)" in out  # trajectory.calls keeps the action's token ids
    assert "done r=1.0" in out and "autoreset" in out  # the 4-env section
    assert "ERROR" not in out


#: Text the notebooks once said that the code no longer does.
STALE = ["shared_memory=False", "do not fit shared-memory", "do not fit shared memory"]


@pytest.mark.parametrize("name", NAMES)
def test_the_notebooks_text_names_only_what_exists(name: str) -> None:
    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert not [phrase for phrase in STALE if phrase in text]
    for dotted in set(re.findall(r"`(gym_harness(?:\.\w+)+)", text)):
        parts = dotted.split(".")
        found: object = importlib.import_module(parts[0])
        for part in parts[1:]:
            if not hasattr(found, part):
                found = importlib.import_module(f"{found.__name__}.{part}")  # type: ignore[attr-defined]
        assert found is not None, dotted
