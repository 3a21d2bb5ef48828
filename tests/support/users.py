"""Running a test's owner process as an unprivileged user (uid 65534), where root can.

``run_as`` gives, for ``"root"`` or ``"nobody"``, the argv prefix and a directory that user
owns (skipping the test, with the reason, where that user cannot run gym_harness here);
``nobody_prefix`` gives the argv prefix (``setpriv``, and where the interpreter lives
under a directory others may not enter, a private mount namespace that shows only the
interpreter's tree); ``owner_env`` the environment such an owner runs with.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

NOBODY = 65534
ROOT = Path(__file__).resolve().parent.parent.parent


def nobody_prefix(workdir: Path) -> list[str] | str:
    """The argv prefix that runs a command as uid 65534, or why that cannot be done."""
    if os.geteuid() != 0:
        return []  # already unprivileged
    setpriv, unshare = shutil.which("setpriv"), shutil.which("unshare")
    if setpriv is None:
        return "setpriv (util-linux) is not installed"
    run_as = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    # A venv's python is a link into the interpreter's tree: follow it.
    python = Path(sys.executable).resolve()
    blocked = blocked_ancestor(python)
    if blocked is None:
        return run_as
    if unshare is None:
        return f"{blocked} is closed to other users and unshare is missing"
    # Python lives under a directory others may not enter (/root here): in a private
    # mount namespace, lay an open tmpfs over it that shows only the Python tree.
    inner = blocked / python.relative_to(blocked).parts[0]
    stage = workdir / "stage"
    stage.mkdir()
    script = (
        'mount --bind "$1" "$3" && mount -t tmpfs -o mode=755 tmpfs "$2" && '
        'mkdir -p "$1" && mount --move "$3" "$1" && shift 3 && exec "$@"'
    )
    mount = [unshare, "-m", "--propagation", "private", "sh", "-c", script, "sh"]
    return [*mount, str(inner), str(blocked), str(stage), *run_as]


def blocked_ancestor(path: Path) -> Path | None:
    """The first directory above ``path`` that others may not enter, if any."""
    for parent in reversed(path.parents):
        if not os.stat(parent).st_mode & 0o001:
            return parent
    return None


def owner_env(workdir: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(workdir), HOME=str(workdir))


@contextlib.contextmanager
def run_as(user: str) -> Iterator[tuple[list[str], Path]]:
    """(argv prefix, a directory ``user`` owns: its HOME and TMPDIR) for an owner process.

    ``"root"`` is the test's own user (root on the CI machine); ``"nobody"`` uid 65534.
    """
    workdir = Path(tempfile.mkdtemp(prefix="gym-harness-owner-"))
    try:
        prefix: list[str] | str = []
        if user == "nobody":
            os.chmod(workdir, 0o755)
            if os.geteuid() == 0:
                os.chown(workdir, NOBODY, NOBODY)
            prefix = nobody_prefix(workdir)
            if isinstance(prefix, str):
                pytest.skip(f"cannot run as an unprivileged user here: {prefix}")
            probe = subprocess.run(
                [*prefix, sys.executable, "-c", "import gym_harness.env, psutil"],
                env=owner_env(workdir),
                capture_output=True,
                text=True,
                timeout=60,
            )
            if probe.returncode != 0:
                pytest.skip(f"uid {NOBODY} cannot run gym_harness here: {probe.stderr[-300:]}")
        yield prefix, workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
