"""Vector workers inherit the bridge's server stack from the parent instead of importing
it each, and no worker ever imports the MCP client (``mcp.client``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "gym_harness" / "agents" / "reference.py"

# Run in a fresh interpreter: this test process may have imported mcp (and its client)
# already, and a forked worker inherits whatever its parent has.
SCRIPT = textwrap.dedent(
    """
    import gc, json, sys, threading
    import gym_harness

    def worker_state() -> str:
        \"\"\"What this vector worker has loaded (the tool runs in the worker).\"\"\"
        import gym_harness.vector.preload as preload
        return json.dumps({
            "client": sorted(m for m in sys.modules if m.startswith("mcp.client")),
            "preloaded": preload._PRELOADED,
            "frozen": gc.get_freeze_count(),
        })

    def main() -> None:
        envs = gym_harness.make_vector_env(
            2, command=[sys.executable, sys.argv[1]], tools=[worker_state], context=sys.argv[2]
        )
        try:
            threads = [t.name for t in threading.enumerate()]  # right after the fork
            parent = sorted(m for m in sys.modules if m.startswith("mcp.client"))
            stack = "fastmcp.server.server" in sys.modules and "uvicorn" in sys.modules
            envs.reset(seed=0)
            obs, _, terminated, truncated, info = envs.step(["/call worker_state {}"] * 2)
            assert not terminated.any() and not truncated.any(), info
            replies = [o.removeprefix("worker_state -> ") for o in obs]
            print(json.dumps({"parent_client": parent, "stack": stack, "workers": replies,
                              "threads": threads}))
        finally:
            envs.close()

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_forked_workers_inherit_the_server_stack_without_the_mcp_client(
    tmp_path: Path, context: str
) -> None:
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script), str(REFERENCE), context],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # fork: the parent imports the stack; forkserver: the forkserver does, not the parent.
    assert result["stack"] is (context == "fork")
    assert result["parent_client"] == []
    assert result["threads"] == ["MainThread"]  # the preload left no thread to fork beside
    for reply in result["workers"]:
        state = json.loads(reply)
        assert state["client"] == [], state
        assert state["preloaded"] is True
        assert state["frozen"] > 0  # the inherited objects are out of the collector's way


def test_lazy_mcp_resolves_package_names_from_their_submodules() -> None:
    code = textwrap.dedent(
        """
        import sys
        from gym_harness.vector.preload import install_lazy_mcp
        assert install_lazy_mcp()
        assert not install_lazy_mcp()  # once only
        import mcp
        from mcp import MCPError, ServerSession, Tool
        import mcp_types
        assert Tool is mcp_types.Tool
        assert mcp.types.__name__ == "mcp.types"
        assert "mcp.client" not in sys.modules
        assert mcp.Client.__module__.startswith("mcp.client")  # asked for: imported then
        try:
            mcp.no_such_name
        except AttributeError:
            pass
        else:
            raise AssertionError("an unknown name must raise AttributeError")
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.stdout.strip() == "ok", done.stderr[-3000:]
