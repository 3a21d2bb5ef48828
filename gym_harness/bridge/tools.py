"""The environment's domain tools: loading, marking, listing and naming.

An env's tools may be given three ways, all turned into one FastMCP server by
:func:`load_tools`:

* a ``fastmcp.FastMCP`` server;
* a list of plain Python callables (sync or async), wrapped into one server;
* an import string ``"package.module:attr"`` naming either of the above, so an
  env rebuilt in a spawned vector worker can find its tools again.

Any of these may be wrapped in :class:`OfferedTools` when the tools a harness is offered
change from episode to episode or turn to turn (a suite whose tasks each use some of its
tools): ``tools/list`` then shows only the tools its ``offered`` callable names.

Marking. A tool carries FastMCP tags; three mean something here:

* ``"internal"`` (:data:`INTERNAL_TAG`): for the env's own use, never served;
* ``"reward"`` (:data:`REWARD_TAG`): part of the reward, never served;
* ``"locked"`` (:data:`LOCKED_TAG`): the bridge runs the tool holding the env's lock.

On a FastMCP server use ``@mcp.tool(tags={"internal"})``; on a plain callable use
the :func:`tool_tags` decorator. Names in :data:`RESERVED_TOOL_NAMES` (the env's
own API and the reward) are never served either: a tool with one is an error.

``fastmcp`` is imported lazily (it costs about a second), so importing this
module is cheap.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from gym_harness.errors import ConfigError, ToolConflictError
from gym_harness.utils.imports import import_attr

if TYPE_CHECKING:
    from fastmcp import FastMCP

__all__ = [
    "INTERNAL_TAG",
    "LOCKED_TAG",
    "OfferedTools",
    "RESERVED_TOOL_NAMES",
    "REWARD_TAG",
    "ToolSpec",
    "load_tools",
    "offered_names",
    "resolve_tool_conflicts",
    "tool_tags",
]

RESERVED_TOOL_NAMES: frozenset[str] = frozenset({"reset", "step", "state", "close", "reward"})
INTERNAL_TAG = "internal"
REWARD_TAG = "reward"
LOCKED_TAG = "locked"
HIDDEN_TAGS: frozenset[str] = frozenset({INTERNAL_TAG, REWARD_TAG})

_TAGS_ATTR = "__gym_harness_tags__"
_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")


@dataclass(frozen=True)
class ToolSpec:
    """What a client sees of one tool, plus its tags.

    Attributes:
        name: The tool's name on its server.
        description: Its description ("" if none).
        input_schema: The JSON schema of its arguments.
        tags: Its FastMCP tags (``"internal"``, ``"reward"``, ``"locked"``, ...).
    """

    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    tags: frozenset[str] = frozenset()

    @property
    def hidden(self) -> bool:
        """True when the tool is internal or part of the reward (never served)."""
        return bool(self.tags & HIDDEN_TAGS)


@dataclass(frozen=True)
class OfferedTools:
    """Tools of which only some are offered at a time.

    The bridge serves every tool of ``tools`` (a call of one is answered whatever the
    offer), but its ``tools/list`` shows only those ``offered()`` names at the moment of
    the listing, in their order on the server. A tool that must refuse calls while it is
    not offered checks that itself.

    Args:
        tools: Anything :func:`load_tools` accepts.
        offered: Called on the bridge's thread at each listing: the original names of the
            tools offered now, or ``None`` for all of them. It must be quick and must not
            raise; it reads state that another thread writes, so that state sits behind a
            lock or is replaced whole.

    Example:
        >>> OfferedTools([add, word_count], lambda: {"add"})  # doctest: +SKIP
    """

    tools: Any
    offered: Callable[[], Collection[str] | None]


def offered_names(spec: Any) -> Callable[[], Collection[str] | None] | None:
    """The ``offered`` callable of an :class:`OfferedTools` spec (``None`` for any other)."""
    return spec.offered if isinstance(spec, OfferedTools) else None


def tool_tags(*tags: str) -> Callable[[_F], _F]:
    """Tag a plain callable for :func:`load_tools` (the FastMCP ``tags=`` of a callable).

    Args:
        *tags: Tags such as :data:`INTERNAL_TAG`, :data:`REWARD_TAG`, :data:`LOCKED_TAG`.

    Returns:
        A decorator that records the tags on the function and returns it unchanged.

    Example:
        >>> @tool_tags(INTERNAL_TAG)
        ... def secret_answer() -> str:
        ...     return "42"
    """

    def mark(fn: _F) -> _F:
        setattr(fn, _TAGS_ATTR, frozenset(getattr(fn, _TAGS_ATTR, frozenset())) | set(tags))
        return fn

    return mark


def resolve_tool_conflicts(
    env_tools: Iterable[str],
    builtin_names: Iterable[str],
    prefix: str = "env_",
) -> dict[str, str]:
    """Decide the name each env tool is served under.

    Args:
        env_tools: The names of the env tools to serve (hidden tools already dropped).
        builtin_names: The harness's own tool names (env tools must not shadow them).
        prefix: Prepended to an env tool whose name clashes with a built-in.

    Returns:
        The mapping served name -> original name, in the order of ``env_tools``.

    Raises:
        ToolConflictError: A tool has a reserved name, two tools share a name, or a
            renamed tool's new name is still taken (reserved, built-in or another tool).
    """
    names = list(env_tools)
    builtins = frozenset(builtin_names)
    reserved = sorted(RESERVED_TOOL_NAMES.intersection(names))
    if reserved:
        raise ToolConflictError(
            f"env tools {reserved} use names reserved for the env's own API "
            f"{sorted(RESERVED_TOOL_NAMES)}; rename them"
        )
    _refuse_duplicates(names)
    kept = {name for name in names if name not in builtins}
    served: dict[str, str] = {}
    for name in names:
        new = prefix + name if name in builtins else name
        if name in builtins and (new in RESERVED_TOOL_NAMES or new in builtins or new in kept):
            raise ToolConflictError(
                f"env tool {name!r} clashes with a harness built-in and its new name "
                f"{new!r} is taken too; rename it or choose another prefix than {prefix!r}"
            )
        served[new] = name
    return served


def _refuse_duplicates(names: list[str]) -> None:
    duplicates = sorted(name for name, count in Counter(names).items() if count > 1)
    if duplicates:
        raise ToolConflictError(
            f"more than one env tool is named {duplicates}; tool names must be unique"
        )


def load_tools(spec: Any) -> FastMCP:
    """Turn a tool spec into one FastMCP server.

    Args:
        spec: A ``fastmcp.FastMCP`` server; a list or tuple of plain callables (tag
            them with :func:`tool_tags`); an import string ``"package.module:attr"``
            whose attribute is one of those two; or an :class:`OfferedTools` of one.

    Returns:
        The server (the same object when ``spec`` is already one).

    Raises:
        ConfigError: The spec is none of the accepted kinds or cannot be imported.
        ToolConflictError: Two callables in the list have the same name.
    """
    from fastmcp import FastMCP

    if isinstance(spec, OfferedTools):
        spec = spec.tools
    named = spec if isinstance(spec, str) else None
    if named is not None:
        spec = import_attr(named, "tools")
    if isinstance(spec, FastMCP):
        return spec
    if isinstance(spec, (list, tuple)) and all(callable(fn) for fn in spec):
        return _wrap_callables(spec)
    raise ConfigError(_not_tools(spec, named))


def _not_tools(value: Any, named: str | None) -> str:
    """What ``value`` is, and what tools must be (for a string, what it must name)."""
    got = _describe(value)
    if isinstance(value, (list, tuple)):
        bad = next(i for i, item in enumerate(value) if not callable(item))
        got += f" whose item {bad} is {_describe(value[bad])}"
    if named is None:
        return (
            "tools must be a FastMCP server, a list of callables or an import string "
            f"'package.module:attr' naming one of those, got {got}."
        )
    module, _, attr = named.partition(":")
    message = (
        f"tools import string {named!r} names {got}; it must name a FastMCP server or "
        "a list of callables."
    )
    if callable(value):
        message += (
            f" For one function, put `TOOLS = [{attr}]` in {module} and pass '{module}:TOOLS'."
        )
    return message


def _describe(value: Any) -> str:
    """``value`` for an error message: its kind, and its name or a short repr."""
    kind = type(value).__name__
    name = getattr(value, "__name__", None)
    if callable(value) and isinstance(name, str):
        return f"the {kind} {name!r}"
    text = repr(value)
    article = "an" if kind[:1] in "aeiou" else "a"
    return f"{article} {kind} ({text[:60]}{'...' if len(text) > 60 else ''})"


def _wrap_callables(functions: Sequence[Callable[..., Any]]) -> FastMCP:
    from fastmcp import FastMCP
    from fastmcp.tools import Tool

    tools = [Tool.from_function(fn, tags=set(getattr(fn, _TAGS_ATTR, ()))) for fn in functions]
    _refuse_duplicates([tool.name for tool in tools])
    return FastMCP("gym-harness-env-tools", tools=tools, on_duplicate="error")
