"""The copy a fork makes of a live tree (``utils/trees.py``), on hostile trees.

Real directories, links, FIFOs, sockets, a device and a real small tmpfs; a real
process stands in for the parent's harness, racing the copy (``support.churn``): it
swaps directories for links to a secret outside the tree, grows a file past the bound
and deletes files, in a loop.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.churn import SECRET, churning, secret_outside

from gym_harness import ForkFailed
from gym_harness.utils.trees import MAX_DEPTH, TreeSize, copy_tree, tree_size


def walk(root: Path) -> Iterator[tuple[str, str, bytes]]:
    """``(path under root, kind, content or link text)`` of every entry, links unfollowed."""
    for top, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = Path(top, name)
            mode = path.lstat().st_mode
            where = str(path.relative_to(root))
            if stat.S_ISLNK(mode):
                yield where, "link", os.readlink(path).encode()
            elif stat.S_ISDIR(mode):
                yield where, "dir", b""
            elif stat.S_ISREG(mode):
                yield where, "file", path.read_bytes()
            else:
                yield where, "other", b""


def held(root: Path) -> int:
    """Bytes of file content under ``root``."""
    return sum(len(content) for _, kind, content in walk(root) if kind == "file")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_hostile_tree_is_copied_with_no_link_followed(tmp_path: Path) -> None:
    outside = secret_outside(tmp_path)
    source = tmp_path / "workspace"
    (source / "sub").mkdir(parents=True)
    (source / "a.txt").write_bytes(b"a" * 10)
    (source / "sub" / "b.txt").write_bytes(b"b" * 20)
    os.chmod(source / "sub" / "b.txt", 0o640)
    (source / "suid").write_bytes(b"x")
    os.chmod(source / "suid", 0o6755)  # the child gets no set-user-ID or set-group-ID file
    os.symlink(".", source / "loop")  # a loop to itself
    os.symlink("ring2", source / "ring1")  # a loop of two
    os.symlink("ring1", source / "ring2")
    os.symlink(outside, source / "out_dir")  # absolute, to a directory outside
    os.symlink("../../outside/answer.txt", source / "sub" / "out_file")  # relative, outside
    os.symlink("missing", source / "dangling")
    os.mkfifo(source / "fifo")  # opening it would block a reader: it is skipped
    os.mknod(source / "sock", 0o600 | stat.S_IFSOCK)  # skipped too
    with contextlib.suppress(PermissionError):  # a device, if we may: never opened nor copied
        os.mknod(source / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    deep = source
    for level in range(MAX_DEPTH - 1):  # the deepest a copy goes, with its root
        deep = deep / f"d{level}"
    deep.mkdir(parents=True)
    (deep / "bottom.txt").write_bytes(b"bottom")
    fds = open_fds()
    target = tmp_path / "child"
    assert copy_tree(source, target, limit=1000) == 37
    assert open_fds() == fds
    copied = {where: (kind, content) for where, kind, content in walk(target)}
    expected = {
        where: (kind, content)
        for where, kind, content in walk(source)
        if kind != "other"  # the FIFO, the socket, the device
    }
    assert copied == expected
    assert copied["out_dir"] == ("link", str(outside).encode())  # a link, as it was
    assert copied["loop"] == ("link", b".")
    assert not any(SECRET in content for kind, content in copied.values() if kind == "file")
    assert stat.S_IMODE((target / "sub" / "b.txt").stat().st_mode) == 0o640
    assert stat.S_IMODE((target / "suid").stat().st_mode) == 0o755
    assert tree_size([source], 1000).bytes == 37
    assert 25 < tree_size([source, tmp_path / "missing"], 25).bytes < 37  # stops past the bound


def test_a_tree_deeper_than_the_bound_fails_and_names_where(tmp_path: Path) -> None:
    source = tmp_path / "workspace"
    deep = source
    for level in range(MAX_DEPTH + 1):
        deep = deep / f"d{level}"
    deep.mkdir(parents=True)
    fds = open_fds()
    with pytest.raises(ForkFailed, match=rf"'workspace/d0/.*/d{MAX_DEPTH}' is nested deeper"):
        copy_tree(source, tmp_path / "child", limit=1000)
    assert open_fds() == fds


def test_a_copy_stops_at_the_bound_and_holds_no_more(tmp_path: Path) -> None:
    source = tmp_path / "home"
    source.mkdir()
    (source / "one").write_bytes(b"1" * 300)
    (source / "two").write_bytes(b"2" * 300)
    target = tmp_path / "child"
    with pytest.raises(ForkFailed, match=r"grew past max_fork_bytes=500 bytes .*500 bytes copied"):
        copy_tree(source, target, limit=500)
    assert held(target) == 500
    # A second tree under the same bound counts the first's bytes.
    with pytest.raises(ForkFailed, match=r"max_fork_bytes=700 .*file 'home/\w+' had more"):
        copy_tree(source, target, limit=700, copied=200)
    assert held(target) == 500
    assert copy_tree(source, target, limit=600) == 600  # exactly the bound: whole
    assert held(target) == 600


def test_a_tree_of_more_entries_than_the_bound_is_refused_and_names_where(
    tmp_path: Path,
) -> None:
    # Empty files and directories: no bytes, and each still an entry.
    workspace, home = tmp_path / "workspace", tmp_path / "home"
    (workspace / "sub").mkdir(parents=True)
    home.mkdir()
    for i in range(3):
        (workspace / "sub" / f"e{i}").touch()
        (home / f"h{i}").touch()
    assert tree_size([workspace, home], 1000, max_entries=4) == TreeSize(0, 4)  # sub + 3
    assert tree_size([workspace, home], 1000, max_entries=3) == TreeSize(0, 4)  # stopped
    assert copy_tree(workspace, tmp_path / "child", limit=1000, max_entries=4) == 0
    assert len(list((tmp_path / "child").rglob("*"))) == 4
    fds = open_fds()
    with pytest.raises(
        ForkFailed, match=r"more than 3 entries .*stopped at entry 'workspace/sub/e"
    ):
        copy_tree(workspace, tmp_path / "child", limit=1000, max_entries=3)
    assert open_fds() == fds
    assert len(list((tmp_path / "child").rglob("*"))) == 3  # no more than the bound


# Trees drawn at random: a name maps to a file's bytes, a link's text, or a subtree.
names = st.sampled_from(["a", "b", "c", "sub", "..x", "ü"])
link_texts = st.sampled_from([".", "..", "a", "sub/a", "/", "../../outside/answer.txt", "loop"])
trees = st.recursive(
    st.one_of(st.binary(max_size=64), link_texts.map(lambda text: ("link", text))),
    lambda below: st.dictionaries(names, below, max_size=4),
    max_leaves=12,
)


def build(path: Path, tree: object) -> None:
    if isinstance(tree, dict):
        path.mkdir()
        for name, below in tree.items():
            build(path / name, below)
    elif isinstance(tree, tuple):
        os.symlink(tree[1], path)
    else:
        assert isinstance(tree, bytes)
        path.write_bytes(tree)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tree=st.dictionaries(names, trees, max_size=5), limit=st.integers(0, 200))
def test_any_tree_is_copied_exactly_or_refused_at_the_bound(
    tmp_path_factory: pytest.TempPathFactory, tree: dict[str, object], limit: int
) -> None:
    base = tmp_path_factory.mktemp("tree")
    secret_outside(base)
    source, target = base / "workspace", base / "child"
    build(source, tree)
    size = held(source)
    assert tree_size([source], 1 << 20).bytes == size
    try:
        copied = copy_tree(source, target, limit=limit)
    except ForkFailed as exc:
        assert size > limit and f"grew past max_fork_bytes={limit} bytes" in str(exc)
        assert held(target) == limit
    else:
        assert size <= limit and copied == size
        assert sorted(walk(target)) == sorted(walk(source))


CAUSES = {
    "link": "became a symbolic link while it was copied",
    "vanished": "vanished while it was copied",
    "bound": "grew past max_fork_bytes=50000 bytes",
    "replaced": "was replaced while it was copied",  # a link, now a directory again
}


def test_a_copy_raced_by_a_churning_harness_follows_no_link_and_holds_no_more(
    tmp_path: Path,
) -> None:
    source, outside, limit = tmp_path / "workspace", secret_outside(tmp_path), 50_000
    seen = dict.fromkeys([*CAUSES, "whole"], 0)
    fds = open_fds()
    with churning(source, outside, limit + 1):
        for _ in range(300):
            target = tmp_path / "child"
            try:
                copy_tree(source, target, limit=limit)
                seen["whole"] += 1
            except ForkFailed as exc:
                cause = [key for key, text in CAUSES.items() if text in str(exc)]
                assert len(cause) == 1, str(exc)
                seen[cause[0]] += 1
            copied = list(walk(target))
            assert not any(SECRET in content for _, kind, content in copied if kind == "file")
            assert not any(where.endswith("answer.txt") for where, _, _ in copied)
            assert held(target) <= limit
            if all(seen[key] for key in ("link", "vanished", "bound", "whole")):
                break
    assert open_fds() == fds
    assert all(seen[key] for key in ("link", "vanished", "bound", "whole")), seen


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_a_full_disk_mid_copy_is_a_fork_failed_that_says_so(tmp_path: Path) -> None:
    source = tmp_path / "workspace"
    source.mkdir()
    for n in range(4):
        (source / f"f{n}").write_bytes(os.urandom(256 << 10))
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "none", str(small)], check=True)
    try:
        with pytest.raises(ForkFailed, match=r"the disk ran out of space copying file 'workspace"):
            copy_tree(source, small / "child", limit=1 << 30)
        assert held(small / "child") <= 512 << 10
    finally:
        subprocess.run(["umount", "-l", str(small)], check=True)
