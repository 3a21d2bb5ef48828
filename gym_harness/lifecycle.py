"""Lifecycle and Liveness: the one state enum and the one sign-of-life protocol.

Every long-lived part of gym_harness (the env, the harness process, the MCP
bridge, the model proxy, the loopback server under the last two) says where it
is in its life with :class:`Lifecycle`, the way httpx's ``ClientState`` does.

The turn runner decides when a turn has gone idle by asking the parts that
see the harness's activity, each a :class:`Liveness`: the process (its output),
the bridge (its tool calls) and the proxy (its model traffic). In model mode a
:class:`Wake` (the model endpoint) pauses a turn where the harness waits on its model.
"""

from __future__ import annotations

import enum
from typing import Protocol, runtime_checkable

__all__ = ["Lifecycle", "Liveness", "Wake"]


class Lifecycle(enum.Enum):
    """Where a part is in its life.

    Each part uses the members that apply to it:

    - ``NEW``: constructed, never started (every part).
    - ``RUNNING``: started and serving (every part); for the env, an episode is under way.
    - ``ENDED``: the env's episode terminated or was truncated; ``reset()`` is needed.
    - ``FAILED``: the bridge's thread or loop died on its own (see ``MCPBridge.failure``);
      ``start()`` works again.
    - ``STOPPED``: ``stop()``/``close()`` ended it. The bridge can be started again;
      the process, the proxy and the env cannot.
    """

    NEW = "new"
    RUNNING = "running"
    ENDED = "ended"
    FAILED = "failed"
    STOPPED = "stopped"


@runtime_checkable
class Liveness(Protocol):
    """A source of the harness's signs of life, read by the turn runner's idle deadline.

    A turn ends as ``idle_timeout`` once ``idle_timeout_s`` passed since the
    latest ``last_activity`` of every source, unless a source is ``busy``.
    Both are read from the turn's thread while other threads update them, so
    each read must be cheap and must not block.
    """

    @property
    def last_activity(self) -> float:
        """``time.monotonic()`` of the last sign of life this source saw."""
        ...

    @property
    def busy(self) -> bool:
        """True while the harness waits on this source (a tool call the env runs):
        silence then is not idleness."""
        ...


class Wake(Protocol):
    """What pauses a turn in model mode (the model endpoint): see ``TurnRunner.run_until_call``."""

    @property
    def wake_fd(self) -> int:
        """A file descriptor that is readable while ``waiting`` may be true."""
        ...

    @property
    def waiting(self) -> bool:
        """A model call waits for the policy."""
        ...
