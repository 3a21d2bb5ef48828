"""The checks ``HarnessEnv.__init__`` runs on its own keywords (the harness checks its config)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gym_harness._imports import import_attr
from gym_harness.errors import ConfigError

__all__ = ["check_env_options", "user_callable"]


def check_env_options(
    *,
    render_mode: str | None,
    render_modes: list[str],
    workspace: str | Path | None,
    tool_timeout_s: float,
    capture: bool,
    upstream: str | None,
) -> None:
    """Raise ``ConfigError`` saying what to fix in the first bad keyword, if any."""
    if render_mode not in (None, *render_modes):
        raise ConfigError(f"render_mode must be None or 'ansi', got {render_mode!r}.")
    if workspace is not None and not Path(workspace).is_dir():
        raise ConfigError(f"workspace {str(workspace)!r} is not a directory.")
    if tool_timeout_s <= 0:
        raise ConfigError(f"tool_timeout_s must be > 0, got {tool_timeout_s!r}.")
    if capture and not (isinstance(upstream, str) and upstream.startswith(("http://", "https://"))):
        raise ConfigError(
            f"capture=True (or upstream= with mode='model') needs upstream='http(s)://host[:port]' "
            f"(the real API's origin), got {upstream!r}."
        )


def user_callable(value: Any, what: str) -> Callable[..., Any] | None:
    """``value`` (a callable, an import string ``"pkg.module:attr"``, or ``None``) as a
    callable or ``None``.

    Raises:
        ConfigError: The import fails or ``value`` is not callable.
    """
    if isinstance(value, str):
        value = import_attr(value, what)
    if value is not None and not callable(value):
        raise ConfigError(f"{what} must be a callable or an import string, got {value!r}.")
    return value
