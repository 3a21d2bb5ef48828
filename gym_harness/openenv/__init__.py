"""Training any harness with TRL through OpenEnv's harness interfaces (the extra
``gym_harness[openenv]``).

This part owns the bridge to ``openenv.core.harness``: :class:`HarnessSessionFactory`
(a ``ResourceSessionFactory`` whose sessions are our envs, and also ``TrainableSession``
for black-box turn-mode rollouts with capture), :class:`ModelModeAdapter` (a
``HarnessAdapter`` whose ``run_white_box`` drives any harness in ``mode="model"``, each
model call one ``model_step``), and :func:`training_trace` (an episode's trace as a
validated ``TrainingTrace``). Hand them to OpenEnv's ``build_harness_rollout_func`` to
get the ``rollout_func`` TRL's ``GRPOTrainer`` calls.

It is the only part that imports ``openenv``, and nothing in the package imports it:
``import gym_harness`` never loads openenv (or the gradio it pulls in). It sits above the
env and may import any part; it must never be imported by one.
"""

from gym_harness.openenv.adapter import ModelModeAdapter
from gym_harness.openenv.session import (
    EnvSession,
    HarnessSessionFactory,
    TextLevelTrace,
    training_trace,
)

__all__ = [
    "EnvSession",
    "HarnessSessionFactory",
    "ModelModeAdapter",
    "TextLevelTrace",
    "training_trace",
]
