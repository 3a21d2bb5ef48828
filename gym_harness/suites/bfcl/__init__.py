"""BFCL v4 multi-turn as gymnasium envs (``gym_harness/BFCL-v0``), scored by BFCL's checker.

This part owns the Berkeley Function-Calling Leaderboard's multi-turn categories
(``base``, ``miss_func``, ``miss_param``, ``long_context``) as envs: the tasks and their
ground truth as data (``data.py``, :func:`tasks`), the eight stateful backends served as
the env's MCP tools under BFCL's own names and schemas (``backends.py``), BFCL's own
``multi_turn_checker`` as the reward (``checker.py``), the env (``env.py``,
:class:`BFCLEnv`) and ready policies (``policies.py``: :func:`scripted_user` for turn
mode, :class:`GroundTruthPolicy` for model mode).

It needs ``bfcl-eval`` installed without its own requirements, and mpmath:
``pip install 'gym_harness[bfcl]' && pip install --no-deps 'bfcl-eval==2026.3.23'``.
Importing this package without bfcl-eval raises a ``ConfigError`` that says so. Of
``bfcl_eval`` it reads the data files and imports only the backends' modules and the
multi-turn checker, which use the standard library and mpmath.

It sits above the env (it builds a ``HarnessEnv``); nothing in the package imports it but
the registration's import string, so ``import gym_harness`` never loads it or bfcl_eval.
"""

from __future__ import annotations

from gym_harness.suites.bfcl.data import (
    BFCL_EVAL_VERSION,
    CATEGORIES,
    INSTALL,
    BFCLTask,
    SuiteTask,
    data_dir,
    tasks,
)

data_dir()  # a ConfigError saying how to install bfcl-eval when it is missing

from gym_harness.suites.bfcl.checker import Verdict, check  # noqa: E402
from gym_harness.suites.bfcl.env import BFCLEnv  # noqa: E402
from gym_harness.suites.bfcl.policies import (  # noqa: E402
    GroundTruthPolicy,
    parse_call,
    scripted_user,
)

__all__ = [
    "BFCL_EVAL_VERSION",
    "CATEGORIES",
    "INSTALL",
    "BFCLEnv",
    "BFCLTask",
    "GroundTruthPolicy",
    "SuiteTask",
    "Verdict",
    "check",
    "data_dir",
    "parse_call",
    "scripted_user",
    "tasks",
]
