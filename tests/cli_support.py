"""Where the real harness CLIs live for the integration tests.

`.ci/install-clis.sh` installs them at exact versions into `.clis/` (git-ignored).
A test that needs one calls `cli_path(name)`; it skips, with the reason, only
where npm itself is missing, and fails loudly where npm is there but the CLI is not.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLI_BIN = ROOT / ".clis" / "node_modules" / ".bin"


def cli_path(name: str) -> str:
    """Return the path of the installed CLI ``name`` (e.g. "claude", "codex").

    Skips the test when npm is not installed; fails when npm is there but the
    CLI is missing (run `bash .ci/install-clis.sh`).
    """
    path = CLI_BIN / name
    if path.exists():
        return str(path)
    if shutil.which("npm") is None:
        pytest.skip(f"npm is not installed, so the {name} CLI cannot be installed")
    pytest.fail(f"{name} CLI not found at {path}; run `bash .ci/install-clis.sh` first")
    raise AssertionError  # unreachable; pytest.fail raises
