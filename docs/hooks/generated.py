"""MkDocs hook: fills the generated parts of the pages (``<!-- generated: ... -->``).

The configuration reference, the env's keywords and each harness's options are read from
the code (``gym_harness.rollout.keywords.expand_generated``) when the site is built, so a
field added to ``HarnessConfig`` appears in the docs without an edit here.
"""

from __future__ import annotations

from typing import Any

from gym_harness.rollout.keywords import expand_generated


def on_page_markdown(markdown: str, **_: Any) -> str:
    return expand_generated(markdown)
