"""Six ways out a hostile harness tried, each denied under ``sandbox="auto"`` and
``"strict"``: a unix socket it did not make (our own forkserver's too), the user's
``/dev/shm``, a terminal it was not given, a workspace template's link, memory held
outside its resident pages, and a disk it fills.

Each attempt is made by one real harness (``tests/support/scripts/escaper.py``) through
``gymnasium.make``; ``"off"`` shows that the attempt itself works where nothing stops it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import pytest
from support import SUPPORT
from support.process import wait_gone

from gym_harness import ConfigError, ForkFailed, HarnessEnv, HarnessStartError, Outcome

ESCAPER = str(SUPPORT / "scripts" / "escaper.py")
TIERS = ["auto", "strict"]
#: What a view's /dev holds: the devices by name, its own pts and shm, the usual links.
VIEW_DEV = {"null", "zero", "full", "random", "urandom", "pts", "shm", "ptmx", "fd", "stdin",
            "stdout", "stderr"}  # fmt: skip


def escaper(**kwargs: Any) -> gymnasium.Env[str, str]:
    kwargs.setdefault("turn_timeout_s", 60)
    return gymnasium.make("gym_harness/Command-v0", command=[sys.executable, ESCAPER], **kwargs)


def attempt(env: gymnasium.Env[str, str], what: str, arg: object = None) -> tuple[bool, str]:
    reply, _, _, _, info = env.step(json.dumps({"try": what, "arg": arg}))
    assert info["error_type"] == "", info
    answer = json.loads(reply)
    return bool(answer["ok"]), str(answer["detail"])


def refused(env: gymnasium.Env[str, str], what: str, arg: object = None) -> str:
    """What the harness said of an attempt that must fail."""
    ok, detail = attempt(env, what, arg)
    assert not ok, detail
    return detail


@pytest.fixture(scope="module", params=TIERS)
def confined(request: pytest.FixtureRequest) -> Iterator[gymnasium.Env[str, str]]:
    """One confined escaper per tier, reset, for the attempts that leave it running."""
    env = escaper(sandbox=request.param)
    try:
        env.reset()
        assert "mount_namespace" in HarnessEnv.of(env).trajectory.sandbox["enforced"]
        yield env
    finally:
        env.close()


@pytest.fixture
def outside_socket(tmp_path: Path) -> Iterator[str]:
    """A listening pathname unix socket of the test's, outside every workspace."""
    path = str(tmp_path / "outside.sock")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen()
        yield path


# ------------------------------------------------------------ 1. unix sockets


def test_a_unix_socket_outside_is_out_of_reach(
    confined: gymnasium.Env[str, str], outside_socket: str
) -> None:
    # No such path in its view.
    assert "FileNotFoundError" in refused(confined, "unix", outside_socket)


def test_no_listed_unix_socket_outside_answers(
    confined: gymnasium.Env[str, str], outside_socket: str
) -> None:
    assert "listed sockets answered" in refused(confined, "unix_scan")


def test_its_own_unix_sockets_work(confined: gymnasium.Env[str, str]) -> None:
    assert attempt(confined, "own_unix") == (True, "connected")


def test_off_reaches_the_socket_outside(outside_socket: str) -> None:
    env = escaper(sandbox="off")
    try:
        env.reset()
        assert attempt(env, "unix", outside_socket) == (True, "connected")
    finally:
        env.close()


#: Run in a process of its own (the forkserver and its resource tracker end with it): a
#: vector env whose one harness tries our forkserver's socket, one outside, and every
#: socket listed; prints each answer's ``ok``.
VECTOR_TRIAL = """
import json, multiprocessing.forkserver, os, socket, sys, tempfile
import gymnasium
import gym_harness
context, tier, escaper = sys.argv[1:4]
outside = os.path.join(tempfile.mkdtemp(), "outside.sock")
server = socket.socket(socket.AF_UNIX)
server.bind(outside)
server.listen()
envs = gymnasium.make_vec("gym_harness/Command-v0", num_envs=1, vectorization_mode="async",
    vector_kwargs={"context": context}, command=[sys.executable, escaper], sandbox=tier,
    turn_timeout_s=60)
try:
    envs.reset()
    tries = {"outside": {"try": "unix", "arg": outside}}
    if context == "forkserver":
        address = multiprocessing.forkserver._forkserver._forkserver_address
        assert address and os.path.exists(address), address
        tries["forkserver"] = {"try": "unix", "arg": address}
    # Last, since a bare connect ends an unconfined forkserver. Unconfined, the scan keeps
    # to sockets named like ours: every listed one would reach other tests' forkservers.
    tries["scan"] = {"try": "unix_scan", "arg": "/outside.sock" if tier == "off" else ""}
    found = {}
    for name, action in tries.items():
        reply, *_ = envs.step([json.dumps(action)])
        found[name] = json.loads(reply[0])
finally:
    envs.close()
    server.close()
print(json.dumps(found))
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("context", ["forkserver", "spawn"])
@pytest.mark.parametrize("tier", [*TIERS, "off"])
def test_a_vector_env_s_harness_reaches_no_socket_of_ours(context: str, tier: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", VECTOR_TRIAL, context, tier, ESCAPER],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"outside", "scan"} <= set(found)
    assert ("forkserver" in found) is (context == "forkserver")
    assert "listed sockets answered" in found["scan"]["detail"] or found["scan"]["ok"], found
    reached = {name for name, answer in found.items() if answer["ok"]}
    assert reached == (set(found) if tier == "off" else set()), found


# ------------------------------------------------------------ 2. /dev by name


def test_the_user_s_dev_shm_is_out_of_reach(confined: gymnasium.Env[str, str]) -> None:
    fd, path = tempfile.mkstemp(dir="/dev/shm", prefix="gym-harness-secret-")
    try:
        os.write(fd, b"secret")
        assert "FileNotFoundError" in refused(confined, "read", path)
    finally:
        os.close(fd)
        os.unlink(path)


def test_dev_holds_the_granted_devices_by_name(confined: gymnasium.Env[str, str]) -> None:
    ok, names = attempt(confined, "list_dev")
    assert ok and set(names.split()) == VIEW_DEV
    assert attempt(confined, "read", "/dev/urandom")[0]
    assert attempt(confined, "write", "/dev/null") == (True, "written")
    # Nothing is made in its /dev.
    assert "PermissionError" in refused(confined, "write", "/dev/planted")
    assert attempt(confined, "posix_shm") == (True, "shared")  # a /dev/shm of its own


@pytest.mark.parametrize("tier", TIERS)
def test_an_episode_reaches_nothing_of_the_one_before(tier: str) -> None:
    """Spawns of one env share its view's read-only part (mounted once): an episode's
    writable paths are its own spawn's, gone from the next episode's view."""
    env = escaper(sandbox=tier)
    try:
        env.reset()
        first = HarnessEnv.of(env).workspace
        assert first is not None
        assert attempt(env, "write", str(first / "mine")) == (True, "written")
        env.reset()
        second = HarnessEnv.of(env).workspace
        assert second is not None and second != first
        assert "FileNotFoundError" in refused(env, "read", str(first / "mine"))
        assert attempt(env, "write", str(second / "mine")) == (True, "written")
        assert attempt(env, "read", str(second / "mine")) == (True, "planted")
    finally:
        env.close()


# ------------------------------------------------------------ 3. terminals


def test_a_terminal_it_was_not_given_is_out_of_reach(confined: gymnasium.Env[str, str]) -> None:
    leader, follower = os.openpty()
    try:
        assert "FileNotFoundError" in refused(confined, "tty", os.ttyname(follower))
    finally:
        os.close(leader)
        os.close(follower)


def test_its_own_terminal_works_and_tiocsti_is_denied(confined: gymnasium.Env[str, str]) -> None:
    ok, got = attempt(confined, "own_pty")
    assert ok and "mine" in got
    assert "Operation not permitted" in refused(confined, "tiocsti")


# ------------------------------------------------------------ 4. template links


@pytest.mark.parametrize("tier", TIERS)
def test_a_template_link_out_is_refused_naming_it(tier: str, tmp_path: Path) -> None:
    template, outside = tmp_path / "template", tmp_path / "outside"
    template.mkdir()
    outside.mkdir()
    (template / "src").symlink_to(outside)
    tasks = [{"id": "t", "prompt": "p", "files": {"src/planted.py": "x"}}]
    env = escaper(sandbox=tier, workspace=str(template), tasks=tasks)
    try:
        with pytest.raises(ConfigError, match=r"the link .*src' leads out of the template"):
            env.reset()
    finally:
        env.close()
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("tier", TIERS)
def test_task_files_are_never_written_through_a_link(tier: str, tmp_path: Path) -> None:
    template = tmp_path / "template"
    (template / "inner").mkdir(parents=True)
    (template / "src").symlink_to("inner")  # inside the template: kept
    through = {"id": "t", "prompt": "p", "files": {"src/planted.py": "x", "ok.txt": "y"}}
    env = escaper(sandbox=tier, workspace=str(template), tasks=[through])
    try:
        with pytest.raises(ConfigError, match=r"'src' in the workspace is a link"):
            env.reset()
    finally:
        env.close()
    beside = {"id": "t", "prompt": "p", "files": {"ok.txt": "y"}}
    env = escaper(sandbox=tier, workspace=str(template), tasks=[beside])
    try:
        env.reset()
        workspace = HarnessEnv.of(env).workspace
        assert workspace is not None and (workspace / "src").is_symlink()
        assert (workspace / "ok.txt").read_text() == "y"
    finally:
        env.close()
    assert list((template / "inner").iterdir()) == []


# ------------------------------------------------------------ 5, 6. memory, disk


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize(
    ("limit", "what", "named"),
    [
        ({"memory_limit_mb": 150}, "memfd", "memory_limit_mb=150"),
        ({"memory_limit_mb": 150}, "shm", "memory_limit_mb=150"),
        ({"max_workspace_bytes": 64 << 20}, "fill", f"max_workspace_bytes={64 << 20}"),
    ],
)
def test_memory_and_disk_held_any_way_end_the_turn(
    tier: str, limit: dict[str, int], what: str, named: str
) -> None:
    env = escaper(sandbox=tier, **limit)
    try:
        env.reset()
        harness = HarnessEnv.of(env).process
        assert harness is not None and harness.pid is not None
        _, _, terminated, truncated, info = env.step(json.dumps({"try": what, "arg": 600}))
        assert (info["error_type"], terminated, truncated) == (Outcome.RESOURCE_LIMIT, True, False)
        assert named in info["error"]
        assert wait_gone([harness.pid], timeout_s=10) == []
    finally:
        env.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_a_full_disk_at_reset_is_a_clear_error(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "none", str(small)], check=True)
    try:
        tasks = [{"id": "big", "prompt": "p", "files": {"big.txt": "x" * (2 << 20)}}]
        env = escaper(tasks=tasks, env={"TMPDIR": str(small)})
        old, tempfile.tempdir = tempfile.tempdir, str(small)
        try:
            with pytest.raises(HarnessStartError, match="the disk holding the workspaces is full"):
                env.reset()
        finally:
            tempfile.tempdir = old
            env.close()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_a_full_disk_at_a_fork_is_a_clear_error(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "none", str(small)], check=True)
    old, tempfile.tempdir = tempfile.tempdir, str(small)
    try:
        tasks = [{"id": "big", "prompt": "p", "files": {"big.txt": "x" * (1200 << 10)}}]
        env = escaper(tasks=tasks)
        try:
            env.reset()
            assert attempt(env, "env", "HOME")[0]
            full = r"(episode's directories|workspace and home).*(No space left|disk .* is full)"
            with pytest.raises(ForkFailed, match=full):
                HarnessEnv.of(env).fork()
        finally:
            env.close()
    finally:
        tempfile.tempdir = old
        subprocess.run(["umount", "-l", str(small)], check=True)
