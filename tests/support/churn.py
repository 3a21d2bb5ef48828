"""A tree that changes while a fork copies it: the stand-in for a parent's busy harness.

``churning`` runs ``scripts/churn.py`` (a real process, racing the copy from another
core) on a tree for the length of a ``with`` block and stops it by its pid;
``churning_agent`` is the argv of the same script as a line-protocol harness that
churns its own workspace after its first turn. Both swap directories for links to a
directory holding :data:`SECRET` (``secret_outside``), which no copy may ever hold.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support import CHURN_SCRIPT

__all__ = ["SECRET", "churning", "churning_agent", "secret_outside"]

#: What the file outside the tree holds; a copy must never hold it.
SECRET = b"the parent's hidden answer: 42"


def secret_outside(tmp_path: Path) -> Path:
    """``tmp_path/outside`` (made if missing), holding ``answer.txt`` with the secret."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "answer.txt").write_bytes(SECRET)
    return outside


@contextmanager
def churning(root: Path, outside: Path, grow_bytes: int) -> Iterator[None]:
    """Lay out ``root`` (which must not exist) and churn it until the block ends; the
    block starts once the layout is done. ``grow.bin`` grows by ``grow_bytes`` a round."""
    argv = [sys.executable, str(CHURN_SCRIPT), str(root), str(outside), str(grow_bytes)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "churning\n"  # bounded: the pytest timeout
        yield
        assert proc.poll() is None, "the churn stopped by itself"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def churning_agent(outside: Path, grow_bytes: int, tmp_files: int = 20) -> list[str]:
    """The command of a forkable line-protocol harness that churns its workspace (as
    ``churning`` does, deleting and writing ``tmp_files`` files a round) from its first
    answer on, for as long as it runs."""
    script = str(CHURN_SCRIPT)
    return [sys.executable, script, "--agent", str(outside), str(grow_bytes), str(tmp_files)]
