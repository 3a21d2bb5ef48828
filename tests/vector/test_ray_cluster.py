"""RayVectorEnv on a real multi-node Ray cluster on this machine, loopback only.

Each node is started as an operator would: ``ray start --head`` bound to 127.0.0.1 on a
port of its own, then ``ray start --address=127.0.0.1:PORT`` for a worker node, every
node with ``RAY_AUTH_MODE=token`` and the cluster's token in its environment (never in
argv). Each node offers two "harness" slots and a resource naming it, so four sub-envs
of one "harness" slot each fill the cluster: two on the head, two on the worker.

Losing a node is killing the process group its ``ray start`` made (the raylet and its
agents) with SIGKILL, while a step is under way. The Ray workers of that node then exit,
and the keepers of their harnesses end the harnesses and remove the workspaces.

Teardown stops only what the test started: the nodes' process groups, then any process
whose command line names the cluster's own temporary directory, by pid.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from support import LINE_AGENT
from support.process import removed, wait_gone

import gym_harness  # noqa: F401  (registers the env ids)

ray = pytest.importorskip("ray")
from gym_harness.vector.ray import RayVectorEnv, connect, shutdown  # noqa: E402

#: One Ray cluster at a time: the Ray tests run on one test worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

AGENT = str(LINE_AGENT)
#: One "harness" slot per sub-env, no CPU: each node's two slots decide the placement.
ON_A_SLOT = {"num_cpus": 0, "resources": {"harness": 1}}
#: The longest one step of a sub-env may take (a lost node's sub-envs may take all of it).
TIMEOUT_S = 60.0
#: Each node's share: two sub-envs.
SLOTS = 2


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now (bound together, so all distinct)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


class Cluster:
    """A Ray head and worker nodes on 127.0.0.1, each started by ``ray start`` in a
    process group of its own (its pgid is the pid of its ``ray start``)."""

    def __init__(self) -> None:
        # Ray's unix socket paths must stay under 108 bytes: a short directory of our own.
        self.root = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
        self.port = free_ports(1)[0]
        self.address = f"127.0.0.1:{self.port}"
        token = secrets.token_hex(32)
        self.env_vars = {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": token,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_DEDUP_LOGS": "0",
        }
        home = self.root / "home"
        home.mkdir()
        self.env = {**os.environ, **self.env_vars, "HOME": str(home)}
        # Every Ray process imports jsonschema, which builds rfc3987_syntax's grammar when
        # that is installed (the notebooks extra brings it): 2.5 of the 3.5 s of CPU an
        # ``import ray`` takes here. A node's agents and workers pay it at once, and under
        # the suite's load a node then misses Ray's fixed 30 s startup wait. The nodes get
        # a module of that name that raises ImportError, so jsonschema goes without it
        # (only its "iri" format check, which nothing here uses).
        stubs = self.root / "stubs"
        stubs.mkdir()
        (stubs / "rfc3987_syntax.py").write_text('raise ImportError("not for these nodes")\n')
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(stubs), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        self.env.pop("RAY_ADDRESS", None)
        self.groups: dict[str, int] = {}  # node name -> its process group
        self.ray = str(Path(sys.executable).with_name("ray"))

    def start(self, name: str) -> None:
        """Start node ``name`` (the first is the head) with two "harness" slots."""
        ports = free_ports(7)
        args = [
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            f"--resources={json.dumps({'harness': SLOTS, name: 1})}",
            f"--node-manager-port={ports[0]}",
            f"--object-manager-port={ports[1]}",
            f"--metrics-export-port={ports[2]}",
            f"--dashboard-agent-grpc-port={ports[3]}",
            f"--dashboard-agent-listen-port={ports[4]}",
            f"--runtime-env-agent-port={ports[5]}",
            f"--min-worker-port={ports[6]}",
            f"--max-worker-port={ports[6] + 100}",
            "--disable-usage-stats",
        ]
        if self.groups:
            args.append(f"--address={self.address}")
        else:
            args += [
                "--head",
                f"--port={self.port}",
                "--include-dashboard=false",
                f"--temp-dir={self.root}",
            ]
        proc = subprocess.Popen(
            [self.ray, "start", *args],
            env=self.env,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.groups[name] = proc.pid
        try:
            out, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        assert proc.returncode == 0, f"ray start ({name}) failed:\n{out[-3000:]}"

    def node_id(self, name: str, timeout_s: float = 60.0) -> str:
        """The id of live node ``name``, once the driver sees it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in ray.nodes():
                if node["Alive"] and name in node["Resources"]:
                    return str(node["NodeID"])
            time.sleep(0.2)
        raise AssertionError(f"node {name} did not join within {timeout_s:g} s")

    def members(self, name: str) -> list[psutil.Process]:
        """The processes of node ``name``'s process group."""
        group = self.groups[name]
        found = []
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) == group:
                    found.append(proc)
            except (OSError, psutil.Error):
                continue
        return found

    def kill(self, name: str) -> None:
        """Lose node ``name``: SIGKILL its process group (the raylet and its agents)."""
        os.killpg(self.groups[name], signal.SIGKILL)

    def stop(self) -> None:
        """End every process of the cluster: the nodes' groups (SIGTERM, then SIGKILL),
        then whatever names the cluster's directory (Ray's workers, in groups of their
        own), by pid; remove the directory."""
        procs = [p for name in self.groups for p in self.members(name)]
        for group in self.groups.values():
            try:
                os.killpg(group, signal.SIGTERM)
            except ProcessLookupError:
                continue
        _, alive = psutil.wait_procs(procs, timeout=15)
        for proc in alive:
            proc.kill()
        psutil.wait_procs(alive, timeout=5)
        left = self.named()
        for proc in left:
            proc.kill()
        psutil.wait_procs(left, timeout=5)
        shutil.rmtree(self.root, ignore_errors=True)

    def named(self) -> list[psutil.Process]:
        """The processes whose command line names the cluster's directory."""
        found = []
        for proc in psutil.process_iter():
            try:
                if str(self.root) in " ".join(proc.cmdline()):
                    found.append(proc)
            except psutil.Error:
                continue
        return found


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A head node, started, and this process connected to it as the driver (with the
    cluster's token: Ray reads ``RAY_AUTH_MODE`` into its config when first imported, and
    keeps the token it first loaded, so both are read again once the variables are set,
    and after they are put back: an earlier Ray test of this process had them cached)."""
    made = Cluster()
    with pytest.MonkeyPatch.context() as env:
        for key, value in made.env_vars.items():
            env.setenv(key, value)
        env.delenv("RAY_ADDRESS", raising=False)
        reread_ray_auth()
        try:
            made.start("head")
            connect(made.address)
            yield made
        finally:
            shutdown()
            made.stop()
    reread_ray_auth()


def reread_ray_auth() -> None:
    """Make this process's Ray read its auth mode and token from the environment again."""
    ray._raylet.Config.initialize("")
    ray._raylet.AuthenticationTokenLoader.instance().reset_cache()


def actions(texts: list[str]) -> np.ndarray:
    return np.array(texts, dtype=object)


@pytest.mark.timeout(900)
def test_a_node_lost_mid_step_gives_the_survivors_results_and_its_sub_envs_come_back(
    cluster: Cluster,
) -> None:
    cluster.start("worker1")
    nodes = {cluster.node_id(name): name for name in ("head", "worker1")}
    envs = RayVectorEnv(
        "gym_harness/Command-v0",
        4,
        env_kwargs={"command": [sys.executable, AGENT]},
        resources_per_env=ON_A_SLOT,
        timeout_s=TIMEOUT_S,
    )
    try:
        envs.reset(seed=0)
        before = envs.worker_info()
        where = [nodes[w["node_id"]] for w in before]
        assert sorted(where) == ["head", "head", "worker1", "worker1"]  # both, and full
        lost = [i for i, name in enumerate(where) if name == "worker1"]
        kept = [i for i in range(4) if i not in lost]

        # Mid-step: the worker node's harnesses are stalled in their turn when it dies.
        killer = threading.Timer(2.0, cluster.kill, args=("worker1",))
        killer.start()
        started = time.monotonic()
        texts = ["stall" if i in lost else f"a{i}" for i in range(4)]
        obs, _, terminated, truncated, info = envs.step(actions(texts))
        elapsed = time.monotonic() - started
        killer.join()
        for i in kept:
            assert obs[i] == f"echo: a{i}" and info["error_type"][i] == ""
            assert not terminated[i] and not truncated[i]
        for i in lost:
            assert obs[i] == "" and terminated[i] and info["error_type"][i] == "worker_lost"
        # One timeout_s in all (with slack for a loaded machine), never one per lost
        # sub-env, and never waiting for room for the replacements (there is none).
        assert elapsed < 1.5 * TIMEOUT_S, elapsed
        # The lost node's harnesses and workspaces went with it (their keepers ended them).
        assert wait_gone([before[i]["harness_pid"] for i in lost], 30.0) == []
        assert all(removed(Path(before[i]["workspace"]), 30.0) for i in lost)

        # The cluster is full: the replacements wait for room in the background, the
        # survivors step on, and the lost sub-envs say their replacement is not up yet.
        obs, _, terminated, _, info = envs.step(actions(["b0", "b1", "b2", "b3"]))
        for i in kept:
            assert obs[i] == f"echo: b{i}" and info["error_type"][i] == ""
        for i in lost:
            assert info["error_type"][i] == "worker_lost" and "not up yet" in info["error"][i]

        # Room again: a new worker node joins, and the lost sub-envs come back on it.
        cluster.start("worker2")
        fresh = cluster.node_id("worker2")
        back: set[int] = set()
        turn, deadline = 0, time.monotonic() + 300
        while len(back) < len(lost) and time.monotonic() < deadline:
            obs, _, terminated, _, info = envs.step(actions([f"c{turn}"] * 4))
            for i in kept:
                assert obs[i] == f"echo: c{turn}" and info["error_type"][i] == ""
            for i in lost:
                if i in back:
                    assert obs[i] == f"echo: c{turn}" and info["error_type"][i] == ""
                elif info["error_type"][i] == "":  # up: its first step is its reset
                    assert obs[i] == "" and info["turn"][i] == 0 and not terminated[i]
                    back.add(i)
                else:
                    assert info["error_type"][i] == "worker_lost"
            turn += 1
            time.sleep(0.5)  # a poll: the replacements start in their own time
        assert back == set(lost), "the lost sub-envs did not come back on the new node"
        obs, _, terminated, _, info = envs.step(actions(["d0", "d1", "d2", "d3"]))
        assert list(obs) == ["echo: d0", "echo: d1", "echo: d2", "echo: d3"]
        after = envs.worker_info()
        assert {after[i]["node_id"] for i in lost} == {fresh}
        assert [after[i]["pid"] for i in kept] == [before[i]["pid"] for i in kept]
        # A reset gets every sub-env too.
        obs, info = envs.reset(seed=1)
        assert list(info["error_type"]) == [""] * 4 and list(info["turn"]) == [0] * 4
    finally:
        envs.close()
