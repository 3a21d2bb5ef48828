"""Helpers shared by the adapters that drive real harness CLIs.

Small on purpose; every adapter for a real CLI (Claude Code, Codex, the ACP
agents) needs the same few things:

* ``private_home_env``: HOME and the XDG directories inside the episode's
  private ``home``, so a CLI never reads or writes the user's own config.
* ``scrub_inherit`` / ``present``: decide which of the user's variables pass
  through (``HarnessConfig.inherit_env`` carries names only, so a secret the
  user already exported never lands in a config that may be recorded).
* ``write_private``: write a config file readable by its owner only (0600):
  bridge tokens go there or in the environment, never in argv.
* ``json_line`` / ``parse_object``: one JSON object per line, both ways (parsing
  through the one bounded parser, ``gym_harness.utils.bounded_json``); ``not_json`` is the
  ``protocol_error`` for a line that is not one, naming the bound it broke.
* ``turn_failed``: the ``Feed`` of a turn the harness itself reports as failed;
  ``tools_not_loaded``: the message of a harness that did not load the env tools.
* ``content_text``: the text of a tool result's or a message's content, in any
  of the dialects' shapes; ``usage_data``: camelCase usage counters (Codex, ACP)
  under the ``llm_usage`` names.
* ``RpcIds``: JSON-RPC request ids and what each pending request was for.
* ``toml_document``: a config dict as TOML (Codex and codex-acp read ``config.toml``).
* ``require_executable`` / ``require_key``: the checks of ``Harness.preflight``, whose
  errors say how to install the CLI or which variable to set.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gym_harness.config import HarnessConfig
from gym_harness.errors import ConfigError, ProtocolError
from gym_harness.harnesses.base import EpisodeContext, Feed
from gym_harness.outcome import Outcome
from gym_harness.records.events import EventType, HarnessEvent
from gym_harness.utils import bounded_json

__all__ = [
    "MODEL_KEY_VAR",
    "NPM_PACKAGES",
    "USAGE_NAMES",
    "RpcIds",
    "content_text",
    "json_line",
    "not_json",
    "api_ports",
    "openai_base",
    "parse_object",
    "present",
    "private_home_env",
    "require_executable",
    "require_key",
    "scrub_inherit",
    "toml_document",
    "tools_not_loaded",
    "turn_failed",
    "usage_data",
    "write_private",
]


def private_home_env(home: Path) -> dict[str, str]:
    """Environment variables that keep a CLI's files inside ``home``.

    Args:
        home: The episode's private home directory.

    Returns:
        ``HOME`` and the XDG config/cache/data/state directories under ``home``.
    """
    return {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
    }


def api_ports(ctx: EpisodeContext, base_url: str | None) -> tuple[int, ...]:
    """The TCP port a CLI's own model API is on, for its confinement; ``()`` when the env
    gives it the model endpoint (``ctx.model_base_url``, an env endpoint already).

    Args:
        ctx: The episode.
        base_url: The API the CLI calls without the env; ``None``: its provider's, on HTTPS.
    """
    if ctx.model_base_url:
        return ()
    parts = urlsplit(base_url or "https://")
    return (parts.port or (80 if parts.scheme == "http" else 443),)


def scrub_inherit(
    inherit_env: Iterable[str], drop: Iterable[str] = (), add: Iterable[str] = ()
) -> tuple[str, ...]:
    """Return ``inherit_env`` without the names matching ``drop``, plus ``add``.

    Args:
        inherit_env: The names the config lets through.
        drop: Names or shell patterns (``"CLAUDE_CODE_*"``) to remove; they win over ``add``.
        add: Names to let through as well (kept once, in order).

    Returns:
        The new tuple of names.
    """
    patterns = tuple(drop)
    kept: list[str] = []
    for name in (*inherit_env, *add):
        if name in kept or any(fnmatch.fnmatchcase(name, p) for p in patterns):
            continue
        kept.append(name)
    return tuple(kept)


def present(names: Iterable[str], environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The subset of ``names`` set (non-empty) in ``environ`` (default ``os.environ``)."""
    source = os.environ if environ is None else environ
    return tuple(name for name in names if source.get(name))


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` readable and writable by its owner only (0600).

    The mode is set at creation (and again on an existing file), so there is no
    moment when another local user could read a token in it.

    Args:
        path: The file to write; its directory is created (0700) if missing.
        text: The content, written as UTF-8.

    Returns:
        ``path``.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            fd = -1  # the file object owns it now
            handle.write(text)
    finally:
        if fd >= 0:
            os.close(fd)
    return path


def json_line(obj: Mapping[str, Any]) -> str:
    """One compact JSON line (no newline; non-ASCII kept as is)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def parse_object(line: str) -> tuple[dict[str, Any] | None, str]:
    """Parse ``line`` as one JSON object, within the bounds of ``gym_harness.utils.bounded_json``.

    Returns:
        ``(obj, "")``, or ``(None, why)`` when it is anything else (``why`` names
        the bound a line broke: nesting depth, ``max_line_bytes``, digit count).
    """
    return bounded_json.parse_object(line)


def not_json(who: str, line: str, why: str = "not JSON") -> ProtocolError:
    """The ``protocol_error`` for a stdout line that is not a JSON object (to raise).

    Args:
        who: The harness as the message names it (``"codex"``, ``"the ACP agent"``).
        line: The line; its first 200 characters are quoted.
        why: What is wrong with it (``parse_object``'s reason).
    """
    return ProtocolError(
        f"{who} printed a line on stdout that is not one JSON object ({why}): {line[:200]!r}"
    )


def content_text(content: Any) -> str:
    """The text of content as the harnesses report it, in any dialect's shape.

    A string is its own text; a list is its blocks' texts joined; a text block
    (``{"type": "text", "text": ...}``, or an untyped one with ``text``) gives its
    text, and an ACP wrapper (``{"type": "content", "content": block}``) its inner
    block's; other blocks (images, diffs) give ``""``, and ``None`` too.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(content_text(block) for block in content)
    if isinstance(content, dict):
        if "text" in content and content.get("type", "text") == "text":
            return str(content["text"])
        inner = content.get("content")
        return content_text(inner) if isinstance(inner, dict) else ""
    return str(content)


#: camelCase usage counters (Codex's app-server, ACP agents) -> our ``llm_usage`` names.
USAGE_NAMES: dict[str, str] = {
    "inputTokens": "input_tokens",
    "outputTokens": "output_tokens",
    "totalTokens": "total_tokens",
    "cachedInputTokens": "cached_input_tokens",
    "reasoningOutputTokens": "reasoning_output_tokens",
    "thoughtTokens": "thought_tokens",
    "cachedReadTokens": "cache_read_input_tokens",
    "cachedWriteTokens": "cache_creation_input_tokens",
}


def usage_data(
    usage: Mapping[str, Any], counted: Iterable[str], optional: Iterable[str] = ()
) -> dict[str, Any]:
    """A camelCase usage report as ``llm_usage`` data, under the names of ``USAGE_NAMES``.

    Args:
        usage: The harness's usage object.
        counted: Keys always reported: 0 when absent (a report already under our
            snake_case name, as Gemini's quota gives it, counts too).
        optional: Keys reported only when present.
    """
    data = {USAGE_NAMES[k]: usage.get(k, usage.get(USAGE_NAMES[k], 0)) for k in counted}
    data.update({USAGE_NAMES[k]: usage[k] for k in optional if k in usage})
    return data


def turn_failed(
    response: str, message: str, error: str, events: Sequence[HarnessEvent] = ()
) -> Feed:
    """The end of a turn the harness reports as failed (``harness_error``).

    Args:
        response: The reply text the turn produced before it failed.
        message: The harness's own account, recorded in an ``error`` event.
        error: The outcome's message for the user (says which harness failed).
        events: Events of the same line, kept before the ``error`` event.
    """
    kind = Outcome.HARNESS_ERROR
    event = HarnessEvent(EventType.ERROR, {"error_type": kind.value, "message": message})
    return Feed(
        events=[*events, event],
        turn_complete=True,
        response=response,
        error_type=kind,
        error=error,
    )


def tools_not_loaded(who: str, ctx: EpisodeContext, missing: Sequence[str], why: str) -> str:
    """The ``startup_failed`` message of a harness that did not load the env tools.

    Args:
        who: The harness as the message names it ("Codex").
        ctx: The episode (its server name and env tools).
        missing: The env tools it lacks; empty means all of them.
        why: What the harness (or the bridge) said.
    """
    return (
        f"{who} did not load the env tools {list(missing or ctx.tool_names)} from MCP server "
        f"{ctx.server_name!r}: {why}. Check the bridge URL and token, and that nothing "
        "blocks 127.0.0.1."
    )


class RpcIds:
    """JSON-RPC request ids for one connection, and what each pending one was for.

    Example:
        >>> ids = RpcIds()
        >>> ids.request("initialize", {"clientInfo": {"name": "x", "version": "0"}})
        '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"clientInfo":{"name":"x","version":"0"}}}'
        >>> ids.settle(1)
        'initialize'
    """

    def __init__(self, *, jsonrpc: bool = True) -> None:
        self._jsonrpc = jsonrpc
        self._next = 1
        self._pending: dict[int | str, str] = {}

    def request(self, method: str, params: Mapping[str, Any] | None = None) -> str:
        """A request line for ``method``; remembers its id until ``settle``."""
        request_id = self._next
        self._next += 1
        self._pending[request_id] = method
        return json_line(self._envelope(id=request_id, method=method, params=dict(params or {})))

    def notification(self, method: str, params: Mapping[str, Any] | None = None) -> str:
        """A notification line (no id, no answer expected)."""
        message: dict[str, Any] = {"method": method}
        if params is not None:
            message["params"] = dict(params)
        return json_line(self._envelope(**message))

    def result(self, request_id: Any, result: Any) -> str:
        """A response line answering the peer's request ``request_id``."""
        return json_line(self._envelope(id=request_id, result=result))

    def error(self, request_id: Any, code: int, message: str) -> str:
        """An error response line to the peer's request ``request_id``."""
        return json_line(self._envelope(id=request_id, error={"code": code, "message": message}))

    def settle(self, request_id: Any) -> str | None:
        """Forget a pending request; return its method, or ``None`` if it was not ours."""
        if isinstance(request_id, int | str):
            return self._pending.pop(request_id, None)
        return None

    def pending(self) -> dict[int | str, str]:
        """A copy of the requests still waiting for an answer (id -> method)."""
        return dict(self._pending)

    def _envelope(self, **fields: Any) -> dict[str, Any]:
        return {"jsonrpc": "2.0", **fields} if self._jsonrpc else fields


def toml_document(doc: Mapping[str, Any]) -> str:
    """Render ``doc`` as TOML: scalars and lists first, then each nested dict as a table.

    Strings, bools, ints, floats and lists of those are supported (``None``
    values are left out); keys that are not bare words are quoted.

    Raises:
        TypeError: A value of another type.
    """
    lines: list[str] = []
    _toml_table(doc, (), lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml_table(table: Mapping[str, Any], path: tuple[str, ...], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, Mapping) and v is not None}
    tables = {k: v for k, v in table.items() if isinstance(v, Mapping)}
    if path and (scalars or not tables):
        lines.append("")
        lines.append("[" + ".".join(_toml_key(p) for p in path) + "]")
    lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in scalars.items())
    for key, sub in tables.items():
        _toml_table(sub, (*path, key), lines)


def _toml_key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return key if bare else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as TOML")


#: The variable through which an adapter hands its harness the model API key
#: (the capture proxy's per-episode token, or the user's key).
MODEL_KEY_VAR = "GYM_HARNESS_MODEL_API_KEY"


def policy_wait_ms(ctx: EpisodeContext) -> int | None:
    """In model mode, the API timeout a CLI needs to outwait the policy, in ms; else None.

    A minute over ``policy_timeout_s``: the env, not the CLI, bounds a slow policy.
    """
    if ctx.policy_timeout_s is None:
        return None
    return int((ctx.policy_timeout_s + 60) * 1000)


def openai_base(url: str) -> str:
    """An OpenAI-style base URL ends in ``/v1``; a bare origin (the capture proxy) gets it."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


#: The npm package (at the version tested here, as in ``.ci/clis-package.json``) that
#: installs each CLI command.
NPM_PACKAGES: dict[str, str] = {
    "claude": "@anthropic-ai/claude-code@2.1.197",
    "codex": "@openai/codex@0.171.0",
    "opencode": "opencode-ai@1.18.33",
    "qwen": "@qwen-code/qwen-code@0.15.10",
    "gemini": "@google/gemini-cli@0.61.0",
    "claude-agent-acp": "@agentclientprotocol/claude-agent-acp@0.101.0",
    "codex-acp": "@zed-industries/codex-acp@0.16.0",
}


def _harness_path(config: HarnessConfig) -> str:
    """The PATH the harness will get (its own ``env``, else ours if inherited)."""
    if "PATH" in config.env:
        return config.env["PATH"]
    if "PATH" in config.inherit_env:
        return os.environ.get("PATH", os.defpath)
    return os.defpath


def require_executable(executable: str, config: HarnessConfig, who: str, command: str) -> None:
    """Raise ``ConfigError`` unless ``executable`` runs: on the harness's PATH, or a file.

    A relative path with a directory part is left alone: it resolves in the
    episode's workspace, which does not exist yet.

    Args:
        executable: The adapter's ``executable`` option.
        config: The merged config (its ``env`` / ``inherit_env`` give the PATH).
        who: The harness as the message names it ("Claude Code").
        command: The CLI's usual command name, the key of ``NPM_PACKAGES``.
    """
    if os.sep in executable:
        if not os.path.isabs(executable) or os.access(executable, os.X_OK):
            return
        where = f"{executable!r} is not an executable file"
    else:
        path = _harness_path(config)
        if shutil.which(executable, path=path):
            return
        where = f"`{executable}` is not on the harness's PATH"
    package = NPM_PACKAGES.get(command, command)
    raise ConfigError(
        f"{who} is not installed here: {where}. Install it with "
        f"`npm install -g {package}` (the version tested with gym_harness), or, in a clone "
        f"of gym_harness, `bash .ci/install-clis.sh` (every CLI, into .clis/node_modules/.bin); "
        f"or pass executable='/abs/path/to/{command}'."
    )


def require_key(who: str, names: Sequence[str], config: HarnessConfig, option: str) -> None:
    """Raise ``ConfigError`` unless one of ``names`` is set here or in ``config.env``.

    Args:
        who: The harness as the message names it.
        names: Variables any one of which holds the key; the first is the one to set.
        config: The merged config (a key given in its ``env`` counts).
        option: The adapter option that names another variable (``api_key_env``).
    """
    if present(names) or any(config.env.get(name) for name in names):
        return
    others = f" (or {', '.join(names[1:])})" if len(names) > 1 else ""
    raise ConfigError(
        f"{who} needs an API key, and {names[0]}{others} is not set. "
        f"Set it before making the env (`export {names[0]}=...`; for a local model server "
        f"any value it accepts, with base_url='http://127.0.0.1:PORT...'), or pass "
        f"{option}='MY_VAR' naming the variable that holds the key. With capture=True the "
        "capture proxy supplies a key instead."
    )
