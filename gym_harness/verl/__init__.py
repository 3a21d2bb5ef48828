"""verl's agent loop over any harness in model mode (the extra ``gym_harness[verl]``).

This part owns the binding to verl (0.9.x) and nothing else:

* :mod:`~gym_harness.verl.episode`: :func:`run_episode`, one model-mode episode driven
  from an asyncio loop by a token-in, token-out engine (verl-free: the env's blocking
  calls run in worker threads; rows from the env's own token chains).
* :mod:`~gym_harness.verl.agent_loop`: :class:`HarnessAgentLoop`, verl's ``AgentLoopBase``
  registered as ``"gym_harness"``, which answers each model call with verl's
  ``server_manager.generate`` and returns ``AgentLoopOutput`` rows.

Importing this package imports verl (and its torch); nothing else of gym_harness imports
it, so ``import gym_harness`` never loads verl. It sits on the top floor beside
``training/``, whose token chain and tool-call parsing it uses.
"""

from gym_harness.verl.agent_loop import HarnessAgentLoop
from gym_harness.verl.episode import EpisodeResult, Generated, run_episode

__all__ = ["EpisodeResult", "Generated", "HarnessAgentLoop", "run_episode"]
