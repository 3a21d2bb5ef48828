"""Kernel confinement (``gym_harness/process/confine.py``) proven in real children.

Each run starts ``support/scripts/confined_probe.py``, which loads the module by file
path (as the keeper does), confines itself with a policy, tries a list of operations
and prints what happened. Every operation runs twice, unconfined and confined, so a
denial is shown to come from the confinement and not from the machine: the baseline
must succeed (or fail differently) for the test to mean anything.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import CONFINED_PROBE

from gym_harness.process import confine

MODULE = Path(confine.__file__).resolve()
NOBODY = 65534
CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
AF_INET, AF_INET6, AF_UNIX, AF_NETLINK, AF_PACKET = 2, 10, 1, 16, 17
SOCK_STREAM, SOCK_DGRAM, SOCK_RAW = 1, 2, 3
IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_MPTCP = 1, 6, 262
X86_64 = os.uname().machine == "x86_64"
DEVICES = ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/tty", "/dev/pts", "/dev/ptmx"]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the baseline uses it)")
OFFERED = confine.probe()
needs_landlock = pytest.mark.skipif(
    not OFFERED["scope"], reason=f"needs Landlock ABI 6, not {OFFERED['landlock_abi']}"
)
needs_seccomp = pytest.mark.skipif(not OFFERED["seccomp"], reason="no seccomp filter here")
pytestmark = [needs_landlock, needs_seccomp]


def run_probe(job: dict[str, object]) -> dict[str, object]:
    """Run the probe with ``job``; its outcomes by key."""
    done = subprocess.run(
        [sys.executable, str(CONFINED_PROBE)],
        input=json.dumps({"module": str(MODULE), **job}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class World:
    """What the probes act on: directories, listeners, a process to ptrace."""

    def __init__(self) -> None:
        # Under /tmp, not pytest's 0700 tree: the uid-65534 runs must reach it.
        self.base = Path(tempfile.mkdtemp(prefix="gym-confine-"))
        self.base.chmod(0o755)
        self.ro, self.rw, self.out = self.base / "ro", self.base / "rw", self.base / "out"
        for folder, mode in ((self.ro, 0o755), (self.rw, 0o777), (self.out, 0o755)):
            folder.mkdir()
            folder.chmod(mode)
            (folder / "file.txt").write_text("data")
            (folder / "file.txt").chmod(0o666)
        (self.out / "granted.txt").write_text("granted")
        (self.out / "granted.txt").chmod(0o644)
        shutil.copy("/usr/bin/true", self.out / "true")
        self.listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
        self.allowed, self.denied = (s.getsockname()[1] for s in self.listeners)
        self.bind_allowed, self.bind_denied = free_port(), free_port()
        self.abstract_name = f"gym-confine-{os.getpid()}"
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind("\0" + self.abstract_name)
        self.abstract.listen()
        self.target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])

    def policy(self, **changes: object) -> dict[str, object]:
        """The confined policy: the system read-only, ``rw`` writable, one port each."""
        read = ["/usr", "/lib", "/lib64", "/bin", "/etc", "/proc", sys.prefix, sys.base_prefix]
        read += [str(self.ro), str(self.out / "granted.txt"), "/nonexistent/skipped"]
        policy: dict[str, object] = {
            "read": read,
            "write": [str(self.rw)],
            "devices": [d for d in DEVICES if d != "/dev/zero"],
            "connect": [self.allowed],
            "bind": [self.bind_allowed],
            "scope": True,
            "seccomp": True,
            "drop_caps": True,
        }
        policy.update(changes)
        return policy

    def close(self) -> None:
        self.target.kill()
        self.target.wait(timeout=10)
        for sock in [*self.listeners, self.abstract]:
            sock.close()
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    made = World()
    try:
        yield made
    finally:
        made.close()


def main_ops(w: World) -> list[list[object]]:
    """(key, op, args...) for the main matrix; each key is one row of EXPECTED."""
    ops: list[list[object]] = [
        ["read_inside", "read", w.ro / "file.txt"],
        ["read_outside", "read", w.out / "file.txt"],
        ["read_granted_file", "read", w.out / "granted.txt"],
        ["listdir_outside", "listdir", w.out],
        ["write_inside", "write", w.rw / "new.txt"],
        ["write_read_only", "write", w.ro / "new.txt"],
        ["write_outside", "write", w.out / "new.txt"],
        ["symlink_escape", "symlink", w.out / "file.txt", w.rw / "link"],
        ["hardlink_escape", "link", w.out / "file.txt", w.rw / "hard"],
        ["rename_out", "rename", w.rw / "file.txt", w.out / "moved.txt"],
        ["truncate_outside", "truncate", w.out / "file.txt"],
        ["device_granted", "write", "/dev/null"],
        ["device_not_granted", "read", "/dev/zero"],
        ["exec_system", "exec", "/usr/bin/true"],
        ["exec_outside", "exec", w.out / "true"],
        ["connect_allowed", "connect", w.allowed],
        ["connect_denied", "connect", w.denied],
        ["bind_allowed", "bind", w.bind_allowed],
        ["bind_denied", "bind", w.bind_denied],
        ["fastopen_denied_port", "fastopen", w.denied],
        ["udp", "socket", AF_INET, SOCK_DGRAM, 0],
        ["udp6", "socket", AF_INET6, SOCK_DGRAM, 0],
        ["mptcp", "socket", AF_INET, SOCK_STREAM, IPPROTO_MPTCP],
        ["tcp_by_protocol", "socket", AF_INET6, SOCK_STREAM, IPPROTO_TCP],
        ["unix_socket", "socket", AF_UNIX, SOCK_STREAM, 0],
        ["netlink_socket", "socket", AF_NETLINK, SOCK_RAW, 0],
        ["abstract_unix", "abstract", w.abstract_name],
        ["kill_parent", "kill", os.getpid()],
        ["environ_parent", "read", f"/proc/{os.getpid()}/environ"],
        ["thread", "thread"],
        ["node_worker", "node_worker"],
        ["caps", "caps"],
    ]
    if os.geteuid() == 0:
        ops += [
            ["raw_socket", "socket", AF_INET, SOCK_RAW, IPPROTO_ICMP],
            ["packet_socket", "socket", AF_PACKET, SOCK_RAW, 0],
            ["ptrace_other", "ptrace", w.target.pid],
            ["mount", "mount", w.base / "missing"],
            ["unshare_net", "unshare", CLONE_NEWNET],
            ["clone_new_net", "clone", CLONE_NEWNET],
        ]
    ops.append(["clone3", "clone3"])
    if X86_64:
        ops += [["x32_getpid", "syscall", 0x40000000 + 39], ["i386_entry", "int80"]]
    return [[str(part) if isinstance(part, Path) else part for part in op] for op in ops]


#: key -> (unconfined outcome, confined outcome); "!EPERM" = anything but EPERM.
EXPECTED: dict[str, tuple[object, object]] = {
    "read_inside": ("ok", "ok"),
    "read_outside": ("ok", "EACCES"),
    "read_granted_file": ("ok", "ok"),
    "listdir_outside": ("ok", "EACCES"),
    "write_inside": ("ok", "ok"),
    "write_read_only": ("ok", "EACCES"),
    "write_outside": ("ok", "EACCES"),
    "symlink_escape": ("ok", "EACCES"),
    "hardlink_escape": ("ok", "EXDEV"),
    "rename_out": ("ok", "EACCES"),
    "truncate_outside": ("ok", "EACCES"),
    "device_granted": ("ok", "ok"),
    "device_not_granted": ("ok", "EACCES"),
    "exec_system": (0, 0),
    "exec_outside": (0, "EACCES"),
    "connect_allowed": ("ok", "ok"),
    "connect_denied": ("ok", "EACCES"),
    "bind_allowed": ("ok", "ok"),
    "bind_denied": ("ok", "EACCES"),
    "fastopen_denied_port": ("ok", "EPERM"),
    "udp": ("ok", "EPERM"),
    "udp6": ("ok", "EPERM"),
    "mptcp": ("ok", "EPERM"),
    "tcp_by_protocol": ("ok", "ok"),
    "unix_socket": ("ok", "ok"),
    "netlink_socket": ("ok", "ok"),
    "abstract_unix": ("ok", "EPERM"),
    "kill_parent": ("ok", "EPERM"),
    "environ_parent": ("ok", "EACCES"),
    "thread": ("ok", "ok"),
    "node_worker": ("42", "42"),
    "raw_socket": ("ok", "EPERM"),
    "packet_socket": ("ok", "EPERM"),
    "ptrace_other": ("ok", "EPERM"),
    "mount": ("ENOENT", "EPERM"),  # the filter answers before the path is looked up
    "unshare_net": ("ok", "EPERM"),
    "clone_new_net": ("ok", "EPERM"),
    "clone3": ("EINVAL", "ENOSYS"),
    "x32_getpid": ("!EPERM", "EPERM"),
    "i386_entry": ("ok", "signal 31"),  # SIGSYS: another architecture's call kills
}


@pytest.fixture(scope="module")
def root_runs(world: World) -> tuple[dict[str, object], dict[str, object]]:
    """The main matrix as this test's user: (unconfined, confined)."""
    ops = main_ops(world)
    free = run_probe({"policy": None, "ops": ops})
    for leftover in ("new.txt", "link", "hard"):
        for folder in (world.ro, world.rw, world.out):
            (folder / leftover).unlink(missing_ok=True)
    (world.out / "moved.txt").rename(world.rw / "file.txt")  # the baseline's rename, undone
    ops.append(["ptrace_parent", "ptrace", os.getpid()])  # never unconfined: it would stop us
    confined = run_probe({"policy": world.policy(), "ops": ops})
    return free, confined


#: Rows whose baseline some kernels cannot run (no i386 entry, no user namespaces).
MAY_BE_MISSING = ("i386_entry", "user_namespace")


def check_row(
    runs: tuple[dict[str, object], dict[str, object]],
    expected: dict[str, tuple[object, object]],
    key: str,
) -> None:
    """The baseline and the confined run of ``key`` came out as ``expected`` says."""
    free, confined = runs
    if key not in free:
        pytest.skip(f"{key} is not run here (root or x86_64 only)")
    if key in MAY_BE_MISSING and free[key] != "ok":
        pytest.skip(f"{key} cannot run here even unconfined ({free[key]})")
    outcomes = (free[key], confined[key])
    for run, outcome, want in zip(("baseline", "confined"), outcomes, expected[key], strict=True):
        if isinstance(want, str) and want.startswith("!"):
            assert outcome != want[1:], f"{run} {key}: {outcome!r}"
        else:
            assert outcome == want, f"{run} {key}: {outcome!r}"


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_unconfined_succeeds_and_confined_is_denied(
    root_runs: tuple[dict[str, object], dict[str, object]], key: str
) -> None:
    check_row(root_runs, EXPECTED, key)


def test_confined_cannot_ptrace_its_parent(
    root_runs: tuple[dict[str, object], dict[str, object]],
) -> None:
    assert root_runs[1]["ptrace_parent"] == "EPERM"


@needs_root
def test_root_keeps_no_capability_after_exec(
    root_runs: tuple[dict[str, object], dict[str, object]],
) -> None:
    free, confined = root_runs
    assert free["caps"]["CapEff"] != "0" * 16  # type: ignore[index]
    zero = "0" * 16
    assert confined["caps"] == {
        "CapInh": zero,
        "CapPrm": zero,
        "CapEff": zero,
        "CapBnd": zero,
        "CapAmb": zero,
    }


@pytest.fixture(scope="module")
def nobody_runs(world: World) -> tuple[dict[str, object], dict[str, object]]:
    """The probe switched to uid 65534 after prepare() (as the keeper's child would)."""
    if os.geteuid() != 0:
        pytest.skip("switching to uid 65534 needs root")
    for folder in (world.base, *world.base.parents):
        if not folder.stat().st_mode & 0o001:
            pytest.skip(f"uid 65534 cannot reach the test tree: {folder} is not o+x")
    ops: list[list[object]] = [
        ["read_inside", "read", str(world.ro / "file.txt")],
        ["read_outside", "read", str(world.out / "file.txt")],
        ["write_inside", "write", str(world.rw / "nobody.txt")],
        ["write_outside", "write", str(world.out / "file.txt")],
        ["exec_system", "exec", "/usr/bin/true"],
        ["connect_allowed", "connect", world.allowed],
        ["connect_denied", "connect", world.denied],
        ["udp", "socket", AF_INET, SOCK_DGRAM, 0],
        ["user_namespace", "unshare", CLONE_NEWUSER | CLONE_NEWNET],
        ["thread", "thread"],
        ["node_worker", "node_worker"],
        ["caps", "caps"],
    ]
    free = run_probe({"policy": None, "uid": NOBODY, "ops": ops})
    (world.rw / "nobody.txt").unlink(missing_ok=True)
    confined = run_probe({"policy": world.policy(), "uid": NOBODY, "ops": ops})
    return free, confined


NOBODY_EXPECTED: dict[str, tuple[object, object]] = {
    "read_inside": ("ok", "ok"),
    "read_outside": ("ok", "EACCES"),
    "write_inside": ("ok", "ok"),
    "write_outside": ("ok", "EACCES"),
    "exec_system": (0, 0),
    "connect_allowed": ("ok", "ok"),
    "connect_denied": ("ok", "EACCES"),
    "udp": ("ok", "EPERM"),
    "user_namespace": ("ok", "EPERM"),
    "thread": ("ok", "ok"),
    "node_worker": ("42", "42"),
}


@pytest.mark.parametrize("key", sorted(NOBODY_EXPECTED))
def test_as_uid_65534(nobody_runs: tuple[dict[str, object], dict[str, object]], key: str) -> None:
    check_row(nobody_runs, NOBODY_EXPECTED, key)


def test_as_uid_65534_no_capability_after_exec(
    nobody_runs: tuple[dict[str, object], dict[str, object]],
) -> None:
    caps = nobody_runs[1]["caps"]
    assert isinstance(caps, dict)
    assert caps["CapEff"] == caps["CapPrm"] == caps["CapAmb"] == "0" * 16


#: One layer at a time: each denies its own operations and only those.
LAYERS = {
    "seccomp_only": (
        {"seccomp": True},
        {"connect_denied": "ok", "kill_parent": "ok", "udp": "EPERM", "ptrace_other": "EPERM"},
    ),
    "landlock_only": (
        {"read": ["/"], "write": ["/"], "connect": [], "scope": True},
        {"connect_denied": "EACCES", "kill_parent": "EPERM", "udp": "ok", "ptrace_other": "EPERM"},
    ),
}


@pytest.mark.parametrize("layer", sorted(LAYERS))
@needs_root
def test_each_layer_denies_on_its_own(world: World, layer: str) -> None:
    policy, expected = LAYERS[layer]
    outcome = run_probe(
        {"policy": policy, "ops": [op for op in main_ops(world) if op[0] in expected]}
    )
    assert outcome == expected


@needs_root
def test_bring_loopback_up_in_a_fresh_network_namespace() -> None:
    outcome = run_probe({"policy": None, "ops": [["lo", "loopback"]]})
    assert outcome["lo"] == {"before": False, "after": True, "echo": "ping"}


def test_probe_reports_what_the_kernel_offers() -> None:
    offered = confine.probe()
    assert set(offered) == {"landlock_abi", "fs", "net_tcp", "scope", "seccomp", "netns", "view"}
    abi = offered["landlock_abi"]
    assert isinstance(abi, int) and abi >= 0
    assert offered["fs"] is (abi >= 1)
    assert offered["net_tcp"] is (abi >= 4)
    assert offered["scope"] is (abi >= 6)
    assert isinstance(offered["seccomp"], bool)
    assert isinstance(offered["netns"], str) and isinstance(offered["view"], str)
    if os.geteuid() == 0:
        assert offered["netns"] == "" and offered["view"] == ""
    offered["fs"] = "changed"
    assert confine.probe()["fs"] is (abi >= 1)  # a copy: the cache is untouched


def test_the_module_loads_by_path_with_builtin_modules_only() -> None:
    code = (
        "import importlib.util, sys\n"
        "before = set(sys.modules)\n"
        f"spec = importlib.util.spec_from_file_location('confine_by_path', {str(MODULE)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(sorted(set(sys.modules) - before - {'confine_by_path'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    # ctypes and struct load on first use only; __future__ is the keeper's own import too.
    assert done.stdout.strip() in ("[]", "['__future__']")


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"reads": ["/usr"]}, "unknown key 'reads'"),
        ({"read": "/usr"}, "read must be a list of absolute paths"),
        ({"write": ["relative/dir"]}, "write must be a list of absolute paths"),
        ({"connect": [70000]}, "connect must be a list of TCP ports"),
        ({"bind": [True]}, "bind must be a list of TCP ports"),
        ({"seccomp": 1}, "seccomp must be True or False"),
    ],
)
def test_bad_policies_raise_with_what_to_do(policy: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        confine.prepare(policy)


def test_prepared_close_is_idempotent_and_apply_after_close_raises() -> None:
    prepared = confine.prepare({"read": ["/usr", "/nonexistent/skipped"], "seccomp": True})
    fd = prepared.ruleset_fd
    assert fd >= 0 and prepared.seccomp
    prepared.close()
    prepared.close()
    assert prepared.ruleset_fd == -1
    with pytest.raises(OSError):
        os.fstat(fd)
    with pytest.raises(ValueError, match="closed"):
        confine.apply(prepared)


def test_a_view_that_cannot_fork_its_builder_leaves_no_descriptor_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def at_the_process_limit() -> int:
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    view = confine._sibling("view")
    monkeypatch.setattr(os, "fork", at_the_process_limit)
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(BlockingIOError):
        view.build(None, {}, {})  # the fork is its first step: nothing else is read
    assert sorted(os.listdir("/proc/self/fd")) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="only root keeps a namespace of the view")
def test_a_prepare_that_fails_at_the_view_leaves_no_descriptor_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if confine.probe()["view"] or not confine.probe()["fs"]:
        pytest.skip("no mount namespace or no Landlock here")
    (tmp_path / "workspace").mkdir()
    policy = {"read": ["/usr"], "write": [str(tmp_path / "workspace")], "view": True}
    confine.prepare(policy).close()  # the env's namespace, made once and kept
    before = sorted(os.listdir("/proc/self/fd"))

    def out_of_descriptors(fd: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "dup", out_of_descriptors)
    with pytest.raises(OSError, match="Too many open files"):
        confine.prepare(policy)
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_a_keeper_keeps_a_bounded_number_of_view_plans(tmp_path: Path) -> None:
    """A command naming a file of its workspace reads a path of each episode's: the
    plans made for a long env's episodes do not pile up in its keeper."""
    view, cache = confine._sibling("view"), {}
    for n in range(40):
        episode = tmp_path / f"episode{n}"
        for folder in ("workspace", "tmp"):
            (episode / folder).mkdir(parents=True)
        policy = {"read": ["/usr", str(episode / "workspace")], "write": [str(episode / "tmp")]}
        made = view.plan(policy, confine.VIEW_DEVICES, cache)
        assert str(episode / "workspace").encode() in dict(made["binds"])
    kept = sum(len(value) if isinstance(value, dict) else 1 for value in cache.values())
    assert kept <= 2 * view._PLANS_KEPT, list(cache)


HEADERS = {  # where the system's kernel headers keep each table
    0: "/usr/include/x86_64-linux-gnu/asm/unistd_64.h",
    1: "/usr/include/asm-generic/unistd.h",  # aarch64 uses the generic table
}


def test_every_denied_call_has_a_reason_and_a_number_per_architecture() -> None:
    explained = " ".join(names for names, _why in confine.SECCOMP_WHY).split()
    assert tuple(explained) == confine.SECCOMP_DENIED
    assert len(set(explained)) == len(explained)
    assert set(confine.SECCOMP_DENIED) <= set(confine._NUMBERS)
    for column in (0, 1):
        numbers = [pair[column] for pair in confine._NUMBERS.values()]
        assert len(set(numbers)) == len(numbers), f"table {column}: a number twice"


@pytest.mark.parametrize("column", sorted(HEADERS), ids=["x86_64", "aarch64"])
def test_syscall_numbers_match_the_kernel_headers(column: int) -> None:
    header = Path(HEADERS[column])
    if not header.exists():
        pytest.skip(f"no {header} here")
    defined = dict(re.findall(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", header.read_text()))
    checked = 0
    for name, numbers in confine._NUMBERS.items():
        if name in defined:  # older headers lack the newest calls (open_tree_attr)
            assert numbers[column] == int(defined[name]), name
            checked += 1
    assert checked >= len(confine._NUMBERS) - 2
