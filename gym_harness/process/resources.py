"""EnvResources: what one env owns that must end with it, closed or dropped.

An env owns, across its episodes, one hold on a keeper, a root directory with one
directory per episode, the harness process of the current episode, and its loopback
services (the MCP bridge, the capture proxy, the model endpoint). ``release`` ends all
of it, once: ``HarnessEnv.close()`` calls it, and a finalizer calls it when an env is
garbage-collected without ``close()`` (or is still open at exit), saying so once in the
log. The finalizer holds this object, never the env, so the env can be collected.

Threads: the env's caller thread makes and changes it; ``release`` runs in whichever
thread closes the env or collects it (the env's state lock keeps two closes apart).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urlsplit

from gym_harness.process import keeper_client as _keeper_client
from gym_harness.process import sandbox as _sandbox
from gym_harness.process.sandbox import Reach
from gym_harness.process.workspaces import disown_path, episode_dirs, new_root, remove_path
from gym_harness.utils.interrupts import interrupts_held

if TYPE_CHECKING:
    from gym_harness.process.netns import NetworkNamespace
    from gym_harness.tasks import Task

__all__ = ["Declared", "EnvResources", "Stoppable"]

S = TypeVar("S", bound="Stoppable")

logger = logging.getLogger("gym_harness")


class Stoppable(Protocol):
    """A harness process or a loopback service: ``stop()`` is idempotent and never raises."""

    def stop(self) -> None: ...


class Declared(Protocol):
    """What a harness's adapter declares it needs to reach (``harnesses.base.Launch``)."""

    @property
    def read_paths(self) -> tuple[str, ...]: ...

    @property
    def connect_ports(self) -> tuple[int, ...]: ...


class EnvResources:
    """One env's keeper hold, episode directories, harness process, services and sandbox.

    The first ``new_episode`` holds a keeper (so one keeper serves every episode, and
    owns the root from the start) and makes the root; each episode gets a directory of
    its own, removed by ``end_episode``. With ``sandbox="strict"`` the env has a network
    namespace, made with its first server's socket, released last.

    Args:
        template: A directory copied into every episode's workspace, if any.
        keep: Keep the directories (for inspection); nobody removes them then.
        sandbox: The ``HarnessConfig.sandbox`` tier.

    Raises:
        ConfigError: ``sandbox="strict"`` cannot be enforced here (the message says why).
    """

    def __init__(self, template: str | Path | None, keep: bool, sandbox: str = "off") -> None:
        _sandbox.check(sandbox)
        self.sandbox = sandbox
        self.netns: NetworkNamespace | None = None
        self.template = None if template is None else Path(template)
        self.keep = keep
        self.root: Path | None = None
        #: The current episode's directory (``workspace/`` and ``home/`` in it), if any.
        self.current: Path | None = None
        #: The current episode's harness process, if any.
        self.process: Stoppable | None = None
        #: The env's loopback services, stopped last.
        self.services: list[Stoppable] = []
        self._held = False
        self._serve_port = 0

    def own(self, service: S) -> S:
        """Have ``release`` stop ``service`` (a loopback server); return it."""
        self.services.append(service)
        return service

    def start(self, make: Callable[..., S], *args: Any) -> S:
        """``make(*args)`` (a service that runs once made) and owned, whole: both or neither."""
        with interrupts_held():
            return self.own(make(*args))

    def hold_keeper(self) -> None:
        """Hold a keeper for this env's harnesses, once (not one per reset)."""
        with interrupts_held():
            if not self._held:
                _keeper_client.hold()
                self._held = True

    def new_episode(self, episode_id: str, task: Task | None) -> tuple[Path, Path]:
        """Make the episode's ``workspace`` and ``home``; return both."""
        with interrupts_held():
            if self.root is None:
                self.hold_keeper()  # first, so that a keeper owns the root from the start
                self.root = new_root(self.keep)
            self.current = self.root / episode_id
        return episode_dirs(self.current, self.template, task)

    def sandbox_report(self) -> dict[str, object]:
        """The protections this env's harnesses run under (``sandbox.report``)."""
        return _sandbox.report(self.sandbox)

    def scored_dirs(self) -> tuple[Path, Path]:
        """The current episode's workspace and its directory of hidden task files."""
        assert self.current is not None, "no episode"
        return self.current / "workspace", self.current / "hidden"

    def listener(self) -> Callable[[], socket.socket] | None:
        """What makes the env's listening sockets: in its namespace (strict), or None."""
        return self._listen if self.sandbox == "strict" else None

    def _listen(self) -> socket.socket:
        from gym_harness.process.netns import NetworkNamespace

        with interrupts_held():
            if self.netns is None:  # OSError: the server's start says it failed, and why
                self.netns = NetworkNamespace()
            return self.netns.listener()

    def free_port(self) -> int:
        """A loopback TCP port free now (in the env's namespace, with ``"strict"``), for the
        current episode's harness to serve on: its ``reach`` lets it bind that one."""
        make = self.listener()
        sock = make() if make is not None else socket.create_server(("127.0.0.1", 0))
        with sock:
            self._serve_port = int(sock.getsockname()[1])
        return self._serve_port

    def reach(self, urls: Sequence[str | None], declared: Declared) -> Reach:
        """What the current episode's harness may reach: its directories, the ports of
        ``urls`` (the env's endpoints) and of ``free_port``, and what its adapter declared."""
        assert self.current is not None
        ports = [urlsplit(url).port or 80 for url in urls if url]
        return Reach(
            workspace=str(self.current / "workspace"),
            home=str(self.current / "home"),
            tmp=str(self.current / "tmp"),
            ports=(*ports, *declared.connect_ports),
            serve_ports=(self._serve_port,) if self._serve_port else (),
            read=declared.read_paths,
            netns_fd=-1 if self.netns is None else self.netns.fd,
        )

    def end_episode(self) -> None:
        """Stop the episode's harness and remove its directory (unless kept). Never raises."""
        with interrupts_held():
            process, self.process = self.process, None
            if process is not None:
                process.stop()
            current, self.current = self.current, None
            if current is not None and not self.keep:
                remove_path(current)

    def release(self, dropped: bool = False) -> None:
        """End everything: the harness, the services, the directories, the keeper hold.

        Never raises. Calling it again ends whatever was made since (a reset that ran
        while another thread closed the env).

        Args:
            dropped: Called by the finalizer of an env that was never closed (logged).
        """
        with interrupts_held():
            if dropped:
                logger.warning(
                    "gym_harness: a HarnessEnv was dropped without close(); its harness, "
                    "servers and workspaces were ended (call env.close() when done)"
                )
            try:
                self.end_episode()
                for service in reversed(self.services):
                    with contextlib.suppress(Exception):
                        service.stop()
                self.services.clear()
            finally:
                root, self.root = self.root, None
                if root is not None and not self.keep:
                    remove_path(root)
                    disown_path(root)
                if self._held:
                    self._held = False
                    _keeper_client.unhold()
                netns, self.netns = self.netns, None
                if netns is not None:  # after the harness and the servers: nothing is in it
                    netns.close()
