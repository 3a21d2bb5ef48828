"""Griffe extension for the API reference: an ``Example:`` section is an examples section.

The Google style that griffe reads knows ``Examples:`` (plural) as the section whose
``>>>`` lines are rendered as code; the package's docstrings say ``Example:``, which griffe
would otherwise render as an admonition of Markdown, its ``>>>`` lines as nested quotes.
The docstrings stay as they are (their doctests read them); the site gets the plural.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_SINGULAR = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Renames each docstring's ``Example:`` heading to ``Examples:`` as griffe loads it."""

    def on_instance(self, *, obj: griffe.Object, **_: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _SINGULAR.sub(r"\g<indent>Examples:", obj.docstring.value)
