"""Import strings: ``"package.module:attr"`` names an object that a spawned
vector worker (or a Ray actor) can import again by itself."""

from __future__ import annotations

import importlib
from typing import Any

from gym_harness.errors import ConfigError

__all__ = ["import_attr"]


def import_attr(spec: str, what: str) -> Any:
    """Import the object ``"package.module:attr"`` names (``attr`` may be dotted).

    Args:
        spec: The import string.
        what: What it is for, for the error message ("tools", "reward_fn" ...).

    Raises:
        ConfigError: ``spec`` is not of that form, or the import fails.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{what} import string {spec!r} must look like 'package.module:attr'.")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"Cannot import {what} from {spec!r}: {exc}.") from exc
    return target
