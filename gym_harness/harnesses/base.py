"""Harness: what one wire dialect supplies to the environment.

An adapter is pure translation. It never spawns, never touches psutil or
sockets; ``HarnessEnv`` owns the process (through ``HarnessProcess``) and the
MCP bridge, and asks the adapter, once per episode:

1. ``launch(ctx, config)``: write any config files the harness reads (strictly
   before it starts) and return the ``HarnessConfig`` to spawn (argv and
   environment; secrets such as the bridge token go in the environment, never argv).
2. ``startup_lines()``: lines to write right after spawning (a JSON-RPC
   ``initialize``, say). Then every output line goes through ``feed`` until a
   ``Feed`` says ``ready`` (or at once, when ``ready_on_spawn`` is true).
3. per turn, ``message_lines(text)``; every output line through ``feed`` until a
   ``Feed`` says ``turn_complete``. ``Feed.replies`` are written back at once
   (JSON-RPC responses, permission answers, the next handshake request).
4. on a timeout, ``interrupt_lines()`` (the dialect's way to stop a turn
   without killing the process), before the env stops the process tree.

Adapters hold per-episode state (request ids, session ids); ``launch`` resets it.
Adapter instances must pickle: they travel to vector-env workers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from gym_harness.config import HarnessConfig
from gym_harness.events import HarnessEvent

__all__ = ["EpisodeContext", "Feed", "Harness"]


@dataclass(frozen=True)
class EpisodeContext:
    """What the environment tells an adapter about the episode it launches.

    Args:
        episode_id: Unique id of the episode.
        workspace: The episode's fresh working directory (the harness's cwd).
        home: A private, empty directory for the harness's HOME and config files.
        bridge_url: The MCP bridge's streamable-HTTP URL (``http://127.0.0.1:PORT/mcp``).
        bridge_token: The bearer token the bridge requires this episode.
        tool_names: The env tools as the bridge serves them (after renames).
        server_name: The MCP server name to register the bridge under.
        model_base_url: When the env captures LLM traffic, the proxy's base URL
            the harness must use instead of its provider's; else ``None``.
        model_api_key: The per-episode key the proxy accepts (with ``model_base_url``).
    """

    episode_id: str
    workspace: Path
    home: Path
    bridge_url: str
    bridge_token: str
    tool_names: tuple[str, ...] = ()
    server_name: str = "env"
    model_base_url: str | None = None
    model_api_key: str | None = None


@dataclass(slots=True)
class Feed:
    """What one output line meant.

    Args:
        events: Events the line carried, in order.
        replies: Lines to write back to the harness at once.
        ready: The harness finished starting up and can take the first message.
        turn_complete: The line ended the current turn.
        response: The turn's reply text (with ``turn_complete``).
        done: The harness says the task is finished (with ``turn_complete``).
        error_type: An ``Outcome`` when the line reports a failure
            (``Outcome.PROTOCOL_ERROR``, ``Outcome.STARTUP_FAILED`` ...); ends the turn.
            A ``feed`` that raises is the harness's ``protocol_error`` too (see ``turn.py``):
            raise :class:`~gym_harness.errors.ProtocolError` for output the dialect
            forbids, anything else for a bug of the adapter (logged with its traceback).
        error: A human-readable account of that failure.
    """

    events: Sequence[HarnessEvent] = ()
    replies: Sequence[str] = ()
    ready: bool = False
    turn_complete: bool = False
    response: str = ""
    done: bool = False
    error_type: str = ""
    error: str = ""


class Harness(ABC):
    """One wire dialect: how to launch a harness and read what it says.

    Subclasses set ``name`` and, where their harness has built-in tools whose
    names env tools could shadow, ``builtin_tools``.
    """

    #: Short name, used in registration and episode records.
    name: ClassVar[str] = ""
    #: Tool names the harness already has; a clashing env tool is renamed.
    builtin_tools: ClassVar[frozenset[str]] = frozenset()
    #: True when the harness can take a message as soon as it is spawned.
    ready_on_spawn: ClassVar[bool] = False
    #: True when the harness shows no tool list the adapter could check (ACP agents):
    #: the env then requires the bridge to have seen the harness list the env tools
    #: by the end of the first turn, else that turn fails as ``startup_failed``.
    confirm_tools_via_bridge: ClassVar[bool] = False

    def default_config(self) -> HarnessConfig:
        """The config this harness runs with before the user's overrides."""
        return HarnessConfig()

    def check_config(self, config: HarnessConfig) -> None:
        """Raise ``ConfigError`` if ``config`` cannot work for this harness (at construction).

        Args:
            config: The merged config (defaults, then the user's overrides).
        """
        return  # most harnesses accept any config

    def preflight(self, config: HarnessConfig, *, captured: bool = False) -> None:
        """Raise ``ConfigError`` if the harness cannot run here, before anything starts.

        Adapters of real CLIs check that their executable is found and that the API
        key they need is set, and say how to fix either.

        Args:
            config: The merged config (defaults, then the user's overrides).
            captured: The env's capture proxy supplies the model endpoint and key.
        """
        return  # a line-protocol command needs no credentials of ours

    @abstractmethod
    def launch(self, ctx: EpisodeContext, config: HarnessConfig) -> HarnessConfig:
        """Prepare an episode: write config files, reset state, return what to spawn.

        Args:
            ctx: The episode being launched.
            config: The merged config (defaults, then the user's overrides).

        Returns:
            The config to spawn, with ``command`` and ``env`` filled in.
        """

    def startup_lines(self) -> list[str]:
        """Lines to write right after the process is spawned."""
        return []

    @abstractmethod
    def message_lines(self, text: str) -> list[str]:
        """Lines that send ``text`` as the next user message."""

    @abstractmethod
    def feed(self, line: str) -> Feed:
        """Interpret one line of the harness's stdout (without its newline).

        Raises:
            ProtocolError: The line breaks the dialect; the turn ends as
                ``protocol_error`` with this error's message.
        """

    def interrupt_lines(self) -> list[str]:
        """Lines that interrupt the running turn, where the dialect has a way."""
        return []
