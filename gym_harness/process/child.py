"""Child: a harness started by a keeper, as its owner sees it (a small ``Popen`` look-alike).

The keeper (``gym_harness.process.keeper``) is the harness's parent: it reaps it and
reports its exit code, and, past a limit, which one it ended the tree for; the owner's
watcher thread (``keeper_client``) records both here.
"""

from __future__ import annotations

import subprocess
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gym_harness.process.tree import Keeper

__all__ = ["Child"]


class Child:
    """A harness started by a keeper, as its owner sees it: a small ``Popen`` look-alike.

    The keeper is the harness's parent, so it reaps it and reports the exit code;
    ``poll``/``returncode``/``wait`` reflect that report. Its pipes are the owner's.
    """

    def __init__(
        self, pid: int, fds: tuple[int, int, int], cgroup: str, marker: str, keeper: Keeper
    ) -> None:
        self.pid = pid
        self.stdin = open(fds[0], "wb", buffering=0)  # noqa: SIM115  (closed by the owner)
        self.stdout = open(fds[1], "rb", buffering=0)  # noqa: SIM115
        self.stderr = open(fds[2], "rb", buffering=0)  # noqa: SIM115
        self.cgroup = cgroup
        self.marker = marker
        self.keeper = keeper
        self.keeper_lost = False
        #: Which limit the keeper ended the tree for ("" while none was passed).
        self.limit = ""
        self.returncode: int | None = None
        self._exited = threading.Event()

    def poll(self) -> int | None:
        """The exit code (``-N`` for signal N), or ``None`` while it runs."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit code.

        Raises:
            subprocess.TimeoutExpired: Still running after ``timeout`` seconds.
        """
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def set_exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set()
