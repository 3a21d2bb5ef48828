"""Turn-mode forks of a live tree: the parent's harness churns its workspace meanwhile.

The harness (``support.churn``'s agent, a real line-protocol process) swaps directories
for links to a secret outside the workspace, grows a file past ``max_fork_bytes`` and
deletes and rewrites files, from its first answer on, while the env copies the
workspace for each fork. A fork either makes a child that holds no secret and no more
than the bound, or raises a ``ForkFailed`` naming the cause; a grouped rollout records
each failed fork as a ``fork_failed`` record and completes.
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from support.churn import SECRET, churning_agent, secret_outside

import gym_harness  # noqa: F401  (registers the env ids)
from gym_harness import ForkFailed, ForkUnsupported, HarnessEnv
from gym_harness.rollout import local_rollout
from gym_harness.tasks import load_tasks

pytestmark = pytest.mark.slow  # dozens of forks, each a harness process

LIMIT = 50_000
#: What a ``ForkFailed`` of a churned copy says: which copy, then the cause (an entry that
#: vanished, became a link or was replaced, or the tree grown past the bound).
FAILED = re.compile(
    r"could not copy episode \w+'s workspace and home for a fork: "
    r"(.* (vanished|became a symbolic link|was replaced)|the tree grew past max_fork_bytes=50000)"
    r".* while it was copied"
)


def files_under(root: Path) -> dict[str, bytes]:
    """The regular files under ``root`` and their bytes (links never followed)."""
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in root.rglob("*")
        if path.is_file() and not path.is_symlink() and not _under_link(path, root)
    }


def _under_link(path: Path, root: Path) -> bool:
    return any(parent.is_symlink() for parent in path.relative_to(root).parents if parent.name)


def test_forks_of_a_churning_workspace_follow_no_link_and_hold_no_more_than_the_bound(
    tmp_path: Path,
) -> None:
    command = churning_agent(secret_outside(tmp_path), LIMIT + 1)
    env = HarnessEnv("command", command=command, max_fork_bytes=LIMIT)
    seen: Counter[str] = Counter()
    try:
        env.reset(seed=0)
        assert env.step("start churning")[0] == "echo: start churning"
        for _ in range(40):
            try:
                child, obs, info = env.fork()
            except ForkFailed as exc:
                assert FAILED.search(str(exc)), str(exc)
                seen["failed"] += 1
            except ForkUnsupported as exc:  # the quick refusal saw grow.bin past the bound
                assert "more than max_fork_bytes=50000 bytes" in str(exc)
                seen["refused"] += 1
            else:
                try:
                    assert obs == "echo: start churning" and info["fork"]["method"] == "native"
                    assert child.workspace is not None
                    held = files_under(child.workspace)
                    assert not any(SECRET in content for content in held.values())
                    assert sum(len(content) for content in held.values()) <= LIMIT
                    assert child.step("child")[0] == "echo: child"
                finally:
                    child.close()
                seen["made"] += 1
            if seen["failed"] and seen["made"]:
                break
        assert seen["failed"] and seen["made"], seen
        assert env.step("the parent goes on")[0] == "echo: the parent goes on"
    finally:
        env.close()


def test_a_grouped_rollout_of_a_churning_harness_completes_with_fork_failed_records(
    tmp_path: Path,
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(f'{{"id": "t{n}", "prompt": "task {n}"}}\n' for n in range(3)))
    command = churning_agent(secret_outside(tmp_path), LIMIT + 1, tmp_files=100)
    out = io.StringIO()
    written = local_rollout(
        "gym_harness/Command-v0", {"command": command, "max_fork_bytes": LIMIT},
        load_tasks(tasks), n=1, seed=0, max_turns=2, follow_up="more", out=out,
        group=4, fork_at=1,
    )  # fmt: skip
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert written == len(records) == 12
    assert Counter(r["task_id"] for r in records) == {"t0": 4, "t1": 4, "t2": 4}
    failed = [r for r in records if r["outcome"] == "fork_failed"]
    for record in failed:
        assert record["error_type"] == "fork_failed" and record["fork_step"] == 1
        cause = record["error"]
        assert FAILED.search(cause) or "more than max_fork_bytes=50000" in cause, cause
    assert any(r["error"].startswith("ForkFailed: could not copy") for r in failed), records
    for record in records:
        if record["outcome"] != "fork_failed":
            assert (record["outcome"], record["error_type"]) == ("max_turns", ""), record
            assert [t["response"] for t in record["turns"]][-1] == "echo: more"
