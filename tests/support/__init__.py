"""Helpers shared by the test files (importable as ``support`` from ``tests/``).

* ``cli``: the real-CLI scaffolding (``cli_path``, the network-isolated episodes).
* ``model_server``: the scripted model server the CLIs and the capture proxy talk to.
* ``raw_upstream``: a bare TCP upstream that answers with exact bytes.
* ``process``: the fake harness of the process tests and the pid checks around it.
* ``gate``: a tool body that blocks until the test releases it.
* ``policies``: policies for model-mode rollouts.
* ``groups``: the scripted ``GroupRollout`` of the training tests and the group benchmark.
* ``signals``: Ctrl-C in started processes whatever SIGINT disposition the run inherited.
* ``churn``: a tree that changes while a fork copies it (a process, or a harness).
* ``line_agent.py`` and ``scripts/``: programs the tests start as harnesses; use
  the path constants below, never a path of your own.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CHURN_SCRIPT",
    "CONFINED_PROBE",
    "HARNESS_SCRIPT",
    "HOSTILE_SCRIPT",
    "LIGHT_MODEL_AGENT",
    "LINE_AGENT",
    "MODEL_AGENT",
    "OWNER_SCRIPT",
    "SUPPORT",
    "TOKEN_AGENT",
]

#: This directory.
SUPPORT = Path(__file__).resolve().parent
#: The line-protocol test harness (``python LINE_AGENT [MODE] [--delay S]``).
LINE_AGENT = SUPPORT / "line_agent.py"
#: The fake harness of the process tests; its first argument picks its behaviour.
HARNESS_SCRIPT = SUPPORT / "scripts" / "harness.py"
#: A line-protocol harness that misbehaves on command (the "nothing escapes" tests).
HOSTILE_SCRIPT = SUPPORT / "scripts" / "hostile.py"
#: Confines itself with ``gym_harness/process/confine.py``, then tries what a job on stdin
#: names and prints the outcomes (the confinement tests).
CONFINED_PROBE = SUPPORT / "scripts" / "confined_probe.py"
#: A process that owns an env and reports on it (the containment tests).
OWNER_SCRIPT = SUPPORT / "scripts" / "owner.py"
#: A line-protocol harness whose model is the env (model mode; ``side``/``stall``/``retry``
#: words, ``--ask-at-start``).
MODEL_AGENT = SUPPORT / "scripts" / "model_agent.py"
#: A line-protocol harness whose model is the env, on the standard library alone (two
#: model calls a turn; ``--pause S`` between them): it starts in milliseconds.
LIGHT_MODEL_AGENT = SUPPORT / "scripts" / "light_model_agent.py"
#: A line-protocol harness making one side call and one main Chat Completions call per
#: message (``plain``: not streamed); it reports the answers' bytes (token-capture tests).
TOKEN_AGENT = SUPPORT / "scripts" / "token_agent.py"
#: Churns a tree (or, with ``--agent``, its workspace as a forkable harness): ``support.churn``.
CHURN_SCRIPT = SUPPORT / "scripts" / "churn.py"
