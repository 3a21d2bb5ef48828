"""Episode workspaces, owned like processes: deleted by a keeper if their owner dies.

An env registers its workspace directory with ``own_path`` when it creates it and
deletes it itself at ``close()`` (then ``disown_path``); if the process dies first,
the keepers (``gym_harness.process.keeper``) delete it once they have ended their trees.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from gym_harness.errors import HarnessStartError
from gym_harness.process import keeper as _keeper
from gym_harness.process import keeper_client as _keeper_client

if TYPE_CHECKING:
    from gym_harness.tasks import Task

__all__ = ["EpisodeDirs", "disown_path", "episode_dirs", "new_root", "own_path", "remove_path"]


def new_root(keep: bool) -> Path:
    """A fresh directory for an env's episodes, owned by a keeper unless ``keep``.

    The caller holds a keeper first (``harness_process.hold_keeper``), so that one owns
    the directory from the start.
    """
    root = Path(tempfile.mkdtemp(prefix="gym_harness-"))
    if not keep:  # the keeper deletes it if this process dies
        own_path(root)
    return root


def episode_dirs(episode_dir: Path, template: Path | None, task: Task | None) -> tuple[Path, Path]:
    """Make an episode's ``workspace`` (a copy of ``template``, then the task's files)
    and its private ``home`` under ``episode_dir``; return both."""
    workspace, home = episode_dir / "workspace", episode_dir / "home"
    if template is not None:
        shutil.copytree(template, workspace, symlinks=True)
    workspace.mkdir(parents=True, exist_ok=True)
    home.mkdir(mode=0o700)
    if task is not None:
        task.write_files(workspace)
    return workspace, home


def own_path(path: str | os.PathLike[str]) -> None:
    """Have the keepers delete ``path`` should this process die before ``disown_path``.

    The deletion happens after the keeper has ended its harness's tree, so no
    harness writes into the directory meanwhile. Used for episode workspaces.

    Raises:
        HarnessStartError: No keeper process could be started to own it.
    """
    try:
        _keeper_client.own(os.path.abspath(path))
    except OSError as exc:
        raise HarnessStartError(
            f"Could not start a keeper process to own {str(path)!r}: {exc}."
        ) from exc


def disown_path(path: str | os.PathLike[str]) -> None:
    """Undo ``own_path`` (the caller deleted ``path`` or keeps it). Never raises."""
    _keeper_client.disown(os.path.abspath(path))


def remove_path(path: str | os.PathLike[str]) -> None:
    """Delete a directory tree a harness wrote, even where it removed our permissions.

    Never raises.
    """
    with contextlib.suppress(OSError):
        _keeper.remove_tree(os.fspath(path))


class EpisodeDirs:
    """One env's episode directories under one root, and its hold on a keeper.

    The first ``new_episode`` holds a keeper (so one keeper serves every episode, and
    owns the root from the start) and makes the root; each episode gets a directory of
    its own, removed by ``end_episode``; ``close`` removes the root and lets the keeper go.

    Args:
        template: A directory copied into every episode's workspace, if any.
        keep: Keep the directories (for inspection); nobody removes them then.

    Threads: the env's caller thread only.
    """

    def __init__(self, template: Path | None, keep: bool) -> None:
        self.template = template
        self.keep = keep
        self.root: Path | None = None
        #: The current episode's directory (``workspace/`` and ``home/`` in it), if any.
        self.current: Path | None = None
        self._held = False

    def hold_keeper(self) -> None:
        """Hold a keeper for this env's harnesses, once (not one per reset)."""
        if not self._held:
            _keeper_client.hold()
            self._held = True

    def new_episode(self, episode_id: str, task: Task | None) -> tuple[Path, Path]:
        """Make the episode's ``workspace`` and ``home``; return both."""
        if self.root is None:
            self.hold_keeper()  # first, so that a keeper owns the root from the start
            self.root = new_root(self.keep)
        self.current = self.root / episode_id
        return episode_dirs(self.current, self.template, task)

    def end_episode(self) -> None:
        """Remove the current episode's directory (unless kept). Never raises."""
        current, self.current = self.current, None
        if current is not None and not self.keep:
            remove_path(current)

    def close(self) -> None:
        """Remove the root (unless kept) and release the keeper. Never raises."""
        if self.root is not None and not self.keep:
            remove_path(self.root)
            disown_path(self.root)
        if self._held:
            self._held = False
            _keeper_client.unhold()
