"""Owns a HarnessProcess running the family script, reports every pid, then waits to be killed.

Prints one JSON line: {"family": [harness, child, setsid grandchild, daemon], "keeper": pid}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from gym_harness.config import HarnessConfig
from gym_harness.process import HarnessProcess

SCRIPT = Path(__file__).with_name("harness.py")


def main() -> None:
    proc = HarnessProcess(HarnessConfig(command=(sys.executable, str(SCRIPT), "family")))
    proc.start(lambda line: "ready" in line)
    family = json.loads(proc.read_line(10) or "{}")["pids"]
    print(json.dumps({"family": family, "keeper": proc.keeper_pid}), flush=True)
    time.sleep(60)  # bounded: the test kills us long before this


if __name__ == "__main__":
    main()
