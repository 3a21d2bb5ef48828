"""What ``RayVectorEnv`` and ``ray_rollout`` share on a Ray cluster (``gym_harness[ray]``).

* :func:`connect` and :func:`shutdown`: Ray started and stopped with the caller's signal
  handlers kept (:func:`keep_signal_handlers`): ``ray.init`` makes SIGTERM exit the
  process and ``ray.shutdown`` resets it to the default, so a trainer's
  save-on-preemption handler would never run.
* :class:`EnvActor`: one harness env inside a Ray actor; :class:`ActorPool` makes,
  replaces and ends the actors of one driver, a replacement on none of the nodes it is
  told to avoid.

Each actor holds one harness env, so its harness processes run on the actor's node: the
harness CLIs (and gym_harness itself) must be installed on every node. The harness of a
killed actor dies with it and its workspace is removed (by its keeper, as for any owner
of a ``HarnessProcess`` that dies): the actors run with Ray's
``RAY_kill_child_processes_on_worker_exit`` off, since with it an exiting Ray worker
SIGKILLs its direct children, the keepers, before they can. The env keywords go through
the object store: ``ray.put`` stores them once, and Ray pulls them into a node's store
once for every later actor there.

Threads: the caller's; set signal handlers only from the main thread (elsewhere they are
left as they are).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import gymnasium
from gymnasium.envs.registration import EnvSpec

from gym_harness.env import HarnessEnv
from gym_harness.errors import ConfigError
from gym_harness.utils.imports import import_optional

__all__ = [
    "ACTOR_ENV_VARS",
    "DEFAULT_RESOURCES",
    "ActorPool",
    "EnvActor",
    "connect",
    "keep_signal_handlers",
    "ray_module",
    "shutdown",
]

#: Ray actor options of one sub-env unless ``resources_per_env`` says otherwise:
#: a CPU each (a harness CLI is a busy process), spread over the nodes.
DEFAULT_RESOURCES: dict[str, Any] = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
#: Set in every actor's environment. By default a Ray worker that exits (``ray.kill``,
#: an actor's ``sys.exit``) first SIGKILLs its direct children: our keepers, which then
#: never remove the workspaces. The keepers end everything the actor started instead.
ACTOR_ENV_VARS = {"RAY_kill_child_processes_on_worker_exit": "false"}
#: The signals whose handlers Ray's init and shutdown replace (SIGTERM: init sets
#: ``sys.exit``, shutdown the default) and that ``keep_signal_handlers`` puts back.
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_NODE_LABEL = "ray.io/node-id"


def ray_module(what: str = "gym_harness.vector.ray") -> Any:
    """The ``ray`` module, or a ``ConfigError`` naming the extra (``what`` needs it)."""
    return import_optional(
        "ray",
        extra="ray",
        what=what,
        needs=("init", "is_initialized", "remote", "get", "kill"),
        note=" (on every node)",
    )


def _actor_options(resources: Mapping[str, Any]) -> dict[str, Any]:
    """``resources`` with ``ACTOR_ENV_VARS`` added to its runtime env (the caller's win)."""
    runtime_env = dict(resources.get("runtime_env") or {})
    runtime_env["env_vars"] = {**ACTOR_ENV_VARS, **(runtime_env.get("env_vars") or {})}
    return {**resources, "runtime_env": runtime_env}


@contextlib.contextmanager
def keep_signal_handlers() -> Iterator[None]:
    """Put the caller's SIGTERM, SIGINT and SIGHUP handlers back after the block.

    ``ray.init`` makes SIGTERM exit the process and ``ray.shutdown`` resets it to the
    default, so a trainer's save-on-preemption handler would never run. Only the main
    thread can set handlers; elsewhere the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {number: signal.getsignal(number) for number in _SIGNALS}
    try:
        yield
    finally:
        for number, handler in saved.items():
            if handler is not None:  # None: set outside Python, nothing to put back
                with contextlib.suppress(ValueError, OSError, TypeError):
                    signal.signal(number, handler)


def shutdown() -> None:
    """``ray.shutdown()``, keeping the caller's signal handlers."""
    ray = ray_module()
    with keep_signal_handlers():
        ray.shutdown()


def connect(address: str | None = None) -> bool:
    """Connect this process to Ray unless it already is.

    Args:
        address: A cluster's address (``"auto"``, ``"HOST:6379"``,
            ``"ray://HOST:10001"``). ``None``: ``RAY_ADDRESS`` if set, else start
            a local instance bound to 127.0.0.1.

    Returns:
        True if this call connected (the caller then owns ``shutdown()``).

    The caller's signal handlers are kept (see :func:`keep_signal_handlers`).
    """
    ray = ray_module()
    if ray.is_initialized():
        return False
    with keep_signal_handlers():
        if address or os.environ.get("RAY_ADDRESS"):
            ray.init(address=address or None)
        else:  # a private local instance: nothing of it listens beyond loopback
            ray.init(include_dashboard=False, _node_ip_address="127.0.0.1")
    return True


class EnvActor:
    """One harness env inside a Ray actor (driven by ``RayVectorEnv``; ``ray_rollout``'s
    actors add whole episodes)."""

    def __init__(self, env: str | EnvSpec, env_kwargs: Mapping[str, Any]) -> None:
        # The driver hands over its registered spec: a Ray worker needs no registry of its own.
        self.env: gymnasium.Env[Any, Any] | None = None
        self.error = ""
        try:
            self.env = gymnasium.make(env, **env_kwargs)
        except Exception as exc:  # reported by ready(), so the driver raises a ConfigError
            self.error = f"{type(exc).__name__}: {exc}"

    def ready(self) -> tuple[str, Any, Any]:
        if self.env is None:
            return self.error, None, None
        return "", self.env.observation_space, self.env.action_space

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, dict]:
        assert self.env is not None
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        assert self.env is not None
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, float(reward), bool(terminated), bool(truncated), info

    def describe(self) -> dict[str, Any]:
        import ray

        env = None if self.env is None else HarnessEnv.of(self.env)
        proc = None if env is None else env.process
        workspace = None if env is None else env.workspace
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "harness_pid": None if proc is None or proc.returncode is not None else proc.pid,
            "workspace": None if workspace is None else str(workspace),
        }

    def close(self) -> None:
        if self.env is not None:
            self.env.close()


class ActorPool:
    """Creates, replaces and ends the actors of one driver.

    Args:
        env_id: The gymnasium id each actor makes.
        env_kwargs: Its ``gymnasium.make`` keywords (put in the object store once).
        resources: Ray actor options of each actor.
        actor: The actor class (:class:`EnvActor` or a subclass).
        what: Who needs Ray, for the message when it is missing.
    """

    def __init__(
        self,
        env_id: str,
        env_kwargs: Mapping[str, Any],
        resources: Mapping[str, Any],
        *,
        actor: type[EnvActor] = EnvActor,
        what: str = "gym_harness.vector.ray",
    ) -> None:
        self.ray = ray_module(what)
        self.env_id = env_id
        self.spec = _spec_of(env_id)
        self.kwargs_ref = self.ray.put(dict(env_kwargs))  # shipped once per node
        self.options = _actor_options(resources)
        self.remote_class = self.ray.remote(actor)
        self.actor_class = self.remote_class.options(**self.options)

    def new(self, avoid: Sequence[str] = ()) -> Any:
        """A new actor, placed on none of the nodes ``avoid`` (unless the caller's
        resources choose nodes by label themselves)."""
        if avoid and "label_selector" not in self.options:
            selector = {_NODE_LABEL: f"!in({', '.join(sorted(avoid))})"}
            with contextlib.suppress(ValueError, TypeError):  # a Ray without label selectors
                actor_class = self.remote_class.options(**self.options, label_selector=selector)
                return actor_class.remote(self.spec, self.kwargs_ref)
        return self.actor_class.remote(self.spec, self.kwargs_ref)

    def check(self, actor: Any, timeout_s: float) -> tuple[Any, Any]:
        """Wait for ``actor`` to be up; return its spaces or raise ``ConfigError``."""
        try:
            error, obs_space, act_space = self.ray.get(actor.ready.remote(), timeout=timeout_s)
        except self.ray.exceptions.GetTimeoutError as exc:
            raise ConfigError(
                f"No Ray worker for {self.env_id} started within {timeout_s:g} s: does the "
                f"cluster have the resources asked per env? It has {self.ray.cluster_resources()}."
            ) from exc
        if error:
            raise ConfigError(f"Cannot make {self.env_id} on a Ray worker: {error}")
        return obs_space, act_space

    def end(self, actors: Sequence[Any], grace_s: float = 30.0) -> None:
        """Close every env (harness stopped, workspace removed), then kill the actors."""
        refs = []
        for actor in actors:
            try:
                refs.append(actor.close.remote())
            except self.ray.exceptions.RayError:
                continue
        with contextlib.suppress(self.ray.exceptions.RayError):  # dead ones: killed below
            self.ray.wait(refs, num_returns=len(refs), timeout=grace_s)
        for actor in actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except self.ray.exceptions.RayError:
                continue


def _spec_of(env_id: str) -> str | EnvSpec:
    """The registered spec of ``env_id`` in this process (a worker makes the env from it),
    or the id itself when this process does not know it (gymnasium then says so there)."""
    try:
        return gymnasium.spec(env_id)
    except gymnasium.error.Error:
        return env_id
