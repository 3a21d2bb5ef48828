"""OpenEnv sessions backed by our envs, and the validated training trace.

:class:`HarnessSessionFactory` is OpenEnv's ``ResourceSessionFactory``: each
``create(task)`` makes one env (an env id, or ``HarnessEnv`` keywords), resets it on the
task and returns an :class:`EnvSession`. A session is a ``ResourceSession`` (the task's
first message, the env's tools, ``verify`` forwarding our ``reward_fn``'s reward) and a
``TrainableSession``: in turn mode (black box) ``wait_for_completion`` runs the task's
turn and ``fetch_training_trace`` returns what the capture proxy recorded; in model mode
:class:`~gym_harness.openenv.ModelModeAdapter` drives it and the trace comes from the
actions.

Threads: a session is driven from one thread, the caller's (the env's rule); only
``wait_for_completion(timeout_s)`` runs the turn in a thread of its own, which the caller
waits for, so that it can return when ``timeout_s`` runs out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import gymnasium
from openenv.core.env_server.mcp_types import Tool
from openenv.core.harness import (
    ResourceSession,
    ResourceSessionFactory,
    ToolResult,
    TrainingTrace,
    TrainingTurn,
    VerifyResult,
)

from gym_harness.env import HarnessEnv
from gym_harness.errors import ConfigError, HarnessError
from gym_harness.model.request import BadRequest, read_request
from gym_harness.tasks import as_task

__all__ = ["EnvSession", "HarnessSessionFactory", "TextLevelTrace", "training_trace"]

#: Beyond ``stop_grace_s``: how long ``close`` waits for a timed-out turn's threads.
_JOIN_S = 10.0


class TextLevelTrace(HarnessError, ValueError):
    """The episode's main model calls carry no engine token ids: nothing can be trained.

    The message names each call and why (the policy reported no ids, the upstream
    ignored ``return_token_ids``, ...). Nothing is ever re-tokenised to fill the gap.
    """


def training_trace(trace: Mapping[str, Any]) -> TrainingTrace:
    """A plain trace (``Trajectory.training_trace()``) as OpenEnv's validated ``TrainingTrace``.

    Raises:
        TextLevelTrace: The trace is text-level (``token_level`` false).
        pydantic.ValidationError: OpenEnv's validation rejected an entry.
    """
    if not trace.get("token_level"):
        calls = [c for c in trace.get("text_level_calls", ()) if not c.get("side")]
        whys = "; ".join(f"{c['node_id']}: {c['why']}" for c in calls[:8]) or "no main call"
        raise TextLevelTrace(
            f"the trace is text-level, so it holds nothing to train ({whys}). In model mode "
            "have the policy return prompt_ids, completion_ids and logprobs; in capture mode "
            "set capture_tokens=True with an upstream that returns token ids (vLLM, SGLang)."
        )
    turns = [TrainingTurn(**turn) for turn in trace["turns"]]
    return TrainingTrace(schema_version=trace["schema_version"], turns=turns)


class EnvSession(ResourceSession):
    """One rollout: one env, reset on one task (made by :class:`HarnessSessionFactory`).

    Attributes:
        env: The env (``HarnessEnv``), reset on the task.
        model_mode: The env answers the harness's model calls (``mode="model"``).
        task: The task as a dict (``id``, ``prompt``, ...).
        episode_id: The episode id OpenEnv gave, else the env's own.
        observation: The last observation (in model mode, the pending model call's).
        exit_code: ``None`` until the rollout ended; then 0 if its last turn ended
            without a fault, else 1.
    """

    def __init__(
        self,
        env: HarnessEnv,
        task: dict[str, Any],
        *,
        model_mode: bool,
        seed: int | None = None,
        episode_id: str | None = None,
    ) -> None:
        self.env, self.task, self.model_mode = env, task, model_mode
        self.observation, info = env.reset(seed=seed, options={"task": task})
        self.episode_id = episode_id or str(info["episode_id"])
        self.exit_code: int | None = None
        # wait_for_completion(timeout_s): the turn's thread, and the close a timeout began.
        self._turn: threading.Thread | None = None
        self._closer: threading.Thread | None = None
        self._timed_out = False
        self._failure: BaseException | None = None

    # -- ResourceSession --------------------------------------------------------------------

    def initial_messages(self) -> list[dict[str, Any]]:
        """The task's first user message."""
        return [{"role": "user", "content": self.task["prompt"]}]

    def list_tools(self) -> list[Tool]:
        """The env's tools, as the harness sees them."""
        return [
            Tool(
                name=spec.name,
                description=spec.description,
                input_schema=spec.input_schema or {"type": "object", "properties": {}},
            )
            for spec in self.env.list_tools()
        ]

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Call an env tool through the env's bridge, as the harness would.

        Raises:
            KeyError: No env tool has this name (OpenEnv's bridge answers "not found").
        """
        try:
            result = self.env.call_tool(name, arguments)
        except ConfigError as exc:
            raise KeyError(str(exc)) from None
        data = result.structured if result.structured is not None else result.text
        return ToolResult(data=data, error=result.text if result.is_error else None)

    def verify(self, transcript: list[dict[str, Any]], final_state: Any = None) -> VerifyResult:
        """The reward our ``reward_fn`` gave the episode's turns, forwarded.

        A model-mode episode still under way (a limit such as ``max_turns`` stopped the
        rollout mid-turn) is first cut and scored as truncated (``HarnessEnv.truncate``:
        ``reward_fn`` sees ``ctx.truncated`` and ``ctx.cause == "max_steps"``), so every
        rollout that ran has a reward. ``env_reward`` is ``None`` (unscored, never 0.0)
        only when no turn was recorded at all: the episode never ran, or
        ``wait_for_completion`` timed out before the turn ended.
        """
        if self.model_mode and not self._timed_out:
            self.env.truncate()
        trajectory = self.env.trajectory
        trace = trajectory.training_trace(self.is_side)
        metrics = {
            "outcome": trajectory.outcome,
            "turns": len(trajectory.turns),
            "tool_calls": sum(t.tool_calls for t in trajectory.turns),
            "model_calls": len(trajectory.calls),
            "token_level": trace["token_level"],
            "truncated": bool(trajectory.turns) and trajectory.turns[-1].truncated,
        }
        return VerifyResult(
            env_reward=trajectory.total_reward if trajectory.turns else None,
            done=trajectory.outcome == "done",
            metrics=metrics,
            artifacts={"episode_id": trajectory.episode_id, "task_id": self.task["id"]},
        )

    def close(self) -> None:
        """End the episode and release the env (its harness tree, servers, workspace).

        After a timed-out ``wait_for_completion`` it waits (about ``stop_grace_s`` at
        most) for the harness tree the timeout began to stop.
        """
        self.env.close()
        bound = time.monotonic() + self.env.config.stop_grace_s + _JOIN_S
        for thread in (self._closer, self._turn):
            if thread is not None:
                thread.join(max(0.0, bound - time.monotonic()))

    # -- TrainableSession -------------------------------------------------------------------

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        """Turn mode: run the task's turn (the harness owns its loop) and return its code.

        Args:
            timeout_s: Longest wait, or ``None`` for the env's own deadlines
                (``turn_timeout_s``, ``idle_timeout_s``, ``episode_timeout_s``). When it
                runs out the env starts to close (the harness tree is stopped in the
                background; :meth:`close` waits for it) and ``TimeoutError`` is raised
                within ``timeout_s`` + 0.1 s: the stop grace is not added on top.

        Returns:
            0 when the turn ended without a fault, else 1 (``verify`` says which).

        Raises:
            TimeoutError: ``timeout_s`` ran out before the turn ended (TRL's harness worker
                then trains what was captured: nothing, and ``verify`` reports the
                rollout unscored).
            ConfigError: The session is in model mode (``ModelModeAdapter.run_white_box``
                drives it).
        """
        if self.exit_code is not None:
            return self.exit_code
        if self.model_mode:
            raise ConfigError(
                "a model-mode session is driven by ModelModeAdapter.run_white_box, not "
                "wait_for_completion; use mode='turns' with capture=True for black-box rollouts."
            )
        if timeout_s is None:
            self._run_turn()
        else:
            self._turn = threading.Thread(
                target=self._run_turn, name="gym_harness-session-turn", daemon=True
            )
            self._turn.start()
            self._turn.join(max(0.0, timeout_s))
            if self._turn.is_alive():
                self._timed_out, self.exit_code = True, 1
                # The turn's thread sees the env closed and ends; close() joins both.
                self._closer = threading.Thread(
                    target=self.env.close, name="gym_harness-session-close", daemon=True
                )
                self._closer.start()
                raise TimeoutError(
                    f"the turn did not end within wait_for_completion(timeout_s={timeout_s}); "
                    "the env is closed and the rollout is unscored. Raise timeout_s, or "
                    "bound the turn with the env's turn_timeout_s."
                )
        if self._failure is not None:
            raise self._failure
        assert self.exit_code is not None
        return self.exit_code

    def _run_turn(self) -> None:
        """The task's turn (in the caller's thread, or in the turn thread of a timeout)."""
        try:
            self.observation, _, _, _, info = self.env.step(self.task["prompt"])
            self.exit_code = 1 if info["error_type"] else 0
        except BaseException as exc:
            if not self._timed_out:  # after a timeout the env was closed under it: expected
                self._failure = exc
            self.exit_code = 1

    def fetch_training_trace(self) -> TrainingTrace:
        """The episode's trace, validated (model mode: from the actions; turn mode: from
        the capture proxy's records, ``capture_tokens=True``).

        After a timed-out ``wait_for_completion`` the trace holds no turn (nothing of the
        cut turn was kept).

        Raises:
            TextLevelTrace: The main calls carry no engine token ids.
        """
        if self._timed_out:
            return TrainingTrace(turns=[])
        return training_trace(self.env.trajectory.training_trace(self.is_side))

    def is_side(self, exchange: Mapping[str, Any]) -> bool:
        """Whether a captured exchange is a side call, as the env's harness tells them."""
        request = exchange.get("request")
        if not isinstance(request, dict):
            return False
        try:
            read = read_request(str(exchange.get("path", "")), request)
        except BadRequest:
            return False
        return read is not None and self.env.harness.side_call(read, {})


class HarnessSessionFactory(ResourceSessionFactory[EnvSession]):
    """OpenEnv sessions over gym_harness envs, one env per session.

    TRL's harness worker (``trl.experimental.async_grpo``) takes a callable returning a
    factory, e.g. ``functools.partial(HarnessSessionFactory, "gym_harness/Codex-v0", ...)``:
    with an adapter (``ModelModeAdapter``, white box) it calls it with no argument; without
    one (black box) it calls it with ``sampling=`` its training policy. Both work.

    Args:
        env_id_or_config: A registered env id (``"gym_harness/Reference-v0"``) or a
            mapping of ``HarnessEnv`` keywords (``{"harness": "codex", ...}``).
        sampling: A trainer's sampling policy (``{"temperature": 1.0, "top_p": 1.0, ...}``).
            Turn mode with capture: set on every Chat Completions request the capture
            proxy sends upstream (``capture_sampling``), so the upstream samples, and the
            recorded logprobs are, the policy's. Model mode: kept in ``self.sampling`` and
            not used (the trainer samples every call itself). Turn mode without capture:
            ``ConfigError`` (no request of the harness's passes through the env).
        **env_kwargs: More ``HarnessEnv`` keywords (``mode="model"``, ``tools=``,
            ``reward_fn=``, ``capture=True``, ``capture_tokens=True`` ...).

    Raises:
        ConfigError: ``env_id_or_config`` is neither, the env id is not registered, or
            ``sampling`` has nowhere to go.

    Example:
        >>> factory = HarnessSessionFactory("gym_harness/Reference-v0", mode="model")
        >>> session = factory.create({"id": "t1", "prompt": "add 2 and 3"})  # doctest: +SKIP
    """

    def __init__(
        self,
        env_id_or_config: str | Mapping[str, Any],
        *,
        sampling: Mapping[str, Any] | None = None,
        **env_kwargs: Any,
    ) -> None:
        if isinstance(env_id_or_config, str):
            try:
                gymnasium.spec(env_id_or_config)
            except gymnasium.error.Error as exc:
                raise ConfigError(f"HarnessSessionFactory: {exc}") from None
            self.env_id: str | None = env_id_or_config
            self.env_kwargs = dict(env_kwargs)
        elif isinstance(env_id_or_config, Mapping):
            self.env_id = None
            self.env_kwargs = {**env_id_or_config, **env_kwargs}
        else:
            raise ConfigError(
                "HarnessSessionFactory takes an env id ('gym_harness/Codex-v0') or a dict of "
                f"HarnessEnv keywords, got {type(env_id_or_config).__name__}."
            )
        self.sampling = dict(sampling or {})
        if self.sampling and not self.model_mode:
            if not self.env_kwargs.get("capture"):
                raise ConfigError(
                    f"HarnessSessionFactory(sampling={self.sampling}) in turn mode needs "
                    "capture=True and upstream= (the capture proxy sets it on each request "
                    "upstream); without capture no model request passes through the env."
                )
            self.env_kwargs["capture_sampling"] = self.sampling

    @property
    def model_mode(self) -> bool:
        """The sessions' envs are in ``mode="model"``."""
        return self.env_kwargs.get("mode", "turns") == "model"

    def make_env(self) -> HarnessEnv:
        """A new env as configured (not reset)."""
        if self.env_id is None:
            return HarnessEnv(**self.env_kwargs)
        made = gymnasium.make(self.env_id, disable_env_checker=True, **self.env_kwargs)
        return HarnessEnv.of(made)

    def create(
        self, task: Any, seed: int | None = None, episode_id: str | None = None
    ) -> EnvSession:
        """A session on ``task``: a task dict (``prompt``, optional ``id``, ``files`` ...),
        a prompt string, or chat messages (TRL's conversational prompts: the last user
        message is the prompt).

        Raises:
            ConfigError: ``task`` is none of these.
        """
        env = self.make_env()
        try:
            return EnvSession(
                env, as_task(task), model_mode=self.model_mode, seed=seed, episode_id=episode_id
            )
        except BaseException:
            env.close()
            raise
