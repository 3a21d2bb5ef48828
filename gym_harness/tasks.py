"""Tasks: what an episode is about, and the files its workspace starts with.

A task is ``{"id", "prompt", "files"?, "hidden_files"?, "meta"?}``; a task list is a list of
such dicts or a JSONL file of them. ``files`` maps a relative path to text
content written into the episode's fresh workspace.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from gym_harness.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Task", "as_task", "load_tasks", "pick_task"]


@dataclass(frozen=True)
class Task:
    """One task.

    Args:
        id: Unique id within its task list.
        prompt: The first observation of an episode on this task.
        files: Relative path -> text content, written into the workspace at reset.
        hidden_files: Like ``files``, written outside the workspace, where a confined
            harness cannot reach them: the reward function reads them from
            ``ctx.hidden_dir`` (held-out tests, the expected answer).
        meta: Anything else (expected answers for the reward, tags ...).
    """

    id: str
    prompt: str = ""
    files: Mapping[str, str] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)
    hidden_files: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: object, where: str = "task") -> Task:
        """Validate and build a task.

        Raises:
            ConfigError: A field is missing or has the wrong type; ``where`` says which task.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: expected an object with 'id' and 'prompt', got {data!r}.")
        unknown = sorted(set(data) - {"id", "prompt", "files", "hidden_files", "meta"})
        if unknown:
            raise ConfigError(
                f"{where}: unknown keys {unknown}; allowed: id, prompt, files, hidden_files, meta."
            )
        if "prompt" not in data:
            raise ConfigError(
                f"{where}: the task has no 'prompt' (its first message); add one, e.g. "
                '{"id": "t1", "prompt": "Add 2 and 3"}.'
            )
        task_id, prompt = data.get("id"), data["prompt"]
        files, meta = data.get("files") or {}, data.get("meta") or {}
        hidden = data.get("hidden_files") or {}
        if not isinstance(task_id, str | int) or isinstance(task_id, bool) or task_id == "":
            raise ConfigError(f"{where}: 'id' must be a non-empty string, got {task_id!r}.")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"{where}: 'prompt' must be a non-empty string, got {prompt!r}.")
        for key, mapping in (("files", files), ("hidden_files", hidden)):
            if not isinstance(mapping, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
            ):
                raise ConfigError(f"{where}: '{key}' must map relative paths to text contents.")
            for path in mapping:
                _check_relative(path, where)
        if not isinstance(meta, Mapping):
            raise ConfigError(f"{where}: 'meta' must be an object, got {meta!r}.")
        return cls(str(task_id), prompt, dict(files), dict(meta), dict(hidden))

    def to_dict(self) -> dict[str, Any]:
        """Return the task as a JSON-ready dict."""
        return {
            "id": self.id,
            "prompt": self.prompt,
            "files": dict(self.files),
            "meta": dict(self.meta),
            **({"hidden_files": dict(self.hidden_files)} if self.hidden_files else {}),
        }

    def write_files(self, workspace: Path, *, hidden: bool = False) -> None:
        """Write ``files`` (``hidden_files`` if ``hidden``) under ``workspace``.

        No component of a file's path is resolved through a link (a workspace template
        may hold links): each directory is opened with ``O_NOFOLLOW`` beneath the last.

        Raises:
            ConfigError: A component of a file's path is a link, or not a directory.
            OSError: The write itself failed (no space left, say).
        """
        for rel, content in (self.hidden_files if hidden else self.files).items():
            write_beneath(workspace, rel, content.encode("utf-8"))


def write_beneath(top: Path, rel: str, data: bytes) -> None:
    """Write ``data`` to ``top/rel``, making its directories, following no link on the way.

    Raises:
        ConfigError: A component of ``rel`` is a link, or a file where a directory must be.
    """
    *folders, name = PurePosixPath(rel).parts
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    step = ""
    try:
        for folder in folders:
            step = f"{step}/{folder}" if step else folder
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, dir_fd=fd)
            inner = _open_beneath(fd, folder, os.O_RDONLY | os.O_DIRECTORY, rel, step)
            os.close(fd)
            fd = inner
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        out = _open_beneath(fd, name, flags, rel, rel)
        with open(out, "wb") as stream:
            stream.write(data)
    finally:
        os.close(fd)


def _open_beneath(fd: int, name: str, flags: int, rel: str, step: str) -> int:
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
            raise
        raise ConfigError(
            f"task file {rel!r}: {step!r} in the workspace is a link or not a directory; "
            "task files are never written through links. Remove it from the workspace "
            "template, or write the file elsewhere."
        ) from None


def _check_relative(path: str, where: str) -> None:
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts or "\\" in path:
        raise ConfigError(
            f"{where}: file path {path!r} must be relative and stay inside the workspace."
        )


def load_tasks(
    spec: Sequence[Mapping[str, Any]] | str | os.PathLike[str] | None,
) -> tuple[Task, ...]:
    """Load tasks from a list of dicts or a JSONL file.

    Args:
        spec: A list of task dicts, a path to a JSONL file, or ``None`` for no tasks.

    Returns:
        The tasks, in order.

    Raises:
        ConfigError: The file is missing or unreadable, a line is not JSON, a task is
            invalid, or two tasks share an id.
    """
    if spec is None:
        return ()
    if isinstance(spec, str | os.PathLike):
        path = Path(spec)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"Cannot read tasks file {str(path)!r}: {exc.strerror}.") from exc
        items: list[tuple[str, object]] = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                items.append((f"{path}:{number}", json.loads(line)))
            except ValueError as exc:
                raise ConfigError(f"{path}:{number}: not valid JSON ({exc}).") from exc
    elif isinstance(spec, Sequence):
        items = [(f"tasks[{i}]", item) for i, item in enumerate(spec)]
    else:
        raise ConfigError(f"tasks must be a list of dicts or a JSONL path, got {spec!r}.")
    tasks = tuple(Task.from_dict(item, where) for where, item in items)
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise ConfigError(f"Two tasks have the id {task.id!r}; task ids must be unique.")
        seen.add(task.id)
    return tasks


def pick_task(
    tasks: Sequence[Task], options: Mapping[str, Any], rng: np.random.Generator
) -> Task | None:
    """The task a ``reset(options=...)`` asks for: ``{"task": {...}}``, ``{"task_id": id}``,
    else one of ``tasks`` drawn with ``rng`` (``None`` without tasks).

    Raises:
        ConfigError: No task has the id asked for, or the task dict is malformed.
    """
    if "task" in options:
        return Task.from_dict(options["task"], "options['task']")
    if "task_id" in options:
        wanted = str(options["task_id"])
        for task in tasks:
            if task.id == wanted:
                return task
        known = [t.id for t in tasks]
        raise ConfigError(f"No task has id {wanted!r}; known ids: {known}.")
    if not tasks:
        return None
    return tasks[int(rng.integers(len(tasks)))]


def as_task(task: Any) -> dict[str, Any]:
    """``task`` as a task dict: a dict with ``prompt``, a prompt string, or chat messages
    (the last user message's text is the prompt); an id made from the prompt when it has none.

    Raises:
        ConfigError: ``task`` is none of these.
    """
    if isinstance(task, Mapping) and "prompt" in task:
        found = dict(task)
    elif isinstance(task, str):
        found = {"prompt": task}
    elif isinstance(task, list) and task and all(isinstance(m, Mapping) for m in task):
        users = [m.get("content") for m in task if m.get("role") == "user"]
        if not users or not isinstance(users[-1], str):
            raise ConfigError("chat-message tasks need a last user message with text content.")
        found = {"prompt": users[-1]}
    else:
        raise ConfigError(
            "a task is a dict with 'prompt' (and 'id', 'files', ...), a prompt string, or a "
            f"list of chat messages; got {type(task).__name__}."
        )
    if "id" not in found:
        digest = hashlib.sha256(json.dumps(found["prompt"]).encode()).hexdigest()
        found["id"] = f"prompt-{digest[:12]}"
    return found
