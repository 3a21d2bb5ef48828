"""Real benchmark suites as envs: their tasks, tools and scorers, offline.

* :mod:`~gym_harness.suites.bfcl`: the Berkeley Function-Calling Leaderboard's (v4)
  multi-turn categories as ``gym_harness/BFCL-v0``, scored by BFCL's own checker (the
  optional extra ``gym_harness[bfcl]``, plus ``bfcl-eval`` installed without its
  requirements).

A suite sits above the env: it builds a ``HarnessEnv`` with the suite's tools, tasks,
user side and reward, and reaches nothing below the env but the bridge's tool vocabulary
(``bridge/tools.py``) and the task and record values. ``import gym_harness`` never
imports a suite (nor the suite's own library); the registration names each suite's env
by an import string.
"""
