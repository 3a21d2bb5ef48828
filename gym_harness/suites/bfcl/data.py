"""BFCL's multi-turn data as values: the tasks, their ground truth, the function docs.

The files come from the installed ``bfcl_eval`` package (``bfcl_eval/data/``): each
category's tasks (``BFCL_v4_multi_turn_<category>.json``), its ground truth
(``possible_answer/``) and the function docs of the backends (``multi_turn_func_doc/``),
all JSON lines. They are read as files: no module of ``bfcl_eval`` is imported here (its
package ``__init__`` files are empty, but its other modules pull in what its full
requirements install). A category is read once per process and kept.

BFCL's function docs use its own type names (``dict``, ``float``, ``tuple``, ``any``);
:func:`json_schema` turns a doc's parameters into the JSON schema MCP serves.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym_harness.errors import ConfigError

__all__ = [
    "ADDED_FUNCTIONS_PROMPT",
    "BACKEND_DOCS",
    "BFCL_EVAL_VERSION",
    "CATEGORIES",
    "INSTALL",
    "BFCLTask",
    "SuiteTask",
    "data_dir",
    "function_docs",
    "json_schema",
    "load_category",
    "tasks",
]

#: The multi-turn categories, by the keyword ``category`` takes.
CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
#: The bfcl-eval release this suite is written and tested against.
BFCL_EVAL_VERSION = "2026.3.23"
#: How to install what the suite needs (bfcl-eval's own requirements pin numpy 1.26 and
#: pull faiss and sentence-transformers, none of which the multi-turn suite uses).
INSTALL = (
    "pip install 'gym_harness[bfcl]' && pip install --no-deps "
    f"'bfcl-eval=={BFCL_EVAL_VERSION}' (bfcl-eval's own requirements pin numpy 1.26 and pull "
    "faiss and sentence-transformers; its multi-turn backends and checker need only mpmath)"
)
#: The eight stateful backends of the multi-turn categories: class -> function-doc file.
BACKEND_DOCS: Mapping[str, str] = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}
#: What BFCL's inference sends as the user turn in which withheld functions arrive (its
#: ``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC``; such a turn has no message of its own).
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "list": "array"}


@dataclass(frozen=True)
class SuiteTask:
    """One task of a category as a trainer samples it.

    Attributes:
        id: The task id (``"multi_turn_base_0"``).
        turns: How many user turns the task has.
        prompt: Its first user turn (a rollout's task file wants one per task).
    """

    id: str
    turns: int
    prompt: str = ""

    def to_dict(self) -> dict[str, str]:
        """The task as a line of a rollout's task file: ``{"id", "prompt"}``."""
        return {"id": self.id, "prompt": self.prompt}


@dataclass(frozen=True)
class BFCLTask:
    """One multi-turn task, as BFCL's files give it.

    Attributes:
        id: The task id.
        category: Its category (``"base"``, ...).
        turns: The user message of each turn (a withheld-function turn holds
            :data:`ADDED_FUNCTIONS_PROMPT`, as BFCL's inference sends).
        initial_config: The starting state of each backend, by class name.
        involved_classes: The backends the task uses.
        excluded: Functions never offered.
        missed: Turn index -> the functions withheld until that turn.
        ground_truth: The ground-truth calls of each turn, as BFCL's call strings.
    """

    id: str
    category: str
    turns: tuple[str, ...]
    initial_config: Mapping[str, Any] = field(hash=False, compare=False)
    involved_classes: tuple[str, ...]
    excluded: frozenset[str]
    missed: Mapping[int, tuple[str, ...]] = field(hash=False, compare=False)
    ground_truth: tuple[tuple[str, ...], ...]

    @property
    def entry(self) -> dict[str, Any]:
        """The task as BFCL's checker reads a test entry."""
        return {
            "id": self.id,
            "initial_config": self.initial_config,
            "involved_classes": list(self.involved_classes),
        }

    def offered(self, turn: int) -> frozenset[str]:
        """The function names offered at ``turn`` (from 0): the involved backends'
        functions, less the excluded ones and those withheld until a later turn."""
        names = {doc["name"] for cls in self.involved_classes for doc in function_docs(cls)}
        withheld = {name for at, held in self.missed.items() if at > turn for name in held}
        return frozenset(names - self.excluded - withheld)


def data_dir() -> Path:
    """The ``data`` folder of the installed ``bfcl_eval``.

    Raises:
        ConfigError: bfcl-eval is not installed (the message says how to install it).
    """
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the BFCL suite needs bfcl-eval and mpmath: {INSTALL}")
    if importlib.util.find_spec("mpmath") is None:
        raise ConfigError(f"the BFCL suite needs mpmath (BFCL's MathAPI uses it): {INSTALL}")
    found = Path(next(iter(spec.submodule_search_locations))) / "data"
    if not (found / "multi_turn_func_doc").is_dir():
        raise ConfigError(f"bfcl-eval at {found.parent} has no multi-turn data: {INSTALL}")
    return found


def _lines(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read BFCL's {path.name}: {exc.strerror}. {INSTALL}") from exc
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@functools.cache
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL's function docs of one backend class, in their file's order.

    Raises:
        ConfigError: No such backend, or bfcl-eval is missing.
    """
    if class_name not in BACKEND_DOCS:
        raise ConfigError(f"no BFCL backend {class_name!r}; known: {sorted(BACKEND_DOCS)}")
    return tuple(_lines(data_dir() / "multi_turn_func_doc" / BACKEND_DOCS[class_name]))


@functools.cache
def load_category(category: str) -> tuple[BFCLTask, ...]:
    """Every task of one multi-turn category, in BFCL's order.

    Raises:
        ConfigError: An unknown category, or bfcl-eval is missing.
    """
    if category not in CATEGORIES:
        raise ConfigError(f"category must be one of {list(CATEGORIES)}, got {category!r}")
    name = f"BFCL_v4_multi_turn_{category}.json"
    entries = _lines(data_dir() / name)
    answers = {a["id"]: a["ground_truth"] for a in _lines(data_dir() / "possible_answer" / name)}
    return tuple(_task(category, entry, answers[entry["id"]]) for entry in entries)


def _task(category: str, entry: dict[str, Any], answer: list[list[str]]) -> BFCLTask:
    turns = tuple(
        "\n\n".join(str(m["content"]) for m in messages if m.get("role") == "user")
        or ADDED_FUNCTIONS_PROMPT
        for messages in entry["question"]
    )
    missed = {int(at): tuple(names) for at, names in (entry.get("missed_function") or {}).items()}
    return BFCLTask(
        id=entry["id"],
        category=category,
        turns=turns,
        initial_config=entry.get("initial_config") or {},
        involved_classes=tuple(entry["involved_classes"]),
        excluded=frozenset(entry.get("excluded_function") or ()),
        missed=missed,
        ground_truth=tuple(tuple(calls) for calls in answer),
    )


def tasks(category: str = "base") -> tuple[SuiteTask, ...]:
    """The task ids of a category with their turn counts, so a trainer can sample them.

    Args:
        category: ``"base"``, ``"miss_func"``, ``"miss_param"`` or ``"long_context"``.

    Returns:
        One :class:`SuiteTask` per task, in BFCL's order.

    Raises:
        ConfigError: An unknown category, or bfcl-eval is missing.

    Example:
        >>> [t.id for t in tasks("base")][:2]  # doctest: +SKIP
        ['multi_turn_base_0', 'multi_turn_base_1']
    """
    return tuple(
        SuiteTask(task.id, len(task.turns), task.turns[0]) for task in load_category(category)
    )


def json_schema(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL parameter doc as a JSON schema: ``dict`` is ``object``, ``float`` is
    ``number``, ``tuple`` is ``array``, ``any`` has no type; the rest is kept."""
    schema: dict[str, Any] = {}
    for key, value in parameters.items():
        if key == "type":
            if value != "any":
                schema["type"] = _TYPES.get(str(value), value)
        elif key == "properties" and isinstance(value, Mapping):
            schema[key] = {name: json_schema(sub) for name, sub in value.items()}
        elif key == "items" and isinstance(value, Mapping):
            schema[key] = json_schema(value)
        else:
            schema[key] = value
    if schema.get("type") == "object":
        schema.setdefault("properties", {})
    return schema
