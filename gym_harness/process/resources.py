"""EnvResources: what one env owns that must end with it, closed or dropped.

An env owns, across its episodes, one hold on a keeper, a root directory with one
directory per episode, the harness process of the current episode, and its loopback
services (the MCP bridge, the capture proxy, the model endpoint). ``release`` ends all
of it, once: ``HarnessEnv.close()`` calls it, and a finalizer calls it when an env is
garbage-collected without ``close()`` (or is still open at exit), saying so once in the
log. The finalizer holds this object, never the env, so the env can be collected.

Threads: the env's caller thread makes and changes it; ``release`` runs in whichever
thread closes the env or collects it (the env's state lock keeps two closes apart).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from gym_harness.process import keeper_client as _keeper_client
from gym_harness.process.workspaces import disown_path, episode_dirs, new_root, remove_path
from gym_harness.utils.interrupts import interrupts_held

if TYPE_CHECKING:
    from gym_harness.tasks import Task

__all__ = ["EnvResources", "Stoppable"]

S = TypeVar("S", bound="Stoppable")

logger = logging.getLogger("gym_harness")


class Stoppable(Protocol):
    """A harness process or a loopback service: ``stop()`` is idempotent and never raises."""

    def stop(self) -> None: ...


class EnvResources:
    """One env's keeper hold, episode directories, harness process and services.

    The first ``new_episode`` holds a keeper (so one keeper serves every episode, and
    owns the root from the start) and makes the root; each episode gets a directory of
    its own, removed by ``end_episode``.

    Args:
        template: A directory copied into every episode's workspace, if any.
        keep: Keep the directories (for inspection); nobody removes them then.
    """

    def __init__(self, template: Path | None, keep: bool) -> None:
        self.template = template
        self.keep = keep
        self.root: Path | None = None
        #: The current episode's directory (``workspace/`` and ``home/`` in it), if any.
        self.current: Path | None = None
        #: The current episode's harness process, if any.
        self.process: Stoppable | None = None
        #: The env's loopback services, stopped last.
        self.services: list[Stoppable] = []
        self._held = False

    def own(self, service: S) -> S:
        """Have ``release`` stop ``service`` (a loopback server); return it."""
        self.services.append(service)
        return service

    def hold_keeper(self) -> None:
        """Hold a keeper for this env's harnesses, once (not one per reset)."""
        with interrupts_held():
            if not self._held:
                _keeper_client.hold()
                self._held = True

    def new_episode(self, episode_id: str, task: Task | None) -> tuple[Path, Path]:
        """Make the episode's ``workspace`` and ``home``; return both."""
        with interrupts_held():
            if self.root is None:
                self.hold_keeper()  # first, so that a keeper owns the root from the start
                self.root = new_root(self.keep)
            self.current = self.root / episode_id
        return episode_dirs(self.current, self.template, task)

    def end_episode(self) -> None:
        """Stop the episode's harness and remove its directory (unless kept). Never raises."""
        with interrupts_held():
            process, self.process = self.process, None
            if process is not None:
                process.stop()
            current, self.current = self.current, None
            if current is not None and not self.keep:
                remove_path(current)

    def release(self, dropped: bool = False) -> None:
        """End everything: the harness, the services, the directories, the keeper hold.

        Never raises. Calling it again ends whatever was made since (a reset that ran
        while another thread closed the env).

        Args:
            dropped: Called by the finalizer of an env that was never closed (logged).
        """
        with interrupts_held():
            if dropped:
                logger.warning(
                    "gym_harness: a HarnessEnv was dropped without close(); its harness, "
                    "servers and workspaces were ended (call env.close() when done)"
                )
            try:
                self.end_episode()
                for service in reversed(self.services):
                    with contextlib.suppress(Exception):
                        service.stop()
                self.services.clear()
            finally:
                root, self.root = self.root, None
                if root is not None and not self.keep:
                    remove_path(root)
                    disown_path(root)
                if self._held:
                    self._held = False
                    _keeper_client.unhold()
