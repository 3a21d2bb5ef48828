"""Codex's configuration: a quiet, offline-safe ``config.toml`` and model catalog entries.

Shared by ``CodexHarness`` (``codex app-server``) and the codex-acp preset.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gym_harness.harnesses._common import toml_document

__all__ = ["DEFAULT_OPENAI_BASE", "KNOWN_MODELS", "catalog_entry", "codex_config"]

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


def codex_config(
    *,
    model: str | None,
    base_url: str,
    key_var: str,
    sandbox: str,
    catalog_path: Path | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """The ``config.toml`` of a quiet, offline-safe Codex pointed at ``base_url``.

    Args:
        model: The model name, or ``None`` for Codex's default.
        base_url: The Responses API base URL (``.../v1``).
        key_var: The variable Codex reads the API key from.
        sandbox: The ``sandbox_mode``.
        catalog_path: A ``model_catalog_json`` file, for a model Codex does not know.
        extra: More keys merged over these (nested dicts are tables).

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
