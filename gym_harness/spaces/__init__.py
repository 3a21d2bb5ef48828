"""Spaces: ``UnicodeText``, the space of the env's text actions and observations.

* :mod:`~gym_harness.spaces.text`: ``UnicodeText`` and gymnasium's vector helpers
  registered for it.
* :mod:`~gym_harness.spaces.memory`: the growable shared memory that carries text of
  any length through ``AsyncVectorEnv(shared_memory=True)``.

Imports numpy and gymnasium only; nothing else of gym_harness.
"""

from gym_harness.spaces.text import UnicodeText

__all__ = ["UnicodeText"]
