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

from importlib.metadata import PackageNotFoundError, version

#: The openenv release this part is written and tested against.
OPENENV_VERSION = "0.10.0"
_INSTALL = (
    "pip install 'gym_harness[openenv]' && pip install --no-deps 'openenv==0.10.0' "
    "(openenv 0.10.0 pins fastmcp<4, which gym_harness's fastmcp>=4.1 excludes; its harness "
    "module runs on fastmcp 4)"
)
try:
    _found = version("openenv")
    import openenv.core.harness  # noqa: F401  (a folder named openenv is no install)
except (PackageNotFoundError, ImportError):
    raise ImportError(f"gym_harness.openenv needs openenv {OPENENV_VERSION}: {_INSTALL}") from None
if _found != OPENENV_VERSION:
    raise ImportError(
        f"gym_harness.openenv is written for openenv {OPENENV_VERSION}, found {_found}: {_INSTALL}"
    )

from gym_harness.openenv.adapter import BadModelStep, ModelModeAdapter  # noqa: E402
from gym_harness.openenv.session import (  # noqa: E402
    EnvSession,
    HarnessSessionFactory,
    TextLevelTrace,
    training_trace,
)

__all__ = [
    "OPENENV_VERSION",
    "BadModelStep",
    "EnvSession",
    "HarnessSessionFactory",
    "ModelModeAdapter",
    "TextLevelTrace",
    "training_trace",
]
