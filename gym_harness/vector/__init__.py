"""Vector envs: ``make_vector_env``, the ``vector_entry_point`` of every registered id.

* :mod:`~gym_harness.vector.factory`: ``make_vector_env`` (gymnasium's
  ``AsyncVectorEnv``, set up for text and for lean workers).
* :mod:`~gym_harness.vector.preload`: the server stack imported once before workers
  start; :mod:`~gym_harness.vector.forkserver_preload` runs it in a forkserver.

Above the env: it may import the env and anything below; nothing below imports it.
"""

from gym_harness.vector.factory import make_vector_env

__all__ = ["make_vector_env"]
