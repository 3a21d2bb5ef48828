"""Reading Google-style docstrings: the ``Args:`` section, one line per name.

The configuration reference (``docs/configuration.md``) and ``gym-harness run
--list-keywords`` are built from the docstrings of ``HarnessConfig``, ``HarnessEnv`` and
the harness classes, so a field documented once is documented everywhere::

    >>> doc = '''Do things.
    ...
    ...     Args:
    ...         turn_timeout_s: Wall-clock budget of one turn.
    ...             More text.
    ...         **kwargs: Anything else.
    ...
    ...     Raises:
    ...         ValueError: never.
    ...     '''
    >>> arg_docs(doc)
    {'turn_timeout_s': 'Wall-clock budget of one turn. More text.', 'kwargs': 'Anything else.'}
"""

from __future__ import annotations

import inspect
import re

__all__ = ["arg_docs"]

#: A section header of a Google docstring (``Args:``, ``Returns:`` ...).
_SECTION = re.compile(r"^([A-Z][A-Za-z ]*):\s*$")
#: One argument's first line: ``name: text`` or ``name (type): text``.
_ARG = re.compile(r"^\*{0,2}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$")


def arg_docs(doc: str | None) -> dict[str, str]:
    """The ``Args:`` section of a Google-style docstring: name -> its text on one line.

    Continuation lines are joined with single spaces; ``*args`` / ``**kwargs`` lose their
    stars. A docstring without an ``Args:`` section gives ``{}``.

    Args:
        doc: The docstring (``obj.__doc__``), indented or not.

    Returns:
        The documented names, in their order, each with its whole text.
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    found: dict[str, list[str]] = {}
    in_args, indent, current = False, None, None
    for line in lines:
        header = _SECTION.match(line)
        if header and not line.startswith(" "):
            in_args = header.group(1) in ("Args", "Arguments", "Attributes")
            indent, current = None, None
            continue
        if not in_args or not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        if indent is None:
            indent = width
        if width == indent:
            match = _ARG.match(line.strip())
            if match:
                current = match.group(1)
                found[current] = [match.group(2)]
                continue
        if current is not None and width > indent:
            found[current].append(line.strip())
    return {name: " ".join(part for part in parts if part) for name, parts in found.items()}
