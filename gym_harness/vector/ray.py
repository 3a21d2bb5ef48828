"""Harness envs in Ray actors (the optional extra ``gym_harness[ray]``): ``RayVectorEnv``.

``RayVectorEnv`` is a ``gymnasium.vector.VectorEnv`` whose sub-envs live in Ray actors
placed anywhere in the cluster. The actor (:class:`EnvActor`), the pool that makes,
replaces and ends actors (:class:`ActorPool`) and :func:`connect` are shared with
``gym_harness.rollout.ray.ray_rollout``, whose actors add the running of whole episodes.

Each actor holds one harness env, so its harness processes run on the actor's node: the
harness CLIs (and gym_harness itself) must be installed on every node. An actor that dies
(its node lost, ``ray.kill``, an out-of-memory kill) is an outcome, not an exception: its
step reports ``terminated`` with ``info["error_type"] == "worker_lost"``, and a fresh actor
replaces it at the next reset. The harness of a killed actor dies with it and its workspace
is removed (by its keeper, as for any owner of a ``HarnessProcess`` that dies): the actors
run with Ray's ``RAY_kill_child_processes_on_worker_exit`` off, since with it an exiting Ray
worker SIGKILLs its direct children, the keepers, before they can.

The env keywords go through the object store: ``ray.put`` stores them once, the actors
get an ``ObjectRef``, and Ray pulls it into a node's store once for every later actor there.

Threads: one caller thread drives a ``RayVectorEnv`` (as for gymnasium's vector
envs); the actors run their envs in their own processes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
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
from gym_harness.vector.worker import lost_info

__all__ = [
    "ACTOR_ENV_VARS",
    "DEFAULT_RESOURCES",
    "ActorPool",
    "EnvActor",
    "RayVectorEnv",
    "connect",
    "ray_module",
]

#: Ray actor options of one sub-env unless ``resources_per_env`` says otherwise:
#: a CPU each (a harness CLI is a busy process), spread over the nodes.
DEFAULT_RESOURCES: dict[str, Any] = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
WORKER_LOST = Outcome.WORKER_LOST
#: Set in every actor's environment. By default a Ray worker that exits (``ray.kill``,
#: an actor's ``sys.exit``) first SIGKILLs its direct children: our keepers, which then
#: never remove the workspaces. The keepers end everything the actor started instead.
ACTOR_ENV_VARS = {"RAY_kill_child_processes_on_worker_exit": "false"}


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


def connect(address: str | None = None) -> bool:
    """Connect this process to Ray unless it already is.

    Args:
        address: A cluster's address (``"auto"``, ``"HOST:6379"``,
            ``"ray://HOST:10001"``). ``None``: ``RAY_ADDRESS`` if set, else start
            a local instance bound to 127.0.0.1.

    Returns:
        True if this call connected (the caller then owns ``ray.shutdown()``).
    """
    ray = ray_module()
    if ray.is_initialized():
        return False
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
        self.actor_class = self.ray.remote(actor).options(**_actor_options(resources))

    def new(self) -> Any:
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
    ``info["error_type"] == "worker_lost"`` and gets a new actor at its reset.

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
        self._lost = np.zeros(num_envs, dtype=np.bool_)
        self._autoreset_envs = np.zeros(num_envs, dtype=np.bool_)
        self._last_info: list[dict[str, Any]] = [{} for _ in range(num_envs)]
        self._lost_error = [""] * num_envs

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every sub-env (or those of ``options["reset_mask"]``), concurrently.

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
        calls = {i: self._submit_reset(i, seeds[i], options or None) for i in wanted}
        infos: dict[str, Any] = {}
        obs = list(self._observations)
        for i, ref in calls.items():
            result = self._get(i, ref)
            if result is None:  # lost on the way: one more fresh actor, then give up
                result = self._get(i, self._submit_reset(i, seeds[i], options or None))
            if result is None:
                raise WorkerLost(
                    f"sub-env {i}: its Ray actor died twice while resetting "
                    f"({self._lost_error[i]}); check the nodes' health and memory.",
                    index=i,
                )
            obs[i], info = result
            self._last_info[i] = info
            infos = self._add_info(infos, info, i)
        self._autoreset_envs[wanted] = False
        self._observations = concatenate(self.single_observation_space, obs, self._observations)
        return self._observations, infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every sub-env concurrently (autoresetting those whose episode ended).

        Returns:
            ``(observations, rewards, terminations, truncations, infos)``, batched.
        """
        calls = []
        for i, action in enumerate(iterate(self.action_space, actions)):
            if self._autoreset_envs[i]:
                calls.append((True, self._submit_reset(i, None, None)))
            else:
                calls.append((False, self.actors[i].step.remote(action)))
        obs, infos = list(self._observations), dict[str, Any]()
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminations = np.zeros(self.num_envs, dtype=np.bool_)
        truncations = np.zeros(self.num_envs, dtype=np.bool_)
        for i, (is_reset, ref) in enumerate(calls):
            result = self._get(i, ref)
            if result is None:
                obs[i], info, terminations[i] = "", self._lost_info(i), True
            elif is_reset:
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
            self.actors[i] = self._pool.new()
            self._lost[i] = False
        return self.actors[i].reset.remote(seed, options)

    def _get(self, i: int, ref: Any) -> Any:
        """The call's result, or None when sub-env ``i``'s actor is lost (then killed)."""
        ray = self._pool.ray
        try:
            return ray.get(ref, timeout=self.timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            self._lost[i] = True
            self._lost_error[i] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            with contextlib.suppress(ray.exceptions.RayError):
                ray.kill(self.actors[i], no_restart=True)
            return None

    def _lost_info(self, i: int) -> dict[str, Any]:
        return lost_info(self._last_info[i], self._lost_error[i])
