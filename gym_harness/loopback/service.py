"""LoopbackService: the lifecycle shared by the model proxy and the model endpoint.

Both serve one ASGI app with a :class:`~gym_harness.loopback.server.LoopbackServer` behind a
per-episode token (:class:`~gym_harness.loopback.server.RotatingToken`), are single use, and
stop idempotently. A subclass names itself (``label``), its error class, and passes its
app and server options to :meth:`LoopbackService._start_server`.

Threads: the caller's thread owns the lifecycle; the server thread never touches it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from gym_harness.errors import HarnessError
from gym_harness.lifecycle import Lifecycle
from gym_harness.loopback.server import LoopbackServer, RotatingToken
from gym_harness.utils.interrupts import interrupts_held

__all__ = ["LoopbackService"]

_STOP_TIMEOUT_S = 3.0


class LoopbackService(RotatingToken):
    """Mixin: start once on 127.0.0.1, report ``base_url``, stop idempotently.

    Subclasses set :attr:`label` and :attr:`error`, and implement ``start`` with
    :meth:`_start_server` and ``stop`` with :meth:`_stop_server`.
    """

    #: Names the service in errors and logs.
    label: ClassVar[str] = "loopback service"
    #: Raised when the service cannot start or is used outside its lifecycle.
    error: ClassVar[type[HarnessError]] = HarnessError

    def __init__(self) -> None:
        super().__init__()
        self._state = Lifecycle.NEW
        self._server: LoopbackServer | None = None

    @property
    def state(self) -> Lifecycle:
        """Where the service is in its lifecycle."""
        return self._state

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``: use it where the harness expects the API's origin.

        Raises:
            HarnessError: Of the subclass's ``error`` class: the service is not running.
        """
        if self._state is not Lifecycle.RUNNING or self._server is None:
            raise self.error(f"the {self.label} is {self._state.value}; call start() first")
        return f"http://127.0.0.1:{self._server.port}"

    def _start_server(self, app: Any, *, thread_name: str, **server: Any) -> None:
        """Serve ``app`` (no-op while running); ``server``: more ``LoopbackServer`` arguments.

        Whole under Ctrl-C, like ``_stop_server``: no server thread is left unowned.
        """
        with interrupts_held():
            if self._state is Lifecycle.RUNNING:
                return
            if self._state is Lifecycle.STOPPED:
                raise self.error(f"this {self.label} was stopped; make a new {type(self).__name__}")
            loopback = LoopbackServer(
                app,
                label=self.label,
                thread_name=thread_name,
                error=self.error,
                stop_timeout_s=_STOP_TIMEOUT_S,
                **server,
            )
            loopback.start()
            self._server = loopback
            self._state = Lifecycle.RUNNING

    def _stop_server(self) -> bool:
        """Stop serving (bounded, never raises); False if it had stopped already."""
        with interrupts_held():
            if self._state is Lifecycle.STOPPED:
                return False
            self._state = Lifecycle.STOPPED
            server, self._server = self._server, None
            if server is not None:
                server.stop()
            return True

    def start(self) -> None:
        """Bind 127.0.0.1 on an OS-chosen port and serve from a thread of its own."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop serving. Idempotent, bounded, never raises."""
        raise NotImplementedError

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
