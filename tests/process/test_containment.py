"""Hostile harnesses: no process of their tree survives stop(), close() or the owner's SIGKILL,
and no workspace survives the owner's death.

Each hostile tree (tests/support/scripts/harness.py: env_cleared, disguised, keeper_killer,
fork_storm) writes every one of its pids to a file, so the check does not depend on
anything the tree can hide. Tests that kill the owner run it as a subprocess
(tests/support/scripts/owner.py); where the machine allows, also as an unprivileged user
(uid 65534, through ``setpriv``), where no cgroup is writable and the keeper's
subreaper alone contains the tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import OWNER_SCRIPT
from support.process import SCRIPT, is_ready, namespaces_in_use, running, wait_gone
from support.users import owner_env, run_as

from gym_harness.config import HarnessConfig, ProcessSpec
from gym_harness.env import HarnessEnv
from gym_harness.process import procfs
from gym_harness.process.harness_process import HarnessProcess
from gym_harness.process.workspaces import remove_path
from gym_harness.readiness import start_ready

OWNER = OWNER_SCRIPT
HOSTILE = ["env_cleared", "disguised", "keeper_killer", "fork_storm"]
#: The acceptance bound: nothing of the tree is alive this long after stop/close/SIGKILL.
GONE_S = 2.0


def recorded(pidfile: Path) -> list[int]:
    return [int(word) for word in pidfile.read_text().split()]


def assert_tree_gone(pidfile: Path, at_least: int) -> None:
    pids = recorded(pidfile)
    assert len(pids) >= at_least, pids
    assert wait_gone(pids, timeout_s=GONE_S) == []


def hostile_config(mode: str, pidfile: Path, **changes: object) -> HarnessConfig:
    return HarnessConfig(
        command=(sys.executable, str(SCRIPT), mode, str(pidfile)),
        stop_grace_s=0.3,
        **changes,  # type: ignore[arg-type]
    )


def hostile_spec(mode: str, pidfile: Path, **changes: object) -> ProcessSpec:
    return hostile_config(mode, pidfile, **changes).process_spec()


MINIMUM = {"env_cleared": 2, "disguised": 3, "keeper_killer": 13, "fork_storm": 10}


def await_lost(proc: HarnessProcess, keeper: int) -> None:
    assert wait_gone([keeper], timeout_s=10) == []
    for _ in range(1000):  # bounded: 10 s
        if proc.keeper_lost:
            break
        time.sleep(0.01)
    assert proc.keeper_lost
    assert "keeper process died" in proc.stderr_tail()


# -- stop() and close() ------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "subreaper"])
@pytest.mark.parametrize("mode", HOSTILE)
def test_stop_ends_a_hostile_tree(mode: str, cgroup: bool, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    pidfile.touch()
    proc = HarnessProcess(hostile_spec(mode, pidfile, cgroup=cgroup))
    try:
        start_ready(proc, is_ready)
        keeper = proc.keeper_pid
        assert keeper is not None
        if mode == "keeper_killer":
            proc.write_line("kill your keeper", timeout_s=10)
            await_lost(proc, keeper)
    finally:
        proc.stop()
    assert_tree_gone(pidfile, MINIMUM[mode])
    assert wait_gone([keeper]) == []
    base = procfs.cgroup_base()
    if base is not None:  # its cgroup went with it (or none was made)
        assert not list(Path(base).glob(f"gym_harness-{keeper}-*"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", HOSTILE)
def test_close_ends_a_hostile_tree_and_its_workspace(mode: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    pidfile.touch()
    readers = _stderr_readers()
    # Unconfined: the tree writes its pids outside its workspace, and keeper_killer kills
    # its keeper; a confined harness may do neither (tests/process/test_sandbox.py).
    command = list(hostile_config(mode, pidfile).command)
    env = HarnessEnv("command", command=command, sandbox="off")
    try:
        env.reset(seed=0)
        assert env.workspace is not None and env.process is not None
        root = env.workspace.parent.parent
        if mode == "keeper_killer":
            _, _, terminated, _, info = env.step("kill your keeper")
            assert terminated and info["error_type"] == "harness_crashed"
            assert "keeper process died" in info["stderr_tail"]
    finally:
        env.close()
    assert_tree_gone(pidfile, MINIMUM[mode])
    assert not root.exists()
    # Nothing of the tree holds the stderr pipe open, so its reader thread ends.
    for _ in range(200):  # bounded: about 2 s
        if _stderr_readers() <= readers:
            break
        time.sleep(0.01)
    assert _stderr_readers() <= readers


def _stderr_readers() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "gym-harness-stderr")


def test_the_tree_gets_a_cgroup_of_its_own_where_one_is_writable(tmp_path: Path) -> None:
    base = procfs.cgroup_base()
    if base is None:
        pytest.skip("no writable cgroup v2 hierarchy here: the subreaper alone contains trees")
    pidfile = tmp_path / "pids"
    pidfile.touch()
    with HarnessProcess(hostile_spec("disguised", pidfile)) as proc:
        start_ready(proc, is_ready)
        groups = set()
        for pid in recorded(pidfile):
            with open(f"/proc/{pid}/cgroup") as f:
                groups.add(next(line for line in f if line.startswith("0::")).strip())
        assert len(groups) == 1, groups  # the whole tree, setsid and setpgid included
        path = base + groups.pop()[3:].removeprefix(_own_cgroup())
        assert "/gym_harness-" in path and os.path.isdir(path)
    assert not os.path.exists(path)  # removed with the tree
    assert_tree_gone(pidfile, MINIMUM["disguised"])


def _own_cgroup() -> str:
    with open("/proc/self/cgroup") as f:
        return next(line for line in f if line.startswith("0::"))[3:].strip().rstrip("/")


# -- the owner's death ---------------------------------------------------------------


@pytest.fixture(params=["root", "nobody"])
def owner_user(request: pytest.FixtureRequest) -> Iterator[tuple[list[str], Path]]:
    """(argv prefix, a directory that user may write) for an owner process."""
    with run_as(request.param) as found:
        yield found


class Owner:
    """tests/support/scripts/owner.py as a subprocess: its report, commands, and its SIGKILL."""

    def __init__(self, prefix: list[str], workdir: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, str(OWNER), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=owner_env(workdir),
        )
        try:
            self.report = self.read()
        except BaseException:
            self.kill()  # no process and no open pipe outlives a failed start
            raise

    def read(self) -> dict[str, object]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the owner exited with {self.proc.wait(timeout=10)}"
        data: dict[str, object] = json.loads(line)
        return data

    def ask(self, command: str) -> dict[str, object]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "subreaper"])
@pytest.mark.parametrize("mode", HOSTILE)
def test_owner_sigkill_ends_a_hostile_tree(
    mode: str, cgroup: bool, owner_user: tuple[list[str], Path]
) -> None:
    prefix, workdir = owner_user
    if prefix and cgroup:
        pytest.skip("an unprivileged owner has no cgroup to use: covered by 'subreaper'")
    pidfile = workdir / "pids"
    pidfile.touch()
    os.chmod(pidfile, 0o666)
    args = ["process", mode, str(pidfile), *([] if cgroup else ["--no-cgroup"])]
    owner = Owner(prefix, workdir, *args)
    try:
        keeper = int(owner.report["keeper"])  # type: ignore[call-overload]
        if mode == "keeper_killer":
            owner.ask("write kill your keeper")
            assert wait_gone([keeper], timeout_s=10) == []
            lost = owner.ask("lost")
            assert lost["keeper_lost"] and "keeper process died" in str(lost["tail"])
    finally:
        owner.kill()
    assert_tree_gone(pidfile, MINIMUM[mode])
    assert wait_gone([keeper], timeout_s=GONE_S) == []


@pytest.mark.timeout(90)
@pytest.mark.parametrize("tier", ["auto", "strict", "off"])
def test_owner_sigkill_mid_episode_leaves_no_workspace(
    owner_user: tuple[list[str], Path], tier: str
) -> None:
    prefix, workdir = owner_user
    if tier == "strict" and prefix:
        pytest.skip("sandbox='strict' needs root (an unprivileged owner gets a ConfigError)")
    owner = Owner(prefix, workdir, "env", tier)
    try:
        root = Path(str(owner.report["root"]))
        harness = int(owner.report["harness"])  # type: ignore[call-overload]
        netns = int(owner.report["netns"])  # type: ignore[call-overload]
        assert root.parent == workdir and root.is_dir() and running(harness)
        assert (netns != os.stat("/proc/self/ns/net").st_ino) == (tier == "strict")
    finally:
        owner.kill()
    assert wait_gone([harness], timeout_s=GONE_S) == []
    assert _workspaces_gone(workdir)  # its tmp, home and hidden files with it
    if tier == "strict":  # the namespace went with its last process and socket
        assert netns not in namespaces_in_use()


@pytest.mark.timeout(120)
def test_vector_close_terminate_leaves_no_workspace(owner_user: tuple[list[str], Path]) -> None:
    prefix, workdir = owner_user
    owner = Owner(prefix, workdir, "vector", "2")
    try:
        harnesses = [int(pid) for pid in owner.report["harnesses"]]  # type: ignore[attr-defined]
        assert len(harnesses) == 2 and len(list(workdir.glob("gym_harness-*"))) == 2
        assert owner.ask("terminate") == {"closed": True}  # workers get SIGTERM, no close()
        assert wait_gone(harnesses, timeout_s=GONE_S) == []
        assert _workspaces_gone(workdir)
    finally:
        owner.kill()


LOCK_AND_REMOVE = """
import os, sys
from pathlib import Path
from gym_harness.process.workspaces import remove_path
root = Path(sys.argv[1]) / "gym_harness-locked"
locked = root / "ep" / "workspace" / "locked" / "deeper"
locked.mkdir(parents=True)
(locked / "file").write_text("x")
locked.chmod(0o000)
locked.parent.chmod(0o500)
remove_path(root)
print(root.exists())
"""


def test_a_workspace_whose_permissions_a_harness_removed_is_still_deleted(
    owner_user: tuple[list[str], Path],
) -> None:
    prefix, workdir = owner_user
    if not prefix and os.geteuid() == 0:
        pytest.skip("root ignores permission bits: only an unprivileged user can show this")
    done = subprocess.run(
        [*prefix, sys.executable, "-c", LOCK_AND_REMOVE, str(workdir)],
        env=owner_env(workdir),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def _workspaces_gone(workdir: Path) -> bool:
    """True once no gym_harness-* directory is left in ``workdir`` (bounded wait)."""
    for _ in range(200):  # bounded: about 2 s
        if not list(workdir.glob("gym_harness-*")):
            return True
        time.sleep(0.01)
    return False


def test_removal_never_changes_the_mode_of_what_holds_the_tree(tmp_path: Path) -> None:
    """A tree whose own directory cannot be removed (here: a mount point, EBUSY) is
    emptied, and the directory above it keeps its mode (it may be the shared /tmp)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to make a mount point that cannot be removed")
    holder = tmp_path / "holder"
    tree = holder / "tree"
    tree.mkdir(parents=True)
    os.chmod(holder, 0o1777)
    subprocess.run(["mount", "-t", "tmpfs", "none", str(tree)], check=True, timeout=10)
    try:
        (tree / "inner").mkdir()
        (tree / "inner" / "file").write_text("x")
        remove_path(tree)
        assert os.stat(holder).st_mode & 0o7777 == 0o1777
        assert list(tree.iterdir()) == []  # emptied; only the mount point itself stayed
    finally:
        subprocess.run(["umount", str(tree)], check=True, timeout=10)


def test_the_disk_watch_counts_each_file_once_and_follows_no_link(tmp_path: Path) -> None:
    workspace, home, outside = tmp_path / "workspace", tmp_path / "home", tmp_path / "outside"
    for folder in (workspace / "deep", home, outside):
        folder.mkdir(parents=True)
    (workspace / "deep" / "a").write_bytes(os.urandom(1 << 16))
    os.link(workspace / "deep" / "a", home / "same_a")  # one file's blocks, twice in the tree
    (home / "b").write_bytes(os.urandom(1 << 16))
    (outside / "c").write_bytes(os.urandom(1 << 20))
    (workspace / "out").symlink_to(outside)
    roots = [str(workspace), str(home)]
    blocks = sum(
        os.lstat(path).st_blocks * 512
        for path in (workspace / "deep", workspace / "deep" / "a", workspace / "out", home / "b")
    )
    assert procfs.disk_bytes(roots, 1 << 30) == blocks
    assert blocks >= 1 << 17 and procfs.disk_bytes(roots, 1 << 10) > 1 << 10  # stops early


@pytest.mark.parametrize("tier", ["auto", "off"])
def test_the_harness_holds_none_of_its_keepers_descriptors(tier: str) -> None:
    """The keeper's socket to its owner (a way to ask it for an unconfined spawn) and its
    other descriptors stay the keeper's: the harness holds only what we gave it."""
    env = HarnessEnv("command", command=[sys.executable, str(SCRIPT), "echo"], sandbox=tier)
    try:
        env.reset()
        proc = env.process
        assert proc is not None and proc.pid is not None and proc.keeper_pid is not None

        def targets(pid: int) -> set[str]:  # its sockets and pipes (not files like /dev/null)
            found = set()
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            return {t for t in found if t.startswith(("socket:", "pipe:"))}

        keepers = targets(proc.keeper_pid)
        assert any(t.startswith("socket:") for t in keepers)
        assert targets(proc.pid) & keepers == set()
    finally:
        env.close()
