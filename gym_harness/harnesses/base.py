"""Harness and HarnessSession: what one wire dialect supplies to the environment.

An adapter is pure translation. It never spawns, never touches psutil or
sockets; ``HarnessEnv`` owns the process (through ``HarnessProcess``) and the
MCP bridge. An adapter comes in two parts, like fastmcp's ``NpxStdioTransport``
(which only builds argv) beside the session that talks over it:

* ``Harness``, the factory: options in, argv, environment and config files out.
  It holds no per-episode state, so it pickles and travels to vector-env workers.
* ``HarnessSession``, made fresh by the factory for each episode: the state of one
  conversation with one process (request ids, session ids, readiness, the tool
  check, the interrupt). The turn runner (``turn.py``) drives it.

Once per episode the env:

1. calls ``Harness.launch(ctx, config)``, which writes any config files the harness
   reads (strictly before it starts) and returns a ``Launch``: the ``HarnessConfig``
   to spawn (argv and environment; secrets such as the bridge token go in the
   environment or a 0600 file, never argv) and the episode's ``HarnessSession``;
2. spawns the process and writes ``session.startup_lines()`` (a JSON-RPC
   ``initialize``, say); unless ``session.ready_at_spawn``, every output line then
   goes through ``session.feed`` until a ``Feed`` says ``ready``;
3. per turn, writes ``session.message_lines(text)`` and passes every output line to
   ``session.feed`` until a ``Feed`` says ``turn_complete``. ``Feed.replies`` are
   written back at once (JSON-RPC responses, permission answers, the next handshake
   request). After each completed turn ``session.missing_tools(listed)`` may still
   fail it as ``startup_failed`` (for harnesses that show no tool list of their own);
4. on a timeout, writes ``session.interrupt_lines()`` (the dialect's way to stop a
   turn without killing the process), before it stops the process tree.
"""

from __future__ import annotations

import copy
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from gym_harness.config import HarnessConfig
from gym_harness.errors import ForkFailed, ForkUnsupported
from gym_harness.records.calls import SIDE_MODEL
from gym_harness.records.events import HarnessEvent
from gym_harness.utils.trees import copy_tree

if TYPE_CHECKING:
    from gym_harness.model.request import ModelRequest

__all__ = [
    "FORKED_FROM_VAR",
    "SIDE_MODEL",
    "EpisodeContext",
    "Feed",
    "ForkOrigin",
    "Harness",
    "HarnessSession",
    "Launch",
]

#: The variable a forked episode's harness is started with: the parent episode's id.
FORKED_FROM_VAR = "GYM_HARNESS_FORKED_FROM"


@dataclass(frozen=True)
class ForkOrigin:
    """The episode a turn-mode fork resumes (``Harness.forked``).

    Args:
        episode_id: The parent episode's id.
        directory: The parent episode's directory (``workspace/`` and ``home/`` in it).
        session: What the parent's session said a fork needs (``Harness.fork_session``:
            the CLI's session id ...).
        max_bytes: Most bytes of file content the copy of the workspace and home holds
            (the env's ``max_fork_bytes``); ``None``: no bound.
    """

    episode_id: str
    directory: Path
    session: Mapping[str, str] = field(default_factory=dict)
    max_bytes: int | None = None


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
        policy_timeout_s: In model mode (``model_base_url`` is then the env's model
            endpoint), how long the policy may take to answer one model call: the
            adapter makes its CLI wait that long (its API and stream idle timeouts).
        serve_port: A free loopback TCP port for a harness that serves on one of its
            own (OpenCode's local server): the one a confined harness may bind.
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
    policy_timeout_s: float | None = None
    serve_port: int = 0


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


class HarnessSession(ABC):
    """One episode's conversation with one harness process, in its wire dialect.

    ``Harness.launch`` makes a fresh session per episode, with what it needs to
    know of the episode (an ``EpisodeContext``, the handshake's parameters); the
    session owns everything that lives as long as the process: JSON-RPC ids,
    session and thread ids, readiness, the tool check, the interrupt. The turn
    runner calls it from the env's thread only.
    """

    @property
    def ready_at_spawn(self) -> bool:
        """True when the harness takes a message as soon as it is spawned (no handshake)."""
        return False

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

    def missing_tools(self, listed: Callable[[], bool]) -> str:
        """After each completed turn: ``""``, or why the env tools are not loaded.

        A harness that shows its tool list (Claude Code's ``init`` line, Codex's
        ``mcpServerStatus/list``) is checked in ``feed``, and its session keeps this
        default. One that shows none (ACP agents) asks the bridge instead: a non-empty
        answer fails the turn as ``startup_failed``.

        Args:
            listed: Asks the env's bridge whether the harness has listed the env
                tools over MCP (call it only when the answer matters).
        """
        return ""


@dataclass(frozen=True)
class Launch:
    """What ``Harness.launch`` returns for one episode.

    Args:
        config: The config to spawn, with ``command`` and ``env`` filled in.
        session: The episode's fresh session (not picklable, never leaves the env).
        read_paths: More paths a confined harness may read and execute (beside the
            install tree of its command, which is found from the command itself).
        connect_ports: TCP ports of a model API the harness calls itself (turn mode
            without capture): a confined harness may connect to them.
    """

    config: HarnessConfig
    session: HarnessSession
    read_paths: tuple[str, ...] = ()
    connect_ports: tuple[int, ...] = ()


class Harness(ABC):
    """One wire dialect's factory: options in, what to spawn and a session out.

    Subclasses set ``name`` and, where their harness has built-in tools whose
    names env tools could shadow, ``builtin_tools``. An instance holds only its
    options: it must pickle, as it travels to vector-env workers, and one
    instance launches every episode of an env.

    Example:
        A dialect whose harness answers each message line with one reply line::

            class UpperSession(HarnessSession):
                @property
                def ready_at_spawn(self) -> bool:
                    return True

                def message_lines(self, text: str) -> list[str]:
                    return [text]

                def feed(self, line: str) -> Feed:
                    return Feed(turn_complete=True, response=line)

            class UpperHarness(Harness):
                name = "upper"

                def launch(self, ctx: EpisodeContext, config: HarnessConfig) -> Launch:
                    return Launch(config.replace(command=["my-upper-agent"]), UpperSession())

            env = HarnessEnv(UpperHarness(), tools=[add])
    """

    #: Short name, used in registration and episode records.
    name: ClassVar[str] = ""
    #: Tool names the harness already has; a clashing env tool is renamed.
    builtin_tools: ClassVar[frozenset[str]] = frozenset()
    #: Patterns of what the harness itself puts in its model requests differently each run
    #: (a tool's wall time): a replayed fork compares requests with their matches blanked.
    replay_noise: ClassVar[tuple[str, ...]] = ()
    #: On the copy ``forked`` makes: the episode its next launch resumes.
    fork_origin: ForkOrigin | None = None

    def fork_session(self, session: HarnessSession | None) -> dict[str, str]:
        """What a turn-mode fork of the episode ``session`` runs needs to resume a copy of it
        (``ForkOrigin.session``); adapters of harnesses that can resume say so here.

        Raises:
            ForkUnsupported: This harness (or this session) cannot be forked: the message
                names the harness and what it lacks.
        """
        raise ForkUnsupported(
            f"the {self.name!r} harness cannot fork a turn-mode episode: it has no way to "
            "resume a copy of its saved session. Fork in mode='model' (replay) instead."
        )

    def forked(self, origin: ForkOrigin) -> Harness:
        """A copy of this harness whose launches resume ``origin``: the episode's workspace
        and home start as copies of the parent's (``resume_copy``), and the harness is told."""
        twin = copy.copy(self)
        twin.fork_origin = origin
        return twin

    def resume_copy(self, ctx: EpisodeContext) -> ForkOrigin | None:
        """In ``launch``, first: make ``ctx``'s workspace and home copies of the parent's
        (a forked launch; the adapter's own config files are then written over them).

        The parent's harness is not paused: it is idle between turns, and whatever it
        does meanwhile, the copy follows no link and holds at most ``origin.max_bytes``
        (``utils/trees.py``).

        Raises:
            ForkFailed: The copy stopped (the tree grew past the bound, an entry vanished
                or became a link, the disk is full): the message says where and why.
        """
        origin = self.fork_origin
        if origin is not None:
            limit = sys.maxsize if origin.max_bytes is None else origin.max_bytes
            try:
                held = copy_tree(origin.directory / "workspace", ctx.workspace, limit=limit)
                copy_tree(origin.directory / "home", ctx.home, limit=limit, copied=held)
            except ForkFailed as exc:
                raise ForkFailed(
                    f"could not copy episode {origin.episode_id}'s workspace and home for a "
                    f"fork: {exc.message}. No child was made; the parent goes on. Fork again, "
                    "or fork in mode='model' (replay copies nothing)."
                ) from exc
        return origin

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

    def for_model_mode(self) -> Harness:
        """The harness to run in ``mode="model"`` (one that calls the model it is given)."""
        return self

    def side_call(self, request: ModelRequest, headers: Mapping[str, str]) -> bool:
        """Whether a model call is a side call (a title, a summary), not the agent's own.

        In model mode a side call gets a short fixed answer instead of becoming a step.
        Adapters that point their CLI's small or fast model at :data:`SIDE_MODEL` keep
        this default.

        Args:
            request: The model call as read.
            headers: Its HTTP headers, names in lower case.
        """
        return request.model == SIDE_MODEL

    @abstractmethod
    def launch(self, ctx: EpisodeContext, config: HarnessConfig) -> Launch:
        """Prepare an episode: write config files, return what to spawn and a fresh session.

        Args:
            ctx: The episode being launched.
            config: The merged config (defaults, then the user's overrides).

        Returns:
            The config to spawn (``command`` and ``env`` filled in) and the
            episode's ``HarnessSession``.
        """
