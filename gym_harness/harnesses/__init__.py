"""Harness adapters: config into argv, environment and files; harness output into events.

* :mod:`~gym_harness.harnesses.base`: ``Harness`` (the factory, picklable),
  ``HarnessSession`` (one episode's dialect state), ``Feed``, ``Launch``,
  ``EpisodeContext``.
* :mod:`~gym_harness.harnesses.registry`: the registered names (``HARNESSES``,
  ``harness_class``, ``make_harness``); adapter modules load by name, on first use.
* One module per dialect: ``line`` (line protocol v1: Command, Reference),
  ``claude_code``, ``codex`` (app-server; ``codex_config``), ``acp`` and its presets
  (``acp_presets``: OpenCode, Qwen Code, Gemini CLI ...); ``_common`` holds what they share.

Adapters translate and never spawn: they import no psutil, no socket or event-loop code,
and nothing of the process, loopback, bridge, capture proxy, model endpoint or env.
"""

from gym_harness.harnesses.base import EpisodeContext, Feed, Harness, HarnessSession, Launch

__all__ = ["EpisodeContext", "Feed", "Harness", "HarnessSession", "Launch"]
