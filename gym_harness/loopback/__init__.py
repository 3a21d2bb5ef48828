"""The loopback layer: HTTP servers on 127.0.0.1, and the only part that runs event loops.

* :mod:`~gym_harness.loopback.server`: ``LoopbackServer`` (one thread, one asyncio
  loop, one ASGI app) and ``RotatingToken`` (a bearer token per episode).
* :mod:`~gym_harness.loopback.connections`: each connection's bounds (header and idle
  timeouts, the connection cap, eviction of idle unauthenticated ones).
* :mod:`~gym_harness.loopback.service`: ``LoopbackService``, the start-once / stop-once
  lifecycle of the capture proxy and the model endpoint.

Imports only ``errors``, ``lifecycle`` and ``utils``; never the bridge, capture, model, adapters,
processes or the env. The servers above it hand it an ASGI app.
"""
