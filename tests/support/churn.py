"""A tree that changes while a fork copies it: the stand-in for a parent's busy harness.

``churned_tree`` lays out a tree the ``scripts/churn.py`` process knows how to churn, with
a secret outside it; ``churning`` runs that process (a real one, on another core from the
copy) for the length of a ``with`` block and stops it by its pid.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support import SUPPORT

__all__ = ["SECRET", "churned_tree", "churning"]

#: What the file outside the tree holds; a copy must never hold it.
SECRET = b"the parent's hidden answer: 42"
CHURN_SCRIPT = SUPPORT / "scripts" / "churn.py"


def churned_tree(root: Path, outside: Path, *, swaps: int = 8) -> None:
    """Fill ``root`` (made if missing) and make ``outside`` with the secret in it:
    ``swap0``... (directories of 10 files the churn trades for links to ``outside``),
    ``tmp/`` (20 files it deletes and rewrites) and ``grow.bin`` (empty; it grows)."""
    outside.mkdir()
    (outside / "answer.txt").write_bytes(SECRET)
    for n in range(swaps):
        (root / f"swap{n}").mkdir(parents=True)
        for m in range(10):
            (root / f"swap{n}" / f"s{m}").write_bytes(b"s" * 100)
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    for m in range(20):
        (root / "tmp" / f"t{m}").write_bytes(b"t" * 100)
    (root / "grow.bin").write_bytes(b"")


@contextmanager
def churning(root: Path, outside: Path, grow_bytes: int) -> Iterator[None]:
    """Churn ``root`` (laid out by ``churned_tree``) until the block ends; the block
    starts once the first round is done."""
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
