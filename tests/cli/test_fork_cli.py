"""HarnessEnv.fork in model mode with the real CLIs: replay to the parent's third call.

Each CLI runs through ``HarnessEnv(<name>, mode="model")`` in the loopback-only
namespace; the test is the model. The parent's first answer calls the env tool ``add``,
its second has the CLI write a file with its own file tool; the fork replays both into a
fresh CLI in a fresh workspace (which the replay rebuilds), and parent and child then
write different files and end. Real CLIs are slow: run them one at a time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import CLIS, Calls, cli_path, real_cli

from gym_harness import HarnessEnv
from gym_harness.harnesses.codex import CodexHarness

PROMPT = "please add 20 and 22 with the add tool, then write a file"


def _patch(path: Path, text: str) -> dict[str, Any]:
    return {"input": f"*** Begin Patch\n*** Add File: {path.name}\n+{text}\n*** End Patch\n"}


#: Per harness name: its file-writing tool, and that tool's arguments for (path, text).
WRITERS: dict[str, tuple[str, Callable[[Path, str], dict[str, Any]]]] = {
    "claude_code": ("Write", lambda p, t: {"file_path": str(p), "content": t}),
    "codex": ("apply_patch", _patch),
    "opencode": ("write", lambda p, t: {"filePath": str(p), "content": t}),
    "qwen_code": ("write_file", lambda p, t: {"file_path": str(p), "content": t}),
    "gemini_cli": ("write_file", lambda p, t: {"file_path": str(p), "content": t}),
}
#: Per harness name: what its adapter needs to let the file tool run unasked.
CHANGES: dict[str, dict[str, Any]] = {
    "claude_code": {"allowed_tools": ["Write"]},
    "qwen_code": {"extra_args": ["--approval-mode", "yolo"]},
    "gemini_cli": {"extra_args": ["--approval-mode", "yolo"]},
}


def as_child(value: Any, parent: Path, child: Path) -> Any:
    """``value`` with the parent's episode directory made the child's: as a path, and in
    the dashed form a CLI names its project directory by."""
    text = json.dumps(value)
    for old, new in ((str(parent.parent), str(child.parent)),):
        text = text.replace(old, new).replace(
            re.sub("[^A-Za-z0-9]", "-", old), re.sub("[^A-Za-z0-9]", "-", new)
        )
    return json.loads(text)


def quiet(value: Any, noise: tuple[str, ...]) -> str:
    text = json.dumps(value)
    for pattern in noise:
        text = re.sub(pattern, "", text)
    return text


def tool_names(observation: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in observation["tools"]]


def call(name: str, arguments: Any) -> str:
    return json.dumps({"content": "", "tool_calls": [{"name": name, "arguments": arguments}]})


def write(cli: str, env: HarnessEnv, name: str, text: str) -> str:
    tool, arguments = WRITERS[cli]
    assert env.workspace is not None
    return call(tool, arguments(env.workspace / name, text))


def step(env: HarnessEnv, action: str) -> dict[str, Any]:
    obs, _, terminated, truncated, info = env.step(action)
    assert (terminated, truncated, info["error_type"]) == (False, False, ""), info
    return dict(json.loads(obs))


def finish(env: HarnessEnv, cli: str, name: str, text: str) -> None:
    step(env, write(cli, env, name, text))
    _, _, terminated, truncated, info = env.step(f"I wrote {name}.")
    assert (terminated, truncated, info["error_type"]) == (True, False, ""), info


@real_cli(timeout=600)
@pytest.mark.parametrize("cli", list(CLIS))
def test_a_cli_forked_at_call_3_replays_its_tools_and_files(cli: str, make_env: Any) -> None:
    calls = Calls()
    # Codex's own sandbox cannot start inside the env's confinement (which still holds).
    harness = (
        CodexHarness(
            model="m1", executable=cli_path(CLIS["codex"][0]), sandbox="danger-full-access"
        )
        if cli == "codex"
        else None
    )
    env = make_env(
        calls,
        PROMPT,
        harness=harness,
        turn_timeout_s=180,
        idle_timeout_s=120,
        **CHANGES.get(cli, {}),
    )
    child = None
    try:
        obs, info = env.reset(seed=0)
        assert info["error_type"] == "", info
        first = json.loads(obs)
        tool = next(n for n in tool_names(first) if n.endswith("add") and "env" in n)
        assert WRITERS[cli][0] in tool_names(first), tool_names(first)
        step(env, call(tool, {"a": 20, "b": 22}))
        third = step(env, write(cli, env, "shared.txt", "written before the fork"))
        assert env.workspace is not None
        assert (env.workspace / "shared.txt").read_text().strip() == "written before the fork"
        assert calls.seen == [(20, 22)]
        before = env.trajectory.to_dict()

        child, child_obs, info = env.fork()
        assert info["fork"]["replayed"] == 3, info["fork"]
        assert info["fork"]["diverged_at"] is None, info["fork"]["difference"]
        seen = json.loads(child_obs)
        assert child.workspace is not None and child.workspace != env.workspace
        noise = env.harness.replay_noise  # what the CLI varies itself (Codex: wall times)
        assert quiet(seen["messages"], noise) == quiet(
            as_child(third["messages"], env.workspace, child.workspace), noise
        )
        assert seen["tools"] == as_child(third["tools"], env.workspace, child.workspace)
        assert seen["request_id"] != third["request_id"]
        assert calls.seen == [(20, 22), (20, 22)]  # the child's CLI ran the env tool again
        assert (child.workspace / "shared.txt").read_text().strip() == "written before the fork"

        finish(child, cli, "mine.txt", "the child's")
        assert env.trajectory.to_dict() == before  # the child changed nothing of the parent's
        finish(env, cli, "mine.txt", "the parent's")
        assert (env.workspace / "mine.txt").read_text().strip() == "the parent's"
        assert (child.workspace / "mine.txt").read_text().strip() == "the child's"
        assert child.trajectory.forked_from == {"episode_id": before["episode_id"], "step": 2}
    finally:
        if child is not None:
            child.close()
        env.close()
