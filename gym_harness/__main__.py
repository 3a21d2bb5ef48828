"""``python -m gym_harness``: the ``gym-harness`` command."""

from __future__ import annotations

import sys

from gym_harness.rollout.cli import main

if __name__ == "__main__":
    sys.exit(main())
