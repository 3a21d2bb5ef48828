"""What a confined harness may reach, and what this kernel can enforce of it.

``sandbox="auto"`` (the default) confines every harness the keeper starts with what the
kernel offers; ``"strict"`` demands all of it and adds the env's own network namespace
(``gym_harness.process.netns``); ``"off"`` confines nothing. The layers, applied by the
keeper's child between fork and exec (``gym_harness.process.confine``):

* **Filesystem** (Landlock, Linux 5.13+): read and execute the system directories, the
  interpreter's prefixes, the harness's install tree (the ``node_modules`` tree of a
  CLI, the directory of each file its command names), this package, ``PYTHONPATH``,
  ``readable_paths``, ``/proc`` and ``/sys``; read and write the episode's workspace,
  private home and private tmp (``TMPDIR``; ``HOME`` too unless the config sets it), and
  the character devices of ``DEVICES`` by name. Nothing else: not the user's home, not
  the project, not other episodes, not the task's hidden files.
* **Mount namespace** (root, or unprivileged user namespaces): the harness's ``/`` shows
  only those paths, a ``/dev`` of those devices, its own ``/dev/pts`` and ``/dev/shm``;
  so no pathname unix socket of anyone else (a forkserver's, Ray's, a session bus) has
  a path it can ``connect`` to.
* **Network** (Landlock TCP rules, 6.7+): TCP connect only to the env's endpoints (the
  MCP bridge, the model endpoint or capture proxy) and the ports the adapter declares;
  bind only those the adapter declares.
* **Processes** (Landlock scoping, 6.12+; Landlock's own ptrace rule): no signal to and no
  ptrace of anything outside the harness's own tree, so ``/proc/<env pid>/environ`` is
  unreadable; no capabilities, no new privileges; the seccomp filter of ``confine``.
* **Resources** (``memory_limit_mb``, ``max_processes``, ``max_workspace_bytes``): the
  keeper's watch (memory counts memory files held and the view's ``/dev/shm`` too; the
  disk is the episode's workspace, home and tmp), and the cgroup's ``memory.max`` /
  ``pids.max`` where its controllers are delegated.

``report`` says which layers hold here; ``"auto"`` logs what is missing once.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym_harness.config import ProcessSpec
from gym_harness.errors import ConfigError
from gym_harness.process import confine

__all__ = ["Reach", "check", "policy", "report"]

logger = logging.getLogger("gym_harness.process")

#: Read and execute for every confined harness (the ones that exist).
SYSTEM_READ = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/proc",
    "/sys",
)
#: The character devices a harness may read and write, by name (nothing else of ``/dev``:
#: not the user's ``/dev/shm``, no terminal; its own ``/dev/pts`` and ``/dev/shm`` come
#: with the mount namespace).
DEVICES = confine.VIEW_DEVICES
#: The layers, each with the kernel feature it needs (``confine.probe`` keys).
LAYERS = {
    "filesystem": "fs",
    "tcp": "net_tcp",
    "scoping": "scope",
    "seccomp": "seccomp",
}
#: Layers a ``confine.probe`` key holds the reason for ("" when the kernel offers it).
_REASONED = {"mount_namespace": "view"}
_PACKAGE = Path(__file__).resolve().parents[1]  # gym_harness itself (the reference agent)


@dataclass(frozen=True)
class Reach:
    """What one episode's harness may reach when confined.

    Args:
        workspace: The episode's workspace (read-write).
        home: Its private home (read-write).
        tmp: Its private tmp (read-write; ``TMPDIR``).
        ports: The env's endpoints' TCP ports (connect).
        serve_ports: Ports the adapter has its harness serve on (bind and connect).
        read: More read-only paths (the adapter's install tree, ``readable_paths``).
        netns_fd: The env's network namespace (``"strict"``), else -1.
    """

    workspace: str
    home: str
    tmp: str
    ports: tuple[int, ...] = ()
    serve_ports: tuple[int, ...] = ()
    read: tuple[str, ...] = ()
    netns_fd: int = -1


@functools.cache
def _kernel() -> dict[str, Any]:
    return dict(confine.probe())


def report(tier: str) -> dict[str, Any]:
    """The protections in force for a harness started under ``tier``.

    Returns:
        ``{"tier", "enforced": [...], "missing": {layer: why}}``; the layers are
        filesystem, tcp, scoping, seccomp, capabilities, mount_namespace, and with
        ``"strict"`` network_namespace.
    """
    if tier == "off":
        return {"tier": tier, "enforced": [], "missing": {}}
    kernel = _kernel()
    abi = int(kernel.get("landlock_abi") or 0)
    enforced, missing = ["capabilities"], {}
    for layer, feature in LAYERS.items():
        if kernel.get(feature):
            enforced.append(layer)
        elif feature == "seccomp":
            missing[layer] = f"no seccomp filter on this machine ({os.uname().machine})"
        else:
            missing[layer] = f"the kernel's Landlock ABI is {abi}, too old for {layer} rules"
    for layer, feature in _REASONED.items():
        why = str(kernel.get(feature, "not probed"))
        if why:
            missing[layer] = why
        else:
            enforced.append(layer)
    if tier == "strict":
        from gym_harness.process.netns import unavailable

        why = unavailable()
        if why:
            missing["network_namespace"] = why
        else:
            enforced.append("network_namespace")
    return {"tier": tier, "enforced": enforced, "missing": missing}


def check(tier: str) -> None:
    """Raise ``ConfigError`` if ``tier`` cannot be had here; log once what ``"auto"`` lacks."""
    found = report(tier)
    if tier == "strict" and found["missing"]:
        reasons = "; ".join(f"{k}: {v}" for k, v in found["missing"].items())
        raise ConfigError(
            f"sandbox='strict' cannot be enforced here ({reasons}). Use sandbox='auto' to "
            "confine as far as this machine allows, or run where these are available."
        )
    if tier == "auto" and found["missing"]:
        _warn_once(tuple(sorted(found["missing"].items())))


@functools.cache
def _warn_once(missing: tuple[tuple[str, str], ...]) -> None:
    logger.warning(
        "gym_harness: sandbox='auto' confines harnesses without %s",
        "; ".join(f"{layer} ({why})" for layer, why in missing),
    )


def policy(
    spec: ProcessSpec, reach: Reach | None, argv: Sequence[str], env: Mapping[str, str], cwd: str
) -> dict[str, Any]:
    """The keeper's spawn policy: what ``confine.prepare`` reads, the namespace, limits.

    Args:
        spec: The process's settings (``sandbox``, the limits, ``readable_paths``,
            ``connect_ports``).
        reach: The episode's paths and ports (``None``: a bare process, not confined).
        argv: The resolved command (its install tree becomes readable).
        env: The harness's environment (its ``PYTHONPATH`` becomes readable).
        cwd: The harness's working directory (relative paths in ``argv`` start there).
    """
    tier = spec.sandbox
    out: dict[str, Any] = {"memory_mb": spec.memory_limit_mb, "processes": spec.max_processes}
    if reach is not None and spec.max_workspace_bytes is not None:
        paths = [reach.workspace, reach.home, reach.tmp]
        out.update(disk_bytes=spec.max_workspace_bytes, disk_paths=paths)
    if tier == "off" or reach is None:
        return out
    kernel = _kernel()
    read = [*SYSTEM_READ, *_interpreter(), str(_PACKAGE), *_install_tree(argv, cwd)]
    read += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    read += [*reach.read, *spec.readable_paths]
    rules: dict[str, Any] = {"drop_caps": True}  # each layer only where the kernel has it
    if kernel.get("fs"):
        rules.update(
            read=sorted(set(read)),
            write=[reach.workspace, reach.home, reach.tmp],
            devices=list(DEVICES),
        )
    if kernel.get("net_tcp"):
        rules.update(
            connect=sorted({*reach.ports, *reach.serve_ports, *spec.connect_ports}),
            bind=sorted(set(reach.serve_ports)),
        )
    rules.update(scope=bool(kernel.get("scope")), seccomp=bool(kernel.get("seccomp")))
    if not kernel.get("view") and kernel.get("fs"):  # the view shows what Landlock grants
        rules.update(view=True, shm_mb=spec.memory_limit_mb)
    out["confine"] = rules
    out["netns"] = reach.netns_fd >= 0
    return out


@functools.cache
def _interpreter() -> tuple[str, ...]:
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return tuple(sorted(prefixes | {os.path.dirname(os.path.realpath(sys.executable))}))


def _install_tree(argv: Sequence[str], cwd: str) -> list[str]:
    """The executable's install tree and the directory of each file the command names.

    A CLI installed from npm runs from ``.../node_modules/.bin/NAME``, a link into its
    package, which loads its dependencies beside it: the whole ``node_modules`` is read.
    """
    found = []
    for arg in argv:
        path = os.path.join(cwd, arg)
        if arg.startswith("-") or not os.path.exists(path):
            continue
        real = os.path.realpath(path)
        parts = Path(real).parts
        if "node_modules" in parts:
            top = len(parts) - 1 - parts[::-1].index("node_modules")
            found.append(str(Path(*parts[: top + 1])))
        found.append(real if os.path.isdir(real) else os.path.dirname(real))
        found.append(os.path.dirname(os.path.abspath(path)))  # a link's own (.bin)
    return found
