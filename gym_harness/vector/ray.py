"""``RayVectorEnv``: a vector env whose sub-envs are Ray actors (``gym_harness[ray]``).

``RayVectorEnv`` is a ``gymnasium.vector.VectorEnv`` whose sub-envs live in Ray actors
placed anywhere in the cluster (:mod:`~gym_harness.vector.ray_cluster`'s actors, pool and
connection, shared with ``gym_harness.rollout.ray.ray_rollout``).

An actor that dies (its node lost, ``ray.kill``, an out-of-memory kill) is an outcome,
not an exception: its step reports ``terminated`` with ``info["error_type"] ==
"worker_lost"``, and a fresh actor is placed in the background (see
``RayVectorEnv.step``); a step waits at most ``timeout_s`` in all. Ray is imported only
when a ``RayVectorEnv`` is made.

Threads: one caller thread drives a ``RayVectorEnv`` (as for gymnasium's vector
envs); the actors run their envs in their own processes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from gym_harness.errors import ConfigError, WorkerLost
from gym_harness.outcome import Outcome
from gym_harness.vector.ray_cluster import (
    DEFAULT_RESOURCES,
    ActorPool,
    connect,
    keep_signal_handlers,
    shutdown,
)
from gym_harness.vector.resets import batch_seeds, pop_reset_mask
from gym_harness.vector.worker import fault_info, lost_info

__all__ = ["SUSPECT_S", "RayVectorEnv", "connect", "keep_signal_handlers", "shutdown"]

#: How long a node where an actor was lost is avoided for its replacements, unless Ray
#: reports it dead sooner (then Ray places nothing there anyway).
SUSPECT_S = 120.0
#: What Ray's error says when an actor died with its node (not killed, not out of memory).
_NODE_DIED = "its node has died"


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
        """Where each sub-env runs: ``node_id``, actor ``pid``, ``harness_pid``, the
        episode's ``workspace`` directory (``None`` before the first reset), and ``lost``.

        Waits at most ``timeout_s``; never raises for a sub-env. One whose actor is lost
        (its node gone, killed, silent past the wait) or whose replacement is not up yet
        gives ``None`` for the rest and ``lost``: why (else ""); its next step reports
        ``worker_lost``, as it would have anyway.
        """
        calls = {
            i: actor.describe.remote()
            for i, actor in enumerate(self.actors)
            if not self._lost[i] and i not in self._placing
        }
        results = self._gather(calls, time.monotonic() + self.timeout_s)
        return [self._whereabouts(i, results.get(i)) for i in range(self.num_envs)]

    def close_extras(self, **kwargs: Any) -> None:
        """End every env (its harness and workspace) and every actor; never raises."""
        self._pool.end(self.actors)

    # ----------------------------------------------------------------- internals

    def _whereabouts(self, i: int, described: Any) -> dict[str, Any]:
        """``worker_info``'s entry for sub-env ``i`` from its actor's ``describe`` result."""
        if isinstance(described, dict):
            return {**described, "lost": ""}
        if self._lost[i]:
            why = self._lost_error[i]
        elif i in self._placing:
            why = "its replacement actor is not up yet"
        else:  # describe raised in the actor
            why = f"{type(described).__name__}: {described}"
        return {"node_id": None, "pid": None, "harness_pid": None, "workspace": None, "lost": why}

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
