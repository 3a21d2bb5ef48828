"""Imports by name: import strings, and the optional dependencies.

* ``import_attr``: an import string (``"package.module:attr"``) names an object that a
  spawned vector worker (or a Ray actor) can import again by itself.
* ``import_optional``: an optional dependency (an extra of gym_harness), or a
  ``ConfigError`` that names the extra to install. A folder that merely has the
  package's name (Ray's own ``/tmp/ray``, when Python runs in ``/tmp``) imports as an
  empty namespace package; it counts as missing, not as the package.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

from gym_harness.errors import ConfigError

__all__ = ["import_attr", "import_optional"]


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
        hint = ""
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            hint = (
                f" Python looks for {missing!r} on sys.path: the current directory (with "
                "`gym-harness` and `python -m`), your script's directory, PYTHONPATH and the "
                "installed packages; run from the directory that holds it, or add that "
                "directory to PYTHONPATH."
            )
        raise ConfigError(f"Cannot import {what} from {spec!r}: {exc}.{hint}") from exc
    return target


def import_optional(
    module: str, *, extra: str, what: str, needs: Sequence[str] = (), note: str = ""
) -> Any:
    """Import the optional dependency ``module`` (a top-level package), checked to be real.

    Args:
        module: The package's import name (``"ray"``).
        extra: The gym_harness extra that installs it (``"ray"``).
        what: Who needs it, for the message (``"gym_harness.rollout.ray"``).
        needs: Attributes the caller uses; a module without them is not the package.
        note: Added to the install hint (``" (on every node)"``).

    Returns:
        The module.

    Raises:
        ConfigError: It is not installed, only a folder of that name was found, or it
            lacks ``needs``; the message names the extra to install.
    """
    hint = f"{what} needs {module}: pip install 'gym_harness[{extra}]'{note}."
    try:
        found = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(hint) from exc
    if getattr(found, "__file__", None) is None:  # a namespace package: a folder, no package
        if sys.modules.get(module) is found:
            del sys.modules[module]  # so that an import after a chdir finds the real one
        folders = ", ".join(repr(path) for path in getattr(found, "__path__", ()))
        raise ConfigError(
            f"{hint} Only a folder named {module!r} was found ({folders}), which is not "
            f"the package; if {module} is installed, run from another directory."
        )
    missing = [name for name in needs if not hasattr(found, name)]
    if missing:
        raise ConfigError(
            f"{hint} The {module!r} imported from {found.__file__!r} lacks {missing}: "
            "another module of that name shadows the package."
        )
    return found
