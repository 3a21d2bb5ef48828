"""The harness is confined: each escape a hostile harness tries is denied under
``sandbox="auto"`` (and ``"strict"``) and allowed under ``"off"``, as root and as an
unprivileged user; resource limits end a tree in bounded time; hidden task files reach
the reward function and never the harness; ``"strict"`` leaves no namespace behind.

Every escape is tried by one real harness (``tests/support/scripts/escaper.py``) through
``gymnasium.make``, in an owner process (``tests/support/scripts/escape_trial.py``) run
as the user under test.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import pytest
from support import SUPPORT
from support.process import namespaces_in_use, wait_gone
from support.users import owner_env, run_as

from gym_harness import ConfigError, HarnessEnv, Outcome
from gym_harness.process import sandbox

TRIAL = SUPPORT / "scripts" / "escape_trial.py"
ESCAPER = str(SUPPORT / "scripts" / "escaper.py")
#: What only root may do at all: "off" shows them allowed for root alone.
ROOT_ONLY = {"raw", "mount", "netns_env", "ptrace_env"}


@pytest.fixture(params=["root", "nobody"], scope="module")
def user(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[str], Path]]:
    """(name, argv prefix, a directory that user owns: its HOME and TMPDIR)."""
    with run_as(request.param) as (prefix, workdir):
        yield request.param, prefix, workdir


def trial(user: tuple[str, list[str], Path], tier: str) -> dict[str, Any]:
    _, prefix, workdir = user
    done = subprocess.run(
        [*prefix, sys.executable, str(TRIAL), tier],
        env=owner_env(workdir),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("tier", ["auto", "strict"])
def test_every_escape_is_denied(user: tuple[str, list[str], Path], tier: str) -> None:
    report = trial(user, tier)
    if tier == "strict" and user[0] == "nobody":
        assert "needs root" in report["error"]  # raised at construction, with the reason
        return
    assert "error" not in report, report
    escaped = {name for name, ok in report["attempts"].items() if ok}
    assert escaped == set(), {name: report["details"][name] for name in escaped}
    assert not report["planted"]
    assert report["reward"] == 1.0  # the reward function read the hidden file
    assert report["sandbox"]["missing"] == {}, report["sandbox"]  # all of it, on this kernel


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_off_allows_what_auto_denies(user: tuple[str, list[str], Path]) -> None:
    report = trial(user, "off")
    assert report["sandbox"] == {"tier": "off", "enforced": [], "missing": {}}
    privileged = user[0] == "root" and os.geteuid() == 0
    expected = set(report["attempts"]) - (set() if privileged else ROOT_ONLY)
    denied = {name for name in expected if not report["attempts"][name]}
    assert denied == set(), {name: report["details"][name] for name in denied}
    assert report["planted"] and report["reward"] == 1.0


def test_strict_says_why_it_cannot_be_had_and_auto_says_what_it_lacks() -> None:
    found = sandbox.report("auto")
    assert set(found) == {"tier", "enforced", "missing"}
    assert set(found["enforced"]) | set(found["missing"]) == {
        "capabilities",
        "filesystem",
        "tcp",
        "scoping",
        "seccomp",
        "mount_namespace",
    }
    with pytest.raises(ConfigError, match="sandbox must be one of"):
        HarnessEnv("command", command=[sys.executable, ESCAPER], sandbox="loose")


def escaper(**kwargs: Any) -> gymnasium.Env[str, str]:
    kwargs.setdefault("turn_timeout_s", 60)
    return gymnasium.make("gym_harness/Command-v0", command=[sys.executable, ESCAPER], **kwargs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tier", ["auto", "off"])
@pytest.mark.parametrize(
    ("limit", "attempt", "named"),
    [
        ({"memory_limit_mb": 64}, {"try": "alloc", "arg": 512}, "memory_limit_mb=64"),
        ({"max_processes": 16}, {"try": "forkbomb", "arg": 200}, "max_processes=16"),
    ],
)
def test_a_tree_past_its_limit_ends_its_turn(
    tier: str, limit: dict[str, int], attempt: dict[str, Any], named: str
) -> None:
    env = escaper(sandbox=tier, **limit)
    try:
        _, info = env.reset()
        assert info["error_type"] == ""
        harness = HarnessEnv.of(env).process
        assert harness is not None and harness.pid is not None
        _, _, terminated, truncated, info = env.step(json.dumps(attempt))
        assert (info["error_type"], terminated, truncated) == (Outcome.RESOURCE_LIMIT, True, False)
        assert named in info["error"]
        assert wait_gone([harness.pid], timeout_s=10) == []
        env.reset()  # the env is unaffected: a fresh episode runs
        reply, _, _, _, info = env.step(json.dumps({"try": "env", "arg": "HOME"}))
        assert info["error_type"] == "" and json.loads(reply)["ok"]
    finally:
        env.close()


@pytest.mark.timeout(120)
def test_strict_namespace_and_sockets_are_gone_after_close() -> None:
    if sandbox.report("strict")["missing"]:
        pytest.skip(f"strict is not available here: {sandbox.report('strict')['missing']}")
    env = escaper(sandbox="strict")
    try:
        env.reset()
        harness = HarnessEnv.of(env).process
        assert harness is not None and harness.pid is not None
        netns = os.stat(f"/proc/{harness.pid}/ns/net").st_ino
        assert netns != os.stat("/proc/self/ns/net").st_ino
        reply, *_ = env.step(json.dumps({"try": "env", "arg": "TMPDIR"}))
        tmp = Path(json.loads(reply)["detail"])
        assert tmp.is_dir() and tmp.parent == HarnessEnv.of(env).workspace.parent  # type: ignore[union-attr]
    finally:
        env.close()
    assert netns not in namespaces_in_use()
    assert not tmp.exists()
    assert f"net:[{netns}]" not in open_files()


def open_files() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
    return found
