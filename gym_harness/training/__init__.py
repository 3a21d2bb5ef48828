"""Training rows from model-mode episodes, for token-level trainers.

This part owns what a token-level policy needs to drive a harness in ``mode="model"``
and hand a trainer rows it can trust:

* :mod:`~gym_harness.training.chain`: :class:`TokenChain`, the prompt ids of each model
  call as the previous call's prompt + completion + the template's rendering of only what
  is new, so an episode's calls form one token chain; and its merged rows (prompt, then
  ``c1 ‖ d1 ‖ c2 …`` with a mask 1 on sampled tokens, 0 on inserted ones).
* :mod:`~gym_harness.training.tool_calls`: a completion's text as a model-mode action (the
  Hermes/Qwen ``<tool_call>{json}</tool_call>`` format).
* :mod:`~gym_harness.training.groups`: :class:`GroupRollout`, the episodes of a batch run
  concurrently through a vector env's ``send``/``recv``, one row per episode.

It imports no torch, transformers or trl: the tokenizer and the sampler are handed in
(``gym_harness.training.trl`` binds them to TRL's trainer). It sits above the env (it drives a
vector env) and nothing below imports it.
"""

from gym_harness.training.chain import ChainCall, ChainRow, TokenChain
from gym_harness.training.groups import EpisodeRow, GroupRollout, Sampler
from gym_harness.training.tool_calls import completion_action

__all__ = [
    "ChainCall",
    "ChainRow",
    "EpisodeRow",
    "GroupRollout",
    "Sampler",
    "TokenChain",
    "completion_action",
]
