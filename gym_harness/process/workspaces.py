"""Episode workspaces, owned like processes: deleted by a keeper if their owner dies.

An env registers its workspace directory with ``own_path`` when it creates it and
deletes it itself at ``close()`` (then ``disown_path``); if the process dies first,
the keepers (``gym_harness.process.keeper``) delete it once they have ended their trees.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from gym_harness.errors import ConfigError, HarnessStartError
from gym_harness.process import keeper_client as _keeper_client
from gym_harness.process import procfs

if TYPE_CHECKING:
    from gym_harness.tasks import Task

__all__ = [
    "check_template",
    "describe",
    "disown_path",
    "episode_dirs",
    "new_root",
    "own_path",
    "remove_path",
]


def new_root(keep: bool) -> Path:
    """A fresh directory for an env's episodes, owned by a keeper unless ``keep``.

    The caller holds a keeper first (``keeper_client.hold``), so that one owns
    the directory from the start.
    """
    root = Path(tempfile.mkdtemp(prefix="gym_harness-"))
    if not keep:  # the keeper deletes it if this process dies
        own_path(root)
    return root


def episode_dirs(episode_dir: Path, template: Path | None, task: Task | None) -> tuple[Path, Path]:
    """Make an episode's directories under ``episode_dir``; return the first two.

    ``workspace`` (a copy of ``template``, then the task's files), the private
    ``home`` and ``tmp`` of the harness, and ``hidden`` (the task's hidden files,
    for the reward function: a confined harness cannot reach it).

    Links in ``template`` are copied as links; a link that leads out of the template is
    refused (it would lead the harness, or the task's files, outside the workspace).

    Raises:
        ConfigError: ``template`` holds a link that leads out of it, or a task file's
            path runs through a link.
        HarnessStartError: The directories could not be written (no space left on the
            device, say); the message names the directory and what to do.
    """
    workspace, home = episode_dir / "workspace", episode_dir / "home"
    try:
        if template is not None:
            check_template(template)
            shutil.copytree(template, workspace, symlinks=True)
        workspace.mkdir(parents=True, exist_ok=True)
        home.mkdir(mode=0o700)
        (episode_dir / "tmp").mkdir(mode=0o700)
        (episode_dir / "hidden").mkdir(mode=0o700)
        if task is not None:
            task.write_files(workspace)
            task.write_files(episode_dir / "hidden", hidden=True)
    except (OSError, shutil.Error) as exc:
        raise HarnessStartError(f"could not write the episode's directories under "
                                f"{str(episode_dir)!r}: {describe(exc)}") from exc  # fmt: skip
    return workspace, home


def check_template(template: Path) -> None:
    """Raise ``ConfigError`` naming the first link in ``template`` that leads out of it.

    A link's target is resolved as the kernel would (through the links it meets), from
    the link's own directory; a link to a missing path inside the template is kept.
    """
    top = os.path.realpath(template)
    for folder, dirs, files in os.walk(template):
        for name in (*dirs, *files):
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                continue
            target = os.path.realpath(path)
            if target != top and not target.startswith(top + os.sep):
                raise ConfigError(
                    f"workspace template {str(template)!r}: the link {path!r} leads out of "
                    f"the template (to {target!r}); a harness would reach, and the task's "
                    "files be written, outside the workspace. Replace it with a copy of "
                    "what it points to, or a link inside the template."
                )


def describe(exc: OSError | shutil.Error) -> str:
    """An OSError as a sentence, with what to do when the disk is full."""
    if isinstance(exc, shutil.Error):  # copytree's list of (source, target, why)
        return "; ".join(str(why) for *_, why in exc.args[0][:3])
    text = f"{exc.strerror or exc}" + (f": {exc.filename!r}" if exc.filename else "")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        text += (" (the disk holding the workspaces is full: free space there, point "
                 "TMPDIR at a larger disk, or lower max_workspace_bytes)")  # fmt: skip
    return text


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
        procfs.remove_tree(os.fspath(path))
