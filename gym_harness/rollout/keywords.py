"""Every keyword an env takes, with its type, default and documentation, read from the code.

The keywords of ``gymnasium.make(ID, ...)`` / ``HarnessEnv(...)`` come from four places:
gymnasium's own (``max_episode_steps`` ...), ``HarnessEnv``'s keyword-only parameters,
the harness adapter's constructor, and the ``HarnessConfig`` fields. This module reads
them from the signatures and dataclass fields, and their one-line descriptions from the
``Args:`` sections of the docstrings, so a field added to ``HarnessConfig`` (with its
``Args:`` line) shows up in ``gym-harness run --list-keywords`` and in the
documentation's configuration reference without a second edit::

    >>> [k.name for k in config_fields()][:3]
    ['command', 'cwd', 'env']
    >>> keywords = keywords_of("gym_harness/Reference-v0")
    >>> timeout = next(k for k in keywords if k.name == "turn_timeout_s")
    >>> timeout.group, timeout.type, timeout.default
    ('HarnessConfig', 'float', '900.0')
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium

from gym_harness.config import FIELD_NAMES, HarnessConfig
from gym_harness.env import HarnessEnv
from gym_harness.errors import ConfigError
from gym_harness.harnesses.registry import closest_name, harness_class
from gym_harness.utils.docstrings import arg_docs

__all__ = [
    "Keyword",
    "check_keywords",
    "config_fields",
    "env_keywords",
    "expand_generated",
    "format_keywords",
    "harness_options",
    "keywords_of",
    "keywords_text",
    "markdown_table",
]

_MIB = 1024 * 1024
#: ``gymnasium.make``'s own keywords that apply to a harness env: name, type, description.
_MAKE_KEYWORDS = {
    "max_episode_steps": (
        "int | None",
        "Steps (turns; in model mode, model calls) before gymnasium's TimeLimit truncates "
        "the episode; None for no limit.",
    ),
    "disable_env_checker": (
        "bool | None",
        "True skips gymnasium's env checker wrapper (it checks the first reset and step).",
    ),
}


@dataclass(frozen=True)
class Keyword:
    """One keyword: where it goes, its name, type, default (as text) and description.

    Args:
        group: Who takes it: ``"HarnessConfig"``, ``"HarnessEnv"``, ``"harness 'NAME'"``
            or ``"gymnasium.make"``.
        name: The keyword.
        type: Its annotation, as written in the code.
        default: Its default, as Python text (``"required"`` when there is none).
        doc: Its description, on one line.
    """

    group: str
    name: str
    type: str
    default: str
    doc: str


def config_fields(config: HarnessConfig | None = None) -> list[Keyword]:
    """The fields of ``HarnessConfig``, with ``config``'s values as defaults.

    Args:
        config: Whose values are shown as the defaults (a harness's ``default_config()``);
            ``None`` for the dataclass's own defaults.
    """
    docs = arg_docs(HarnessConfig.__doc__)
    config = config if config is not None else HarnessConfig()
    return [
        Keyword(
            "HarnessConfig",
            field.name,
            str(field.type),
            _show(field.name, getattr(config, field.name)),
            docs.get(field.name, ""),
        )
        for field in dataclasses.fields(HarnessConfig)
    ]


def env_keywords(registered: Mapping[str, Any] | None = None) -> list[Keyword]:
    """``HarnessEnv``'s keywords (``harness`` and the keyword-only parameters), with
    ``registered`` (an env id's registered keywords) as their defaults."""
    return _parameters("HarnessEnv", HarnessEnv, [HarnessEnv], registered or {})


def harness_options(name: str) -> list[Keyword]:
    """The options the harness registered as ``name`` takes (its constructor's keywords).

    Raises:
        ConfigError: No harness has that name.
    """
    cls = harness_class(name)
    return _parameters(f"harness {name!r}", cls, cls.__mro__, {})


def keywords_of(env_id: str) -> list[Keyword]:
    """Every keyword ``gymnasium.make(env_id, ...)`` takes, with that id's defaults.

    Raises:
        ConfigError: ``env_id`` is not a gym_harness env id.
    """
    try:
        spec = gymnasium.spec(env_id)
    except gymnasium.error.Error as exc:
        raise ConfigError(str(exc)) from exc
    registered = dict(spec.kwargs)
    harness = registered.get("harness")
    if not isinstance(harness, str) or spec.entry_point != "gym_harness.env:HarnessEnv":
        raise ConfigError(f"{env_id!r} is not a gym_harness env id.")
    make = [
        Keyword("gymnasium.make", name, kind, repr(getattr(spec, name)), doc)
        for name, (kind, doc) in _MAKE_KEYWORDS.items()
    ]
    try:
        defaults: HarnessConfig | None = harness_class(harness)().default_config()
    except (ConfigError, TypeError):  # a harness that needs options has no defaults alone
        defaults = None
    return [
        *make,
        *env_keywords(registered),
        # An option named like a config field never reaches the harness: the config takes it.
        *(k for k in harness_options(harness) if k.name not in FIELD_NAMES),
        *config_fields(defaults),
    ]


def format_keywords(keywords: Sequence[Keyword], width: int = 100) -> str:
    """The keywords as text for a terminal: a block per group, a wrapped entry per keyword."""
    lines: list[str] = []
    group = None
    for keyword in keywords:
        if keyword.group != group:
            group = keyword.group
            lines += ["", f"{group}:"]
        lines.append(f"  {keyword.name}: {keyword.type} = {keyword.default}")
        if keyword.doc:
            lines += textwrap.wrap(
                keyword.doc, width, initial_indent=" " * 6, subsequent_indent=" " * 6
            )
    return "\n".join(lines).lstrip("\n") + "\n"


def markdown_table(keywords: Sequence[Keyword]) -> str:
    """The keywords as a Markdown table: name, type, default, description (one row each)."""
    rows = ["| keyword | type | default | description |", "| --- | --- | --- | --- |"]
    for k in keywords:
        code = [_code(str(value)) for value in (k.name, k.type, k.default)]
        doc = re.sub(r"`([^`]*)`", lambda m: _code(m[1]), _markdown(k.doc))
        rows.append("| " + " | ".join([*code, doc.replace("|", "\\|")]) + " |")
    return "\n".join(rows) + "\n"


def _code(text: str) -> str:
    """``text`` as inline code in a table cell: a ``|`` in it is an entity, since a code
    span would show the ``\\|`` that keeps the table's columns apart."""
    return "<code>" + html.escape(text).replace("|", "&#124;") + "</code>"


def keywords_text(env_id: str) -> str:
    """``gym-harness run --list-keywords``: every keyword of ``env_id``, grouped by who takes it.

    Raises:
        ConfigError: ``env_id`` is not a gym_harness env id.
    """
    head = f"Keywords of {env_id} (gym-harness --set KEY=VALUE, gymnasium.make(..., KEY=VALUE)):"
    return head + "\n\n" + format_keywords(keywords_of(env_id))


def check_keywords(env_id: str, kwargs: Mapping[str, Any]) -> None:
    """Refuse a keyword ``env_id`` does not take; the message leads with the likeliest one
    meant and points to ``--list-keywords`` (an id that is not gym_harness's is not checked).

    Raises:
        ConfigError: A keyword no part of the env takes.
    """
    if not kwargs:
        return
    try:
        known = [keyword.name for keyword in keywords_of(env_id)]
    except ConfigError:  # not a gym_harness id: gymnasium.make says what is wrong
        return
    unknown = [key for key in kwargs if key not in known]
    if not unknown:
        return
    hints = [
        f"did you mean {close!r}{'' if len(unknown) == 1 else f' for {key!r}'}?"
        for key in unknown
        if (close := closest_name(key, known)) is not None
    ]
    names = ("keyword " if len(unknown) == 1 else "keywords ") + ", ".join(map(repr, unknown))
    raise ConfigError(
        f"unknown {names} for {env_id}{': ' + ' '.join(hints) if hints else '.'} "
        f"`gym-harness run --env {env_id} --list-keywords` lists every keyword."
    )


#: A page's placeholder for a generated table: ``<!-- generated: WHAT [ARG] -->``.
_GENERATED = re.compile(r"^<!-- generated: ([\w-]+)(?: (\w+))? -->$", re.MULTILINE)


def expand_generated(markdown: str) -> str:
    """Replace each ``<!-- generated: WHAT [ARG] -->`` line of a docs page with its table.

    ``config-reference``: every ``HarnessConfig`` field; ``env-keywords``: ``HarnessEnv``'s
    keywords; ``harness-options NAME``: the options of the harness registered as ``NAME``.
    The documentation site's build runs this on every page (``docs/hooks/generated.py``).

    Raises:
        ConfigError: A placeholder names nothing this knows (the build then fails).
    """

    def table(match: re.Match[str]) -> str:
        what, arg = match.group(1), match.group(2)
        if what == "config-reference" and arg is None:
            return markdown_table(config_fields())
        if what == "env-keywords" and arg is None:
            return markdown_table(env_keywords())
        if what == "harness-options" and arg is not None:
            options = [k for k in harness_options(arg) if k.name not in FIELD_NAMES]
            return markdown_table(options) if options else "No options of its own.\n"
        raise ConfigError(f"unknown generated table {match.group(0)!r}")

    return _GENERATED.sub(table, markdown)


def _parameters(
    group: str, callable_: Any, documented: Iterable[Any], registered: Mapping[str, Any]
) -> list[Keyword]:
    """The keyword parameters of ``callable_``, documented by the first class in
    ``documented`` whose docstring's ``Args:`` names them."""
    docs: dict[str, str] = {}
    for cls in documented:
        for name, text in arg_docs(cls.__doc__).items():
            docs.setdefault(name, text)
    found = []
    for param in inspect.signature(callable_).parameters.values():
        if param.kind not in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD):
            continue  # self, *args, **kwargs
        if param.name in registered:
            default = _show(param.name, registered[param.name])
        elif param.default is param.empty:
            default = "required"
        else:
            default = _show(param.name, param.default)
        found.append(
            Keyword(group, param.name, str(param.annotation), default, docs.get(param.name, ""))
        )
    return found


def _show(name: str, value: Any) -> str:
    """A default as Python text; byte counts also in MiB."""
    if isinstance(value, dict):
        value = dict(value)
    text = repr(value)
    if name.endswith("_bytes") and isinstance(value, int) and value % _MIB == 0:
        text = f"{text} ({value // _MIB} MiB)"
    return text


def _markdown(doc: str) -> str:
    """A docstring line in Markdown: ``double backquotes`` become single ones."""
    return doc.replace("``", "`")
