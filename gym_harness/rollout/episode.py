"""One episode of a rollout: ``run_episode``, and the model-mode policy it answers with.

``run_episode`` runs one episode on an env and returns its record
(``Trajectory.to_record()``): the task's prompt, then the follow-up message each turn,
or in model mode (``policy``) each model call answered by the policy.

Threads: the calling worker's thread only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import gymnasium

from gym_harness.env import HarnessEnv
from gym_harness.errors import ConfigError, PolicyError
from gym_harness.utils.imports import import_attr

__all__ = [
    "DEFAULT_FOLLOW_UP",
    "DEFAULT_MAX_STEPS",
    "DEFAULT_MAX_TURNS",
    "DEFAULT_N",
    "DEFAULT_SEED",
    "Policy",
    "UserPolicy",
    "answer_calls",
    "load_policy",
    "policy_action",
    "run_episode",
]

#: The defaults of a rollout, the same for ``local_rollout``, ``ray_rollout`` and
#: ``gym-harness rollout``: one episode per task, the first seeded 0, one turn each
#: (the task's prompt), and the message of any later turn.
DEFAULT_N, DEFAULT_SEED, DEFAULT_MAX_TURNS, DEFAULT_FOLLOW_UP = 1, 0, 1, "Continue."
#: Model mode: steps (model calls answered) per episode at most, unless told otherwise.
DEFAULT_MAX_STEPS = 100

#: Model mode: ``policy(request) -> action``; the request is the observation as a dict, the
#: action a str or a dict (sent as its JSON text). See the README's "You are the model".
Policy = Callable[[dict[str, Any]], "str | Mapping[str, Any]"]
#: Turn mode: ``user(reply, info) -> message``, the next user message after a turn, or
#: ``None`` to end the episode (a suite's scripted user, such as BFCL's).
UserPolicy = Callable[[str, dict[str, Any]], "str | None"]


def run_episode(
    env: gymnasium.Env[str, str],
    task: dict[str, Any],
    *,
    env_id: str,
    seed: int = DEFAULT_SEED,
    index: int = 0,
    max_turns: int = DEFAULT_MAX_TURNS,
    follow_up: str = DEFAULT_FOLLOW_UP,
    policy: Policy | UserPolicy | str | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> dict[str, Any]:
    """Run one episode of ``task``: the prompt, then ``follow_up`` until it ends.

    With ``policy`` and an env made with ``mode="model"``, each step's action is instead
    ``policy(request)`` for the model call the observation holds, until the episode ends
    (more user turns come from the env's ``user_fn``). With ``policy`` in turn mode, each
    turn after the first sends ``policy(reply, info)`` (a :data:`UserPolicy`; ``None``
    ends the episode), at most ``max_turns`` turns.

    Args:
        env: A harness env (``gymnasium.make`` of a gym_harness id, wrappers allowed).
        task: The task as a dict (``Task.to_dict()``), passed as ``options["task"]``.
        env_id: The env id written into the record.
        seed: The seed of the episode's reset.
        index: Which episode of this task it is (0 .. n-1).
        max_turns: At most this many turns; the rollout then stops the episode.
        follow_up: The message of every turn after the first.
        policy: Model mode: ``policy(request: dict) -> str | dict`` (a dict is sent as
            its JSON text); turn mode: ``policy(reply, info) -> str | None``, the next
            user message; or its import string ``"pkg.module:fn"``.
        max_steps: Model mode: at most this many steps (model calls answered); the
            episode is then cut and scored as truncated (``ctx.cause == "max_steps"``).

    Returns:
        The rollout record (``Trajectory.to_record()``). ``outcome`` is
        ``"max_turns"`` when the rollout, not the harness, ended the episode after
        ``max_turns``; ``"truncated"`` when ``max_steps`` cut it (scored).

    Raises:
        ConfigError: ``policy`` cannot be imported or is not callable.
        TypeError: ``policy`` returned neither a str nor a dict.

    A policy that raises :class:`~gym_harness.errors.PolicyError` ends its episode as
    ``policy_error`` (truncated, scored); any other exception propagates.
    """
    started = time.monotonic()
    prompt, _ = env.reset(seed=seed, options={"task": task})
    user: UserPolicy | None = None
    if policy is not None and HarnessEnv.of(env).config.mode == "model":
        answer_calls(env, prompt, load_policy(policy), max_steps)
    else:
        user = None if policy is None else cast(UserPolicy, load_policy(policy))
        message: str | None = prompt
        for _ in range(max_turns):
            reply, _, terminated, truncated, info = env.step(message or "")
            if terminated or truncated:
                break
            message = follow_up if user is None else user(reply, info)
            if message is None:
                break
    return HarnessEnv.of(env).trajectory.to_record(
        env_id=env_id, index=index, seed=seed, total_s=time.monotonic() - started
    )


def load_policy(policy: Policy | UserPolicy | str) -> Policy:
    """``policy`` itself, or the callable its import string ``"pkg.module:fn"`` names.

    Raises:
        ConfigError: The import fails, or what it names is not callable.
    """
    found = import_attr(policy, "policy") if isinstance(policy, str) else policy
    if not callable(found):
        raise ConfigError(f"policy must be a callable or an import string, got {found!r}.")
    return cast(Policy, found)


def policy_action(policy: Policy, obs: str) -> str:
    """``policy``'s action for the model call ``obs`` holds (``""`` when it holds none:
    the harness did not start, and the step records why).

    Raises:
        TypeError: ``policy`` returned neither a str nor a dict.
    """
    try:
        request = json.loads(obs)
    except ValueError:
        request = None
    if not (isinstance(request, dict) and request.get("request_id")):
        return ""
    action = policy(request)
    if isinstance(action, Mapping):
        action = json.dumps(action)
    if not isinstance(action, str):
        raise TypeError(f"policy must return a str or a dict, got {type(action)!r}.")
    return action


def answer_calls(env: gymnasium.Env[str, str], obs: str, policy: Policy, max_steps: int) -> None:
    """Model mode: answer each model call with ``policy`` until the episode ends; after
    ``max_steps`` the episode is cut and scored as truncated (``HarnessEnv.truncate``).
    A policy that raises :class:`PolicyError` (its model server failed) ends the episode
    as ``policy_error``, truncated and scored, with the error's message."""
    for _ in range(max_steps):
        try:
            action = policy_action(policy, obs)
        except PolicyError as exc:
            HarnessEnv.of(env).truncate(policy_error=str(exc) or type(exc).__name__)
            return
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return
    HarnessEnv.of(env).truncate()
