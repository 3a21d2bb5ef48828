"""BFCLEnv: one BFCL multi-turn category as a ``HarnessEnv`` (``gym_harness/BFCL-v0``).

An episode is one task. At reset the env picks the task (``options={"task_id": ...}``,
``options={"task": {"id": ...}}`` as a rollout passes it, or one drawn with ``seed``),
makes its backends afresh (:class:`~gym_harness.suites.bfcl.backends.Backends`) and
starts the harness with the task's first user turn as the prompt. Each user turn's end
is scored by BFCL's checker (:mod:`~gym_harness.suites.bfcl.checker`) on the turns so
far; the last turn's verdict is the reward (1.0 valid, 0.0 otherwise). The next user
turn is offered to the harness only as BFCL offers it: in model mode the env's user side
sends it when a turn ends; in turn mode ``info["bfcl"]["next_user"]`` holds it, and a
policy such as :func:`~gym_harness.suites.bfcl.policies.scripted_user` sends it as the
next action. Turn mode's episode ends (``terminated``) with the task's last turn.

``info["bfcl"]`` carries the same keys on every reset and step: ``task_id``,
``category``, ``turns`` (the task's), ``turn`` (user turns done), ``next_user``
(``""`` when none is left), ``turn_valid`` (the checker's verdict on the turns so far,
one bool per turn done), ``done`` (the final verdict is in) and the verdict's ``valid``,
``error_type``, ``error`` and ``failed_turn``.

Threads: the caller's thread, as ``HarnessEnv``; the tools run on the bridge's loop
(``backends.py`` says what they share).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, SupportsFloat

import gymnasium
from gymnasium.error import ResetNeeded

from gym_harness.bridge.tools import OfferedTools
from gym_harness.env import HarnessEnv
from gym_harness.errors import ConfigError, ForkUnsupported
from gym_harness.records.trajectory import RewardContext, Trajectory
from gym_harness.suites.bfcl.backends import Backends, tool_server
from gym_harness.suites.bfcl.checker import Verdict, check, force_terminated
from gym_harness.suites.bfcl.data import BFCLTask, load_category
from gym_harness.tasks import pick_task

__all__ = ["BFCLEnv"]

#: Env keywords the suite sets itself.
_OWN = ("tools", "tasks", "reward_fn", "user_fn")
#: The reference harness's tool calls per turn unless told otherwise (one long-context
#: turn's ground truth makes 34 calls).
REFERENCE_MAX_TOOL_CALLS = 64


class _Progress:
    """The scoring state of the episode under way (the caller's thread only)."""

    def __init__(self, task: BFCLTask | None = None) -> None:
        self.task = task
        self.turn_valid: list[bool] = []
        self.final: Verdict | None = None

    def info(self) -> dict[str, Any]:
        task, final = self.task, self.final
        done = len(self.turn_valid)
        turns = 0 if task is None else len(task.turns)
        verdict = (final or Verdict(False)).to_dict()
        more = task is not None and final is None and done < turns
        next_user = task.turns[done] if more and task is not None else ""
        return {
            "task_id": "" if task is None else task.id,
            "category": "" if task is None else task.category,
            "turns": turns,
            "turn": done,
            "next_user": next_user,
            "turn_valid": list(self.turn_valid),
            "done": final is not None,
            **verdict,
        }


class BFCLEnv(HarnessEnv):
    """A BFCL v4 multi-turn category as a gymnasium env, scored by BFCL's own checker.

    Args:
        category: ``"base"``, ``"miss_func"``, ``"miss_param"`` or ``"long_context"``.
        harness: Any harness id or ``Harness`` (default the reference harness, whose
            per-turn tool budget is raised to 64 calls unless ``max_tool_calls`` is given).
        **kwargs: Every ``HarnessEnv`` keyword (``mode="model"``, timeouts, ``model=`` ...)
            but ``tools``, ``tasks``, ``reward_fn`` and ``user_fn``, which the suite sets.

    Raises:
        ConfigError: An unknown category, a keyword the suite sets, or bfcl-eval missing.

    Example:
        >>> import gymnasium
        >>> env = gymnasium.make("gym_harness/BFCL-v0", mode="model")  # doctest: +SKIP
        >>> obs, info = env.reset(options={"task_id": "multi_turn_base_0"})  # doctest: +SKIP
    """

    def __init__(self, category: str = "base", harness: Any = "reference", **kwargs: Any) -> None:
        taken = sorted(set(_OWN) & set(kwargs))
        if taken:
            raise ConfigError(
                f"BFCL-v0 sets {taken} itself (its tasks, tools, user turns and checker); "
                "leave them out, or build a HarnessEnv of your own."
            )
        self.category = category
        self.suite: tuple[BFCLTask, ...] = load_category(category)
        self._by_id = {task.id: task for task in self.suite}
        self.backends = Backends()
        self._progress = _Progress()
        if harness == "reference":
            kwargs.setdefault("max_tool_calls", REFERENCE_MAX_TOOL_CALLS)
        tasks = [
            {"id": task.id, "prompt": task.turns[0], "meta": {"turns": len(task.turns)}}
            for task in self.suite
        ]
        super().__init__(
            harness,
            tools=OfferedTools(tool_server(self.backends), self.backends.offered),
            tasks=tasks,
            reward_fn=self._score,
            user_fn=self._next_user,
            **kwargs,
        )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode on one task: fresh backends, the task's first user turn.

        Args:
            seed: Seeds the task choice when ``options`` names none.
            options: ``{"task_id": "multi_turn_base_0"}``, or ``{"task": {"id": ...}}``
                (a task dict naming a task of the category, as a rollout passes it).

        Returns:
            The first observation and the info, with ``info["bfcl"]``.

        Raises:
            ConfigError: No task of the category has the id asked for.
        """
        if seed is not None:
            gymnasium.Env.reset(self, seed=seed)
        wanted = dict(options or {})
        given = wanted.pop("task", None)
        if isinstance(given, Mapping) and "id" in given:
            wanted["task_id"] = given["id"]
        elif given is not None:
            raise ConfigError("options['task'] must be a task dict with the 'id' of a BFCL task.")
        picked = pick_task(self.tasks, wanted, self.np_random)
        assert picked is not None  # a category always has tasks
        task = self._by_id[picked.id]
        self._progress = _Progress(task)
        self.backends.start(task)
        obs, info = super().reset(options={**wanted, "task_id": task.id})
        info["bfcl"] = self._progress.info()
        return obs, info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """One step of the env's mode; in turn mode the task's last turn ends the episode.

        Raises:
            ResetNeeded: After the task's last turn (turn mode), as after any episode's end.
        """
        if self._progress.final is not None and self.config.mode != "model":
            raise ResetNeeded("the task's turns are all done: call reset() for the next task.")
        obs, reward, terminated, truncated, info = super().step(action)
        if (terminated or truncated) and self._progress.final is None:
            task = self._progress.task
            assert task is not None
            self._progress.final = force_terminated(task, len(self._progress.turn_valid))
        if self._progress.final is not None and self.config.mode != "model":
            terminated = terminated or not truncated
        info["bfcl"] = self._progress.info()
        return obs, reward, terminated, truncated, info

    def fork(self, *, strict: bool = False) -> tuple[HarnessEnv, str, dict[str, Any]]:
        """BFCL episodes do not fork: a child would need its own copy of the backends'
        state and of the calls so far, which a fork does not carry.

        Raises:
            ForkUnsupported: Always.
        """
        raise ForkUnsupported(
            "BFCL-v0 episodes do not fork (the backends' state and the calls so far stay "
            "with the parent); run the task again from reset() instead."
        )

    # -- the user side and the reward (the env's callbacks) ---------------------------

    def _score(self, ctx: RewardContext) -> float:
        """Score the turn that ended: the checker on the turns so far; after the task's
        last turn, or when the episode ends early, the final verdict (the reward)."""
        progress, task = self._progress, self._progress.task
        if task is None:
            return 0.0
        done = min(ctx.turn, len(task.turns))
        calls = self.backends.calls()
        if done == len(task.turns):
            progress.final = check(task, calls)
        elif ctx.terminated or ctx.truncated:
            progress.final = force_terminated(task, done)
        del progress.turn_valid[done - 1 :]
        progress.turn_valid.append(
            progress.final.valid if progress.final is not None else check(task, calls, done).valid
        )
        self.backends.advance(done)
        return 1.0 if progress.final is not None and progress.final.valid else 0.0

    def _next_user(self, trajectory: Trajectory) -> str | None:
        """Model mode's user side: the task's next user turn, or ``None`` after its last."""
        info = self._progress.info()
        return info["next_user"] or None
