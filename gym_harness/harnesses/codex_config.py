"""Codex's set-up: a quiet, offline-safe ``config.toml``, model catalog entries, the binary.

The configuration is shared by ``CodexHarness`` (``codex app-server``) and the
codex-acp preset; ``native_codex`` finds the binary npm's launcher would start.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gym_harness.harnesses._common import toml_document

__all__ = [
    "DEFAULT_OPENAI_BASE",
    "KNOWN_MODELS",
    "POLICY_MODEL",
    "catalog_entry",
    "codex_config",
    "native_codex",
]

#: Where Codex sends requests when no base URL is given.
DEFAULT_OPENAI_BASE = "https://api.openai.com/v1"

#: Model names in the catalog bundled with Codex 0.171.0 (``codex debug models``).
#: A ``model_catalog_json`` replaces that catalog, so it is written only for other names.
KNOWN_MODELS = frozenset(
    {
        "gpt-6.2-sol", "gpt-6.2-astra", "gpt-6-astra", "gpt-6.1-sol", "gpt-6.1-terra",
        "gpt-6-sol", "gpt-6-luna", "gpt-5.6-sol", "gpt-5.6-terra", "gpt-5.6-luna",
        "gpt-daybreak-blue-latest", "gpt-daybreak-red-latest", "gpt-5.5", "codex-auto-review",
    }
)  # fmt: skip

#: The model name Codex asks for in model mode when none is given. Codex 0.171.0's default
#: model (gpt-6.2-sol) sends no function tools: it offers MCP tools only inside the
#: JavaScript of its ``exec`` tool, so a policy would see none of the env's. Under this
#: name, with its catalog entry (``catalog_entry``), the env tools are functions.
POLICY_MODEL = "gym-harness-policy"


def codex_config(
    *,
    model: str | None,
    base_url: str,
    key_var: str,
    sandbox: str,
    catalog_path: Path | None = None,
    extra: Mapping[str, Any] | None = None,
    stream_idle_timeout_ms: int | None = None,
) -> str:
    """The ``config.toml`` of a quiet, offline-safe Codex pointed at ``base_url``.

    Args:
        model: The model name, or ``None`` for Codex's default.
        base_url: The Responses API base URL (``.../v1``).
        key_var: The variable Codex reads the API key from.
        sandbox: The ``sandbox_mode``.
        catalog_path: A ``model_catalog_json`` file, for a model Codex does not know.
        extra: More keys merged over these (nested dicts are tables).
        stream_idle_timeout_ms: How long Codex waits between stream events (model mode:
            long enough for the policy), or ``None`` for its default.

    Returns:
        The TOML text.
    """
    doc: dict[str, Any] = {
        "model_provider": "gym_harness",
        "approval_policy": "never",
        "sandbox_mode": sandbox,
        "check_for_update_on_startup": False,
        # Each of these otherwise reaches for a public host at start.
        "features": {"plugins": False},
        "analytics": {"enabled": False},
        "feedback": {"enabled": False},
        "otel": {"exporter": "none"},
        "model_providers": {
            "gym_harness": {
                "name": "gym_harness",
                "base_url": base_url,
                "wire_api": "responses",
                "env_key": key_var,
                # A retry hides a failing model behind a stall; the env reports it instead.
                "request_max_retries": 0,
                "stream_max_retries": 0,
            }
        },
    }
    if model:
        doc["model"] = model
    if stream_idle_timeout_ms is not None:
        doc["model_providers"]["gym_harness"]["stream_idle_timeout_ms"] = stream_idle_timeout_ms
    if catalog_path is not None:
        doc["model_catalog_json"] = str(catalog_path)
    return toml_document(_merge(doc, extra or {}))


def catalog_entry(model: str) -> dict[str, Any]:
    """A ``model_catalog_json`` entry for ``model``, modelled on Codex 0.171.0's gpt-5.5.

    Without one Codex warns about the unknown model and hides MCP tools behind a
    ``tool_search`` tool (``supports_search_tool`` is false here for that reason).
    """
    return {
        "slug": model,
        "display_name": model,
        "description": "Configured by gym_harness.",
        "default_reasoning_level": "medium",
        "supported_reasoning_levels": [
            {"effort": e, "description": e} for e in ("low", "medium", "high")
        ],
        "shell_type": "unified_exec",
        "visibility": "list",
        "supported_in_api": True,
        "priority": 0,
        "availability_nux": None,
        "upgrade": None,
        "base_instructions": _BASE_INSTRUCTIONS,
        "include_skills_usage_instructions": False,
        "include_plugin_usage_instructions": False,
        "include_apps_usage_instructions": False,
        "default_reasoning_summary": "none",
        "support_verbosity": False,
        "default_verbosity": None,
        "apply_patch_tool_type": "freeform",
        "web_search_tool_type": "text_and_image",
        "truncation_policy": {"mode": "tokens", "limit": 10000},
        "supports_image_detail_original": False,
        "context_window": 128000,
        "max_context_window": 128000,
        "effective_context_window_percent": 95,
        "experimental_supported_tools": [],
        "input_modalities": ["text"],
        "supports_search_tool": False,
        "supports_experimental_context": False,
        "use_responses_lite": False,
        "supports_reasoning_effort_updates": False,
        "node_repl_auto_review_required": False,
        "node_repl_disabled": False,
    }


_BASE_INSTRUCTIONS = (
    "You are Codex, a coding agent. You and the user share a workspace: read files, run "
    "commands and use the tools you are given to complete the user's task, then reply "
    "with a concise account of what you did."
)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


#: (sys.platform, machine) -> the npm platform package and the target triple in it.
_NATIVE = {
    ("linux", "x86_64"): ("codex-linux-x64", "x86_64-unknown-linux-musl"),
    ("linux", "aarch64"): ("codex-linux-arm64", "aarch64-unknown-linux-musl"),
    ("darwin", "x86_64"): ("codex-darwin-x64", "x86_64-apple-darwin"),
    ("darwin", "arm64"): ("codex-darwin-arm64", "aarch64-apple-darwin"),
}


def native_codex(executable: str, path: str | None = None) -> tuple[str, str] | None:
    """The native binary that npm's ``codex`` launcher would start, if it is installed.

    Looks where the launcher looks: the platform package (``@openai/codex-linux-x64``
    ...) next to ``@openai/codex`` or inside its own ``node_modules``, then the
    package's own ``vendor`` directory.

    Args:
        executable: ``"codex"`` (looked up on ``path``) or a path to it.
        path: The ``PATH`` to search; ``None`` for ours.

    Returns:
        ``(binary, package_root)``, or ``None`` when ``executable`` is not the node
        launcher (a native ``codex`` already, say) or the binary is not found.
    """
    found = executable if os.sep in executable else shutil.which(executable, path=path)
    if not found:
        return None
    launcher = Path(found).resolve()
    package = launcher.parent.parent
    if launcher.suffix != ".js" or not (package / "package.json").is_file():
        return None
    known = _NATIVE.get((sys.platform, platform.machine()))
    if known is None:
        return None
    name, triple = known
    for vendor in (
        package.parent / name / "vendor",
        package / "node_modules" / "@openai" / name / "vendor",
        package / "vendor",
    ):
        binary = vendor / triple / "bin" / "codex"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary), str(package)
    return None
