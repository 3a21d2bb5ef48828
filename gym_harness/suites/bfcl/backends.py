"""The live backends of one BFCL episode, and the MCP tools that call them.

At each reset :meth:`Backends.start` makes fresh instances of the task's backend classes
(BFCL's own ``func_source_code`` modules, standard library and mpmath only) and loads
each with the task's ``initial_config``, as BFCL's inference does. :func:`tool_server`
is one FastMCP server holding every function of the eight backends under BFCL's own name
and JSON schema (``multi_turn_func_doc``); the env serves it through
``OfferedTools``, so ``tools/list`` shows only the functions the task offers at its
current turn (:meth:`BFCLTask.offered`): the involved backends' less
``excluded_function`` and any ``missed_function`` still withheld. A call of a function
not offered now is refused, and is not recorded.

Each call offered is run on the episode's instance, its result written as BFCL's
executor writes it (a string as is, a dict as JSON, anything else ``str``), and recorded
as BFCL's call string (``mv(source='a.txt', destination='temp')``) under the turn it
came in, for the checker (:mod:`~gym_harness.suites.bfcl.checker`).

Threads: the caller's thread starts an episode and moves its turn on; the bridge's loop
runs the calls and the listings. Everything they share sits behind one lock; the tools
return no result types for a validator to refuse (BFCL's return hints are loose, and
results may hold mpmath numbers).
"""

from __future__ import annotations

import copy
import importlib
import json
import keyword
import math
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeGuard

from gym_harness.suites.bfcl.data import BACKEND_DOCS, BFCLTask, function_docs, json_schema

if TYPE_CHECKING:
    from fastmcp import FastMCP

__all__ = ["Backends", "call_string", "tool_server"]

_MODULES = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
#: Backends BFCL keeps without a scenario to load.
_STATELESS = frozenset({"MathAPI"})
#: Longest call string recorded; a longer call is refused (its arguments come from the
#: harness, and BFCL's checker evaluates the string).
MAX_CALL_CHARS = 1 << 20
#: Calls recorded per turn at most; later ones still run, unrecorded (BFCL's inference
#: stops a turn after 20 model steps).
MAX_CALLS_PER_TURN = 256
#: Most digits a call may ask of the Math API: BFCL's functions compute what they are
#: asked in one C call that holds the interpreter (``round(5, -10**7)`` or
#: ``10 ** 10**9`` runs for minutes, ``mpmath`` at a million digits as long), and the
#: bridge's loop, this env's process and BFCL's checker (which runs the recorded calls
#: again) would wait on it. A call past the bound is refused, unrecorded.
MAX_DIGITS = 1000
#: The arguments that set how many digits a function computes.
_DIGIT_ARGUMENTS = ("precision", "decimal_places")


def call_string(name: str, arguments: Mapping[str, Any]) -> str:
    """One call as BFCL's decoded call string: ``name(key=repr(value), ...)``."""
    return f"{name}({', '.join(f'{key}={value!r}' for key, value in arguments.items())})"


def new_instances(task: BFCLTask) -> dict[str, Any]:
    """Fresh instances of ``task``'s backends, each loaded with its initial state."""
    long_context = "long_context" in task.category
    instances: dict[str, Any] = {}
    for class_name in task.involved_classes:
        # Each backend's module is named as its function-doc file.
        module = importlib.import_module(f"{_MODULES}.{BACKEND_DOCS[class_name][:-5]}")
        instance = getattr(module, class_name)()
        if class_name not in _STATELESS:
            config = copy.deepcopy(task.initial_config.get(class_name, {}))
            instance._load_scenario(config, long_context=long_context)
        instances[class_name] = instance
    return instances


def result_text(result: Any) -> str:
    """A backend's result as BFCL's executor writes it."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


class Backends:
    """The backend instances of the episode under way, its turn, and its calls.

    Threads: :meth:`start` and :meth:`advance` run on the caller's thread; :meth:`call`
    and :meth:`offered` on the bridge's loop. All state sits behind one lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._task: BFCLTask | None = None
        self._methods: dict[str, Any] = {}
        self._offer: frozenset[str] = frozenset()
        self._turn = 0
        self._calls: list[list[str]] = []

    @property
    def turn(self) -> int:
        """The turn under way (from 0)."""
        return self._turn

    def start(self, task: BFCLTask) -> None:
        """Begin an episode of ``task``: fresh instances, turn 0, no calls."""
        instances = new_instances(task)
        methods = {
            doc["name"]: getattr(instances[class_name], doc["name"])
            for class_name in task.involved_classes
            for doc in function_docs(class_name)
        }
        with self._lock:
            self._task, self._methods, self._turn = task, methods, 0
            self._calls = [[]]
            self._offer = task.offered(0)

    def advance(self, turn: int) -> None:
        """Move on to ``turn`` (from 0): its calls are recorded apart, its tools offered."""
        with self._lock:
            if self._task is None or turn <= self._turn:
                return
            while len(self._calls) <= turn:
                self._calls.append([])
            self._turn = turn
            self._offer = self._task.offered(turn)

    def offered(self) -> frozenset[str]:
        """The function names offered now (none between episodes)."""
        return self._offer

    def calls(self) -> list[list[str]]:
        """The call strings recorded so far, per turn."""
        with self._lock:
            return [list(turn) for turn in self._calls]

    def call(self, name: str, arguments: Mapping[str, Any]) -> tuple[str, bool]:
        """Run one call of the harness on the episode's instance.

        Returns:
            ``(text, is_error)``: the result as BFCL writes it, or why the call failed.
        """
        # BFCL's checker evaluates the call string: only identifiers as argument names (the
        # values are JSON, written as Python literals by repr).
        bad = [k for k in arguments if not (k.isidentifier() and not keyword.iskeyword(k))]
        if bad:
            return f"Error: argument names must be identifiers, got {bad[:3]!r}.", True
        text = call_string(name, arguments)
        if len(text) > MAX_CALL_CHARS:
            return f"Error: the call is over {MAX_CALL_CHARS} characters long.", True
        too_many = _digits_asked(name, arguments)
        if too_many:
            return f"Error: {too_many}: this suite computes at most {MAX_DIGITS} digits.", True
        with self._lock:
            method = self._methods.get(name) if name in self._offer else None
            if method is None:
                return f"Error: the function {name!r} is not available in this task now.", True
            if len(self._calls[self._turn]) < MAX_CALLS_PER_TURN:
                self._calls[self._turn].append(text)
            try:
                return result_text(method(**arguments)), False
            except Exception as exc:  # BFCL's executor reports a failed call the same way
                return f"Error during execution: {exc}", True


def _digits_asked(name: str, arguments: Mapping[str, Any]) -> str:
    """The argument of a call that asks for more than ``MAX_DIGITS`` digits, or ""."""
    for key in _DIGIT_ARGUMENTS:
        value = arguments.get(key)
        if _is_number(value) and not abs(value) <= MAX_DIGITS:  # NaN too
            return f"{key}={value!r}"
    if name == "power":
        base, exponent = arguments.get("base"), arguments.get("exponent")
        # Only an integer power is exact, so only its digits grow with the exponent (the
        # bound is compared as an int to a float: an exponent of any size, no overflow).
        if (
            _is_integer(base)
            and _is_integer(exponent)
            and abs(base) > 1
            and exponent > MAX_DIGITS / math.log10(abs(base))
        ):
            return f"base={base!r} to exponent={exponent!r}"
    return ""


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_integer(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def tool_server(backends: Backends) -> FastMCP:
    """Every function of the eight backends as one FastMCP server calling ``backends``."""
    from fastmcp import FastMCP

    cls = _bfcl_tool_class()
    tools = []
    for class_name in BACKEND_DOCS:
        for doc in function_docs(class_name):
            tool = cls(
                name=doc["name"],
                description=str(doc.get("description", "")),
                parameters=json_schema(doc.get("parameters") or {"type": "dict"}),
            )
            tool._backends = backends
            tools.append(tool)
    return FastMCP("bfcl-backends", tools=tools, on_duplicate="error")


_BFCL_TOOL: type | None = None


def _bfcl_tool_class() -> type:
    global _BFCL_TOOL
    if _BFCL_TOOL is None:
        from fastmcp.exceptions import ToolError
        from fastmcp.tools import Tool, ToolResult
        from mcp.types import TextContent
        from pydantic import PrivateAttr

        class BFCLTool(Tool):
            """One backend function: BFCL's schema, no output schema, run on the loop
            (the backends are in-memory and quick)."""

            _backends: Any = PrivateAttr(default=None)

            async def run(self, arguments: dict[str, Any]) -> ToolResult:
                text, is_error = self._backends.call(self.name, arguments)
                if is_error:
                    raise ToolError(text)
                return ToolResult(content=[TextContent(type="text", text=text)])

        _BFCL_TOOL = BFCLTool
    return _BFCL_TOOL
