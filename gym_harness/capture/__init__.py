"""Capture: the harness's model calls relayed to the real API and recorded.

* :mod:`~gym_harness.capture.proxy`: ``ModelProxy`` (``capture=True``), a loopback
  pass-through that swaps the per-episode token for the real key.
* :mod:`~gym_harness.capture.upstream`: the proxy's leg to the real API.
* :mod:`~gym_harness.capture.http`: reading bounded bodies and sending answers (shared
  with the model endpoint).
* :mod:`~gym_harness.capture.secrets`: credential swapping and redaction.
* :mod:`~gym_harness.capture.tokens`: the engine's token ids an upstream returned.

What it records (``ModelExchange``) lives in ``gym_harness.records.exchanges``.
Imports ``loopback``, ``records`` and the vocabulary below it; never the bridge, model, processes,
adapters or the env. Nothing is imported here: asyncio loads only when a proxy starts.
"""
