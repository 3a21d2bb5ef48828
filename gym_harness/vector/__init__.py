"""Vector envs: ``make_vector_env``, the ``vector_entry_point`` of every registered id.

* :mod:`~gym_harness.vector.factory`: ``make_vector_env`` (a ``HarnessVectorEnv``, set
  up for text and for lean workers).
* :mod:`~gym_harness.vector.async_env`: ``HarnessVectorEnv``, gymnasium's
  ``AsyncVectorEnv`` that reports a dead worker as ``worker_lost`` and replaces it:
  gymnasium's ``step`` (``send`` to all, ``recv`` of all), ``reset`` and ``call`` over
* :mod:`~gym_harness.vector.core`: ``VectorCore``, the worker pipes, the one wait loop
  and EnvPool's ``send``/``recv``.
* :mod:`~gym_harness.vector.results`: the core's words (message kinds, autoreset
  arguments, the wait's slice), a sub-env's result and the batch of ready results.
* :mod:`~gym_harness.vector.ray`: ``RayVectorEnv``, sub-envs in Ray actors
  (``gym_harness[ray]``, imported only when used), and the actors and their pool that
  ``ray_rollout`` shares.
* :mod:`~gym_harness.vector.worker`: the worker processes' side, and the info of a
  step whose worker was lost (shared with ``RayVectorEnv``).
* :mod:`~gym_harness.vector.preload`: the server stack imported once before workers
  start; :mod:`~gym_harness.vector.forkserver_preload` runs it in a forkserver.

Above the env: it may import the env and anything below; nothing below imports it.
"""

from gym_harness.vector.async_env import HarnessVectorEnv
from gym_harness.vector.factory import make_vector_env

__all__ = ["HarnessVectorEnv", "make_vector_env"]
