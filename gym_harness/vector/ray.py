"""Harness envs in Ray actors (the optional extra ``gym_harness[ray]``): ``RayVectorEnv``.

``RayVectorEnv`` is a ``gymnasium.vector.VectorEnv`` whose sub-envs live in Ray actors
placed anywhere in the cluster. The actor (:class:`EnvActor`), the pool that makes,
replaces and ends actors (:class:`ActorPool`) and :func:`connect` are shared with
``gym_harness.rollout.ray.ray_rollout``, whose actors add the running of whole episodes.

Each actor holds one harness env, so its harness processes run on the actor's node: the
harness CLIs (and gym_harness itself) must be installed on every node. An actor that dies
(its node lost, ``ray.kill``, an out-of-memory kill) is an outcome, not an exception: its
step reports ``terminated`` with ``info["error_type"] == "worker_lost"``, and a fresh actor
is placed in the background (see ``RayVectorEnv.step``). The harness of a killed actor
dies with it and its workspace is removed (by its keeper, as for any owner of a
``HarnessProcess`` that dies): the actors run with Ray's
``RAY_kill_child_processes_on_worker_exit`` off, since with it an exiting Ray worker
SIGKILLs its direct children, the keepers, before they can.

The env keywords go through the object store: ``ray.put`` stores them once, the actors
get an ``ObjectRef``, and Ray pulls it into a node's store once for every later actor there.

Threads: one caller thread drives a ``RayVectorEnv`` (as for gymnasium's vector
envs); the actors run their envs in their own processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from gym_harness.env import HarnessEnv
from gym_harness.errors import ConfigError, WorkerLost
from gym_harness.outcome import Outcome
from gym_harness.utils.imports import import_optional
from gym_harness.vector.resets import batch_seeds, pop_reset_mask
from gym_harness.vector.worker import fault_info, lost_info

__all__ = [
    "ACTOR_ENV_VARS",
    "DEFAULT_RESOURCES",
    "ActorPool",
    "EnvActor",
    "RayVectorEnv",
    "connect",
    "keep_signal_handlers",
    "ray_module",
    "shutdown",
]

#: Ray actor options of one sub-env unless ``resources_per_env`` says otherwise:
#: a CPU each (a harness CLI is a busy process), spread over the nodes.
DEFAULT_RESOURCES: dict[str, Any] = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
WORKER_LOST = Outcome.WORKER_LOST
#: Set in every actor's environment. By default a Ray worker that exits (``ray.kill``,
#: an actor's ``sys.exit``) first SIGKILLs its direct children: our keepers, which then
#: never remove the workspaces. The keepers end everything the actor started instead.
ACTOR_ENV_VARS = {"RAY_kill_child_processes_on_worker_exit": "false"}
#: How long a node where an actor was lost is avoided for its replacements, unless Ray
#: reports it dead sooner (then Ray places nothing there anyway).
SUSPECT_S = 120.0
#: The signals whose handlers Ray's init and shutdown replace (SIGTERM: init sets
#: ``sys.exit``, shutdown the default) and that ``keep_signal_handlers`` puts back.
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_NODE_LABEL = "ray.io/node-id"
#: What Ray's error says when an actor died with its node (not killed, not out of memory).
_NODE_DIED = "its node has died"


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

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any]) -> None:
        import gym_harness  # noqa: F401  (registers the env ids in this worker)

        self.env: gymnasium.Env[Any, Any] | None = None
        self.error = ""
        try:
            self.env = gymnasium.make(env_id, **env_kwargs)
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
                return actor_class.remote(self.env_id, self.kwargs_ref)
        return self.actor_class.remote(self.env_id, self.kwargs_ref)

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


class RayVectorEnv(VectorEnv):
    """A vector env whose sub-envs are Ray actors, stepped concurrently.

    Same spaces, next-step autoreset and info stacking as gymnasium's own
    vector envs. A sub-env whose actor dies reports a terminated step with
    ``info["error_type"] == "worker_lost"`` and gets a new actor, placed in the
    background. A step waits at most ``timeout_s`` in all. The caller's signal handlers
    are kept across the Ray start this does (:func:`keep_signal_handlers`).

    Args:
        env_id: A gymnasium id, made in each actor with ``gymnasium.make`` (the
            gym_harness ids, or ``"pkg.module:Id-v0"`` for ids a module registers).
        num_envs: How many sub-envs (one actor each).
        env_kwargs: Keywords of ``gymnasium.make`` (``HarnessEnv`` options).
        resources_per_env: Ray actor options of each sub-env (``num_cpus``,
            ``num_gpus``, ``memory``, ``resources={"harness": 1}``,
            ``scheduling_strategy``...). Default: one CPU, spread over the nodes.
        address: The cluster to connect to when Ray is not initialized yet
            (``None``: ``RAY_ADDRESS``, else a local instance on 127.0.0.1).
        timeout_s: The longest one reset or step of a sub-env may take (actor
            placement included); past it the actor is killed and reported lost.

    Raises:
        ConfigError: Ray is not installed, the env cannot be made on a worker,
            or no actor could be placed within ``timeout_s``.

    Example:
        >>> envs = RayVectorEnv("gym_harness/Reference-v0", 4)  # doctest: +SKIP
        >>> obs, infos = envs.reset(seed=0)  # doctest: +SKIP
        >>> obs, rewards, terminated, truncated, infos = envs.step(obs)  # doctest: +SKIP
        >>> envs.close()  # doctest: +SKIP
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        resources_per_env: Mapping[str, Any] | None = None,
        address: str | None = None,
        timeout_s: float = 3600.0,
    ) -> None:
        if num_envs < 1:
            raise ConfigError(f"num_envs must be at least 1, got {num_envs}.")
        connect(address)
        self.num_envs = num_envs
        self.timeout_s = timeout_s
        self.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}
        resources = DEFAULT_RESOURCES if resources_per_env is None else resources_per_env
        self._pool = ActorPool(env_id, env_kwargs or {}, resources)
        self.actors: list[Any] = [self._pool.new() for _ in range(num_envs)]
        try:
            spaces = self._pool.check(self.actors[0], timeout_s)
        except BaseException:
            self._pool.end(self.actors, grace_s=5.0)
            raise
        self.single_observation_space, self.single_action_space = spaces
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._observations: Any = create_empty_array(
            self.single_observation_space, num_envs, np.zeros
        )
        self._lost = np.zeros(num_envs, dtype=np.bool_)  # no live actor: replace it
        self._autoreset_envs = np.zeros(num_envs, dtype=np.bool_)
        self._last_info: list[dict[str, Any]] = [{} for _ in range(num_envs)]
        self._lost_error = [""] * num_envs
        # A replacement being placed: sub-env -> (its probe, its reset), both ObjectRefs.
        self._placing: dict[int, tuple[Any, Any]] = {}
        self._where = [self.actors[i].describe.remote() for i in range(num_envs)]  # nodes
        self._suspects: dict[str, float] = {}  # node id -> when an actor was lost there

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every sub-env (or those of ``options["reset_mask"]``), concurrently.

        A sub-env whose actor was lost gets a fresh actor first, and the reset waits for it
        (at most ``timeout_s`` in all).

        Args:
            seed: ``None``, an int (``seed + i`` for sub-env ``i``) or one per sub-env.
            options: Passed to each sub-env's reset; ``reset_mask`` as in gymnasium.

        Returns:
            The batched observations and the stacked infos.

        Raises:
            WorkerLost: A sub-env's fresh actor was lost too while resetting.
        """
        seeds = batch_seeds(seed, self.num_envs)
        options = dict(options or {})
        mask = pop_reset_mask(options, self.num_envs)
        wanted = [i for i in range(self.num_envs) if mask[i]]
        for i in wanted:
            self._placing.pop(i, None)  # this reset replaces the placing one's
        calls = {i: self._submit_reset(i, seeds[i], options or None) for i in wanted}
        results = self._gather(calls, time.monotonic() + self.timeout_s)
        retry = [i for i in wanted if results[i] is None]  # lost: one more fresh actor each
        again = {i: self._submit_reset(i, seeds[i], options or None) for i in retry}
        results.update(self._gather(again, time.monotonic() + self.timeout_s))
        infos: dict[str, Any] = {}
        obs = list(self._observations)
        for i in wanted:
            result = results[i]
            if result is None:
                raise WorkerLost(
                    f"sub-env {i}: its Ray actor died twice while resetting "
                    f"({self._lost_error[i]}); check the nodes' health and memory.",
                    index=i,
                )
            if isinstance(result, BaseException):
                raise result
            obs[i], info = result
            self._last_info[i] = info
            infos = self._add_info(infos, info, i)
        self._autoreset_envs[wanted] = False
        self._observations = concatenate(self.single_observation_space, obs, self._observations)
        return self._observations, infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every sub-env concurrently (autoresetting those whose episode ended).

        A step waits at most ``timeout_s`` in all. A sub-env whose actor is lost (its
        node gone, killed, or silent past the deadline) reports ``worker_lost``, and a
        replacement actor is placed in the background, on none of the nodes where actors
        were lost lately; until it is up, the sub-env's steps report ``worker_lost`` again
        (the survivors' results never wait for it), then its first step is its reset.
        An exception of a sub-env's env is that sub-env's ``env_error`` result.

        Returns:
            ``(observations, rewards, terminations, truncations, infos)``, batched.
        """
        deadline = time.monotonic() + self.timeout_s
        calls: dict[int, Any] = {}
        resets: set[int] = set()
        for i, action in enumerate(iterate(self.action_space, actions)):
            if i in self._placing:
                continue
            if self._lost[i]:
                self._replace(i)
                continue
            if self._autoreset_envs[i]:
                calls[i] = self.actors[i].reset.remote(None, None)
                resets.add(i)
            else:
                calls[i] = self.actors[i].step.remote(action)
        results = self._gather(calls, deadline)
        placed = self._placed(deadline, wait=not calls)
        resets |= set(placed)
        results.update(placed)
        obs, infos = list(self._observations), dict[str, Any]()
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminations = np.zeros(self.num_envs, dtype=np.bool_)
        truncations = np.zeros(self.num_envs, dtype=np.bool_)
        for i in range(self.num_envs):
            result = results.get(i)
            if result is None:  # lost now, or its replacement is not up yet
                if self._lost[i] and i not in self._placing:
                    self._replace(i)  # in the background, from now
                obs[i], info, terminations[i] = "", self._lost_info(i), True
            elif isinstance(result, BaseException):
                error = f"{type(result).__name__}: {result} (raised in sub-env {i}'s Ray actor)"
                info = fault_info(self._last_info[i], Outcome.ENV_ERROR, error)
                obs[i], terminations[i] = "", True
            elif i in resets:
                obs[i], info = result
            else:
                obs[i], rewards[i], terminations[i], truncations[i], info = result
            self._last_info[i] = info
            infos = self._add_info(infos, info, i)
        self._observations = concatenate(self.single_observation_space, obs, self._observations)
        self._autoreset_envs = np.logical_or(terminations, truncations)
        return self._observations, rewards, terminations, truncations, infos

    def worker_info(self) -> list[dict[str, Any]]:
        """Where each sub-env runs: ``node_id``, actor ``pid``, ``harness_pid`` and the
        episode's ``workspace`` directory (``None`` before the first reset)."""
        ray = self._pool.ray
        return list(ray.get([a.describe.remote() for a in self.actors], timeout=self.timeout_s))

    def close_extras(self, **kwargs: Any) -> None:
        """End every env (its harness and workspace) and every actor; never raises."""
        self._pool.end(self.actors)

    # ----------------------------------------------------------------- internals

    def _submit_reset(self, i: int, seed: int | None, options: dict[str, Any] | None) -> Any:
        if self._lost[i]:
            self._new_actor(i)
        return self.actors[i].reset.remote(seed, options)

    def _new_actor(self, i: int) -> None:
        self.actors[i] = self._pool.new(avoid=self._avoided())
        self._where[i] = self.actors[i].describe.remote()
        self._lost[i] = False

    def _replace(self, i: int) -> None:
        """Start placing a fresh actor for sub-env ``i``; its reset is taken when it is up."""
        self._new_actor(i)
        self._placing[i] = (self._where[i], self.actors[i].reset.remote(None, None))

    def _gather(self, calls: Mapping[int, Any], deadline: float) -> dict[int, Any]:
        """Each call's result by ``deadline`` (one wait for all): ``None`` for a sub-env
        whose actor is lost (then killed), the exception for an env that raised."""
        ray = self._pool.ray
        refs = {ref: i for i, ref in calls.items()}
        ready: list[Any] = []
        if refs:
            ready, _ = ray.wait(
                list(refs), num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic())
            )
        results: dict[int, Any] = {i: None for i in calls}
        for ref in ready:
            results[refs[ref]] = self._take(refs[ref], ref)
        for i in refs.values():
            if results[i] is None and not self._lost[i]:
                self._lose(i, f"no result within {self.timeout_s:g} s")
        return results

    def _placed(self, deadline: float, *, wait: bool) -> dict[int, Any]:
        """The resets of the replacements that are up (``wait``: for the first, until
        ``deadline``, when no other sub-env has a result to give)."""
        ray = self._pool.ray
        if not self._placing:
            return {}
        resets = {reset: i for i, (_, reset) in self._placing.items()}
        timeout = max(0.0, deadline - time.monotonic()) if wait else 0.0
        ready, _ = ray.wait(list(resets), num_returns=1, timeout=timeout)
        if ready:  # whatever else is in by now too
            ready, _ = ray.wait(list(resets), num_returns=len(resets), timeout=0)
        results: dict[int, Any] = {}
        for ref in ready:
            i = resets[ref]
            del self._placing[i]
            result = self._take(i, ref)
            if result is not None:
                results[i] = result
        return results

    def _take(self, i: int, ref: Any) -> Any:
        """A ready call's result; ``None`` when sub-env ``i``'s actor is lost (then
        killed); the exception when its env raised."""
        ray = self._pool.ray
        try:
            return ray.get(ref, timeout=0)
        except ray.exceptions.RayActorError as exc:
            unreachable = isinstance(exc, ray.exceptions.ActorUnavailableError)
            suspect = unreachable or _NODE_DIED in str(exc)
            self._lose(i, f"{type(exc).__name__}: {str(exc).splitlines()[0]}", suspect=suspect)
        except ray.exceptions.RayTaskError as exc:
            return exc.cause if isinstance(exc.cause, Exception) else exc
        except ray.exceptions.RayError as exc:
            self._lose(i, f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
        return None

    def _lose(self, i: int, why: str, *, suspect: bool = False) -> None:
        """Mark sub-env ``i``'s actor lost and kill it; ``suspect`` (its node died or is
        unreachable): avoid that node a while, even if Ray still lists it alive."""
        ray = self._pool.ray
        self._lost[i] = True
        self._lost_error[i] = why
        self._placing.pop(i, None)
        if suspect:
            node = self._node_of(i)
            if node:
                self._suspects[node] = time.monotonic()
        with contextlib.suppress(ray.exceptions.RayError):
            ray.kill(self.actors[i], no_restart=True)

    def _node_of(self, i: int) -> str:
        """The node sub-env ``i``'s actor ran on, if it ever said (never waits)."""
        ray = self._pool.ray
        with contextlib.suppress(ray.exceptions.RayError):
            ready, _ = ray.wait([self._where[i]], timeout=0)
            if ready:
                return str(ray.get(ready[0], timeout=0)["node_id"])
        return ""

    def _avoided(self) -> list[str]:
        """The nodes where an actor was lost in the last ``SUSPECT_S`` seconds."""
        now = time.monotonic()
        self._suspects = {n: t for n, t in self._suspects.items() if now - t < SUSPECT_S}
        return list(self._suspects)

    def _lost_info(self, i: int) -> dict[str, Any]:
        why = self._lost_error[i]
        if i in self._placing:
            why += "; its replacement actor is not up yet (the cluster may have no room)"
        return lost_info(self._last_info[i], why)
