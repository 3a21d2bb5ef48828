"""HarnessEnv: an agentic harness as a ``gymnasium.Env[str, str]``.

One ``step`` is one conversational turn of a long-lived harness process; one
episode is one harness process (and one fresh workspace). Harness faults never
raise out of ``reset``/``step``: they become outcomes (see the README's outcome
table) with ``info["error_type"]``.

Whatever raises out of ``step`` (Ctrl-C mid-turn, a callback's error), the next ``step``
returns the reply to its own message or raises ``ResetNeeded``; every turn is recorded in
``trajectory`` before the user's code runs on it (see ``gym_harness.usercode``).

Threads: the caller's thread runs reset/step/close and never needs an event
loop. ``HarnessProcess`` owns its reader threads; ``MCPBridge`` owns its server
thread and loop. Env tools tagged ``"locked"`` run holding ``env.lock``.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsFloat, cast

import gymnasium
from gymnasium.error import ResetNeeded

from gym_harness.config import FIELD_NAMES, HarnessConfig
from gym_harness.errors import ConfigError, HarnessError
from gym_harness.harnesses.base import EpisodeContext, Harness
from gym_harness.harnesses.registry import make_harness
from gym_harness.lifecycle import Lifecycle, Liveness
from gym_harness.modes.base import Episode, Mode, Recorder
from gym_harness.modes.turns import TurnMode
from gym_harness.outcome import Outcome
from gym_harness.process.resources import EnvResources
from gym_harness.records.events import HarnessEvent
from gym_harness.records.trajectory import RewardFn, Trajectory, TurnRecord
from gym_harness.spaces.text import UnicodeText
from gym_harness.tasks import Task, load_tasks, pick_task
from gym_harness.turn import TurnRunner
from gym_harness.usercode import CallbackGuard, TurnScorer, UserFnRunner, user_callable
from gym_harness.utils.interrupts import interrupts_held

if TYPE_CHECKING:
    from gym_harness.bridge.server import MCPBridge
    from gym_harness.capture.proxy import ModelProxy
    from gym_harness.fork import Inherited
    from gym_harness.harnesses.base import ForkOrigin
    from gym_harness.model.endpoint import EndpointConfig
    from gym_harness.modes.model import UserFn
    from gym_harness.process.harness_process import HarnessProcess

__all__ = ["HarnessEnv"]

#: Longest text an action or observation may hold (the spaces' bound).
MAX_TEXT = 1 << 24


class HarnessEnv(gymnasium.Env[str, str]):
    """A harness subprocess as a Gymnasium environment.

    Args:
        harness: A ``Harness`` instance or a registered name (``"reference"``, ``"command"``,
            ``"claude_code"`` ...). ``HarnessEnv("reference")`` alone has no tools, tasks or
            reward; ``gymnasium.make("gym_harness/Reference-v0")`` adds the demo's.
        tools: The env's MCP tools served to the harness: a FastMCP server, a list
            of plain callables, or an import string ``"pkg.module:attr"``.
        reward_fn: ``reward_fn(RewardContext) -> float``, run after every turn in
            this process (never reachable by the harness); or an import string.
        tasks: A list of task dicts or a JSONL path; ``reset`` picks one.
        render_mode: ``"ansi"`` makes ``render()`` return the transcript.
        on_event: Called with each ``HarnessEvent`` as it arrives during a turn.
        user_fn: In model mode, ``user_fn(trajectory) -> str | None`` at each turn's
            end: the next user message, or ``None`` to end the episode; or an import string.
        config: A whole ``HarnessConfig`` to start from instead of the harness's
            ``default_config()``; keywords then change single fields of it.
        **kwargs: Every setting is a ``HarnessConfig`` field (``turn_timeout_s=30``,
            ``mode="model"``, ``capture=True``, ``workspace=...``, ``tool_timeout_s=...``:
            the configuration reference lists them); any other keyword goes to the
            harness's constructor (``model=...``) given its name.

    Raises:
        ConfigError: Bad configuration, an unknown keyword, or unreadable tasks.

    Example:
        >>> import gymnasium
        >>> env = gymnasium.make("gym_harness/Reference-v0")
        >>> obs, info = env.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = env.step("hello")
        >>> env.close()
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        harness: Harness | str = "reference",
        *,
        tools: Any = None,
        reward_fn: RewardFn | str | None = None,
        tasks: Sequence[Mapping[str, Any]] | str | Path | None = None,
        render_mode: str | None = None,
        on_event: Callable[[HarnessEvent], None] | None = None,
        user_fn: UserFn | str | None = None,
        config: HarnessConfig | None = None,
        **kwargs: Any,
    ) -> None:
        self._spawn_args = {k: v for k, v in locals().items() if k not in ("self", "kwargs")}
        self._spawn_args.update(kwargs)  # what a fork's child env is made with
        config_kwargs = {k: v for k, v in kwargs.items() if k in FIELD_NAMES}
        harness_kwargs = {k: v for k, v in kwargs.items() if k not in FIELD_NAMES}
        self.harness = make_harness(harness, harness_kwargs, type(self))
        base = self.harness.default_config() if config is None else config
        settings = base.replace(**config_kwargs)
        self._model_options: EndpointConfig | None = None
        if settings.mode == "model":
            from gym_harness.modes.model import model_options

            self._model_options = model_options(
                settings.mode, settings.capture, settings.policy_timeout_s, settings.model_calls
            )
            self.harness = self.harness.for_model_mode()
            if config is None:  # the model-mode adapter's own defaults, the keywords on top
                settings = self.harness.default_config().replace(**config_kwargs)
        self.config = settings
        self.harness.check_config(self.config)
        self.harness.preflight(
            self.config, captured=self.config.captured or self._model_options is not None
        )
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ConfigError(f"render_mode must be None or 'ansi', got {render_mode!r}.")
        workspace = self.config.workspace
        if workspace is not None and not Path(workspace).is_dir():
            raise ConfigError(f"workspace {workspace!r} is not a directory.")
        self.render_mode = render_mode
        self.tasks: tuple[Task, ...] = load_tasks(tasks)
        self.reward_fn: RewardFn | None = user_callable(reward_fn, "reward_fn")
        self._user_fn: UserFn | None = user_callable(user_fn, "user_fn")
        self.on_event = on_event
        self._callbacks = CallbackGuard()
        self._rewards = TurnScorer(self.config.reward_timeout_s)
        self._ended_why = ""
        self.lock = threading.Lock()
        self._tools = [] if tools is None else tools
        self._owned = EnvResources(workspace, self.config.keep_workspace, self.config.sandbox)
        self._finalizer = weakref.finalize(self, self._owned.release, True)  # dropped, not closed
        self.observation_space = UnicodeText(MAX_TEXT)
        self.action_space = UnicodeText(MAX_TEXT)
        self._state = Lifecycle.NEW
        self._state_lock = threading.Lock()  # a closed env stays closed, whichever thread
        self._bridge: MCPBridge | None = None
        self._proxy: ModelProxy | None = None
        self._mode: Mode = self._make_mode()  # what reset and step call, whichever the mode
        self._signs_of_life: tuple[Liveness, ...] = ()  # the mode's servers, per episode
        self._resume: ForkOrigin | None = None  # a fork's child: the session it resumes
        self._proc: HarnessProcess | None = None
        self._runner: TurnRunner | None = None
        self._episode_started = 0.0
        self.trajectory = Trajectory(episode_id="", harness=self.harness.name)

    # ----------------------------------------------------------------- gymnasium API

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start a fresh episode: a new harness process and workspace.

        Args:
            seed: Seeds the task choice (``self.np_random``).
            options: ``{"task_id": id}`` or ``{"task": {...}}`` picks the task.

        Returns:
            The task prompt ("" without tasks) and the info (``StepInfo``'s keys).
        """
        if self._state is Lifecycle.STOPPED:
            raise ConfigError(f"reset() on a closed env ({self._ended_why}): make a new env.")
        super().reset(seed=seed)
        started = time.monotonic()
        # Until the new harness runs (a reset may raise, Ctrl-C may land anywhere).
        self._become(Lifecycle.ENDED, "the last reset() raised before the harness started")
        self._end_episode()
        task = pick_task(self.tasks, options or {}, self.np_random)
        episode_id = uuid.uuid4().hex[:12]
        ctx = self._prepare_episode(episode_id, task)
        self.trajectory = Trajectory(
            episode_id=episode_id,
            harness=self.harness.name,
            task=None if task is None else task.to_dict(),
            sandbox=self._owned.sandbox_report(),
        )
        self._episode_started = started
        self._become(Lifecycle.RUNNING)
        prompt = "" if task is None else task.prompt
        try:
            startup_error = self._start_harness(ctx)
            runner = None if startup_error[0] else self._runner
            task_dict, dirs = None if task is None else task.to_dict(), self._owned.scored_dirs()
            args = (startup_error, self.trajectory, self._budget(), task_dict, dirs, self._proxy)
            episode = Episode(runner, *args)
            opening = self._mode.start(episode, prompt, self.trajectory.startup_events)
        except BaseException as exc:
            self._abandon(f"reset() raised {type(exc).__name__} while the harness started")
            raise
        if self._state is Lifecycle.STOPPED:  # closed from another thread meanwhile
            self._owned.release()  # what this reset made after the close
            raise ConfigError("the env was closed during reset(); make a new env.")
        self.trajectory.reset_s = time.monotonic() - started
        info = self._info(0, opening.error_type, opening.error, opening.events, 0.0)
        self._callbacks.raise_pending("the harness's startup (reset)")
        return opening.observation, info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Send ``action`` as one user message and return the harness's reply.

        Raises:
            ResetNeeded: Before the first ``reset``, after the episode ended, after ``close()``
                (make a new env), or after a step raised mid-turn (the message says why).
            TypeError: ``action`` is not a string.
            CallbackError: The ``on_event`` callback raised during this turn; the turn
                ran to its end and is in ``trajectory``, and the episode can go on.
        """
        self._check_running("step()")
        if not isinstance(action, str):
            raise TypeError(f"the action must be a str (one user message), got {type(action)!r}.")
        turn = len(self.trajectory.turns) + 1
        try:
            reply, record = self._mode.step(action)
        except BaseException as exc:
            # The turn did not finish: its reply may still come, so no later step may read on.
            self._abandon(f"step() for turn {turn} raised {type(exc).__name__} mid-turn")
            raise
        return self._step_end(reply, record)

    def _check_running(self, what: str) -> None:
        if self._state is not Lifecycle.RUNNING:
            why = f" ({self._ended_why})" if self._ended_why else ""
            fix = "make a new env" if self._state is Lifecycle.STOPPED else "call reset() first"
            raise ResetNeeded(
                f"{what} needs a running episode: {fix} (the env is {self._state.value}{why})."
            )

    def _step_end(
        self, reply: str, record: TurnRecord
    ) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if record.terminated or record.truncated:
            why = record.error_type or "done"
            self._become(Lifecycle.ENDED, f"turn {record.turn} ended the episode: {why}")
            self._stop_process()
        info = self._info(
            record.turn, record.error_type, record.error, record.events, record.elapsed_s
        )
        self._callbacks.raise_pending(f"turn {record.turn}")
        return reply, record.reward, record.terminated, record.truncated, info

    def render(self) -> str | None:
        """With ``render_mode="ansi"``, the episode transcript as text."""
        return self.trajectory.transcript() if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Stop the harness tree and the servers; remove workspaces. Idempotent, never raises.

        Safe from any thread: a step under way then raises ``ResetNeeded``, and the env stays
        closed (``reset()`` raises). Ctrl-C meanwhile is raised once everything has ended.
        """
        # Held before the env is marked closed: a Ctrl-C between the two would leave it
        # marked closed with nothing ended, and a second close() would return at once.
        with interrupts_held():
            with self._state_lock:
                if self._state is Lifecycle.STOPPED:
                    return
                self._state = Lifecycle.STOPPED
                self._ended_why = "close() was called; it stays closed"
            try:
                self._end_episode()
            finally:
                self._finalizer.detach()
                self._owned.release()

    # ----------------------------------------------------------------- orchestrator

    @classmethod
    def of(cls, env: gymnasium.Env[Any, Any]) -> HarnessEnv:
        """The ``HarnessEnv`` that ``env`` is or wraps: ``HarnessEnv.of(env).trajectory``.

        Raises:
            TypeError: ``env`` is neither a ``HarnessEnv`` nor a gymnasium wrapper of one.
        """
        inner = getattr(env, "unwrapped", env)
        if not isinstance(inner, cls):
            raise TypeError(
                f"expected a HarnessEnv or a gymnasium wrapper of one, got {type(env).__name__} "
                f"(unwrapped: {type(inner).__name__})."
            )
        return inner

    def fork(self, *, strict: bool = False) -> tuple[HarnessEnv, str, dict[str, Any]]:
        """A new env in this episode's state, which goes on undisturbed (README, "Forking").

        Returns ``(child, observation, info)`` as ``reset`` does, ``info["fork"]`` saying how;
        raises ``ResetNeeded`` (no running episode) or a ``ForkError`` (``ForkUnsupported``,
        ``ForkDiverged``, ``ForkFailed``: no child, and this episode goes on).
        """
        from gym_harness.fork import Parent, fork_episode

        self._check_running("fork()")
        spawn = functools.partial(HarnessEnv._fork_child, self._spawn_args)
        session = None if self._runner is None else self._runner.session
        limit, held = self.config.max_fork_bytes, self._mode.held()
        parent = Parent(self.trajectory, spawn, self.harness, session, limit, held, self._user_fn)
        child, obs, info = fork_episode(parent, self._owned.current, strict)
        return cast(HarnessEnv, child), obs, info

    @classmethod
    def _fork_child(
        cls, spawn_args: Mapping[str, Any], inherited: Inherited
    ) -> tuple[HarnessEnv, Callable[[float], None]]:
        """A fork's child, made with what it inherits (``fork/`` calls this through the
        ``spawn`` that ``fork`` hands it): an env configured as ``spawn_args`` say, with the
        inherited ``user_fn``, whose first launch resumes ``inherited.origin`` if set. Returns
        it and ``adopt(took)``, which makes its record the parent's so far."""
        child = cls(**{**spawn_args, "user_fn": inherited.user_fn})
        child._inherit(inherited)
        return child, functools.partial(child._adopt, inherited)

    def _inherit(self, inherited: Inherited) -> None:
        self._resume = inherited.origin  # the next launch only: later episodes are its own

    def _adopt(self, inherited: Inherited, took: float) -> None:
        self.trajectory = inherited.record(self.trajectory, took)
        self._mode.rebase(self.trajectory)

    def truncate(self, *, policy_error: str = "") -> float:
        """End the episode here, cut by a limit of the caller's, and score it as cut.

        For a step limit outside the env: gymnasium's ``TimeLimit``, a rollout's
        ``max_steps``, a trainer's ``max_turns``. In model mode the turn under way (the
        one whose model call the policy holds) is recorded as truncated and scored; in
        turn mode the last turn is scored again as truncated (its reward replaced).
        Either way ``reward_fn`` sees ``ctx.truncated`` and ``ctx.cause == "max_steps"``,
        and the harness is stopped. An episode that already ended is left as it is.

        Args:
            policy_error: Model mode: the policy could not answer the call it holds (a
                :class:`~gym_harness.errors.PolicyError`'s message). The turn is then
                recorded as ``policy_error`` with this message, and ``reward_fn`` sees
                ``ctx.cause == "policy_error"``.

        Returns:
            The episode's reward (``trajectory.total_reward``).

        Raises:
            ResetNeeded: Before the first ``reset`` or after ``close()``.

        Example:
            >>> for _ in range(max_steps):  # doctest: +SKIP
            ...     obs, reward, terminated, truncated, info = env.step(policy(obs))
            ...     if terminated or truncated:
            ...         break
            ... else:
            ...     reward = env.truncate()
        """
        if self._state in (Lifecycle.NEW, Lifecycle.STOPPED):
            self._check_running("truncate()")
        if self._state is Lifecycle.RUNNING and self._mode.truncate(policy_error):
            why = "policy_error" if policy_error else "max_steps"
            self._become(Lifecycle.ENDED, f"truncate() ended the episode: {why}")
            self._stop_process()
        return self.trajectory.total_reward

    def list_tools(self) -> list[Any]:
        """The env tools as the harness sees them (``ToolSpec``s, served names)."""
        return self._ensure_bridge().list_tools()

    def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None) -> Any:
        """Call an env tool in-process for the orchestrator (not a turn; no idle credit)."""
        return self._ensure_bridge().call_tool(name, arguments)

    @property
    def workspace(self) -> Path | None:
        """The current episode's workspace directory (``None`` before reset)."""
        return None if (current := self._owned.current) is None else current / "workspace"

    @property
    def process(self) -> HarnessProcess | None:
        """The running harness process, if any (for inspection: pid, usage())."""
        return self._proc

    # ----------------------------------------------------------------- internals

    def _prepare_episode(self, episode_id: str, task: Task | None) -> EpisodeContext:
        from gym_harness.loopback.server import listening_with

        with listening_with(self._owned.listener()):  # in the env's namespace, if strict
            workspace, home = self._owned.new_episode(episode_id, task)
            bridge = self._ensure_bridge()
            bridge.start()
            if self.trajectory.episode_id:  # not the first episode: lock the old harness out
                bridge.rotate_token()
            model_base_url = model_api_key = policy_timeout_s = None
            if self.config.captured:
                from gym_harness.capture.proxy import start_proxy

                if self._proxy is None:
                    self._proxy = self._owned.start(start_proxy, self.config)
                self._proxy.drain()  # exchanges of an earlier episode's last moments
                model_base_url, model_api_key = self._proxy.base_url, self._proxy.rotate_token()
            served = self._mode.serve(self._owned.start, self._proxy)  # model mode's endpoint
            self._signs_of_life = () if served is None else (served.liveness,)
            if served is not None:  # side calls go to the proxy, if any
                model_base_url, model_api_key = served.base_url, served.api_key
                policy_timeout_s = served.policy_timeout_s
            return EpisodeContext(
                episode_id=episode_id,
                workspace=workspace,
                home=home,
                bridge_url=bridge.url,
                bridge_token=bridge.token,
                tool_names=tuple(spec.name for spec in bridge.list_tools()),
                model_base_url=model_base_url,
                model_api_key=model_api_key,
                policy_timeout_s=policy_timeout_s,
                serve_port=self._owned.free_port(),
            )

    def _ensure_bridge(self) -> MCPBridge:
        if self._bridge is None:
            from gym_harness.bridge.server import MCPBridge

            names = self.harness.builtin_tools
            bridge = MCPBridge.for_env(self._tools, names, self.config, self.lock)
            self._bridge = self._owned.own(bridge)  # owned before it starts: close() stops it
        return self._bridge

    def _start_harness(self, ctx: EpisodeContext) -> tuple[Outcome, str]:
        """Launch the harness; return ("", "") or (error_type, error) of a failed start."""
        from gym_harness.process.harness_process import HarnessProcess

        resume, self._resume = self._resume, None
        harness = self.harness if resume is None else self.harness.forked(resume)
        launch = harness.launch(ctx, self.config.replace(cwd=self.config.cwd or str(ctx.workspace)))
        config = launch.config
        self._owned.hold_keeper()  # one keeper for all episodes, not one per reset
        reach = self._owned.reach((ctx.bridge_url, ctx.model_base_url), launch)
        self._proc = self._owned.process = HarnessProcess(config.process_spec(), reach)
        servers = (self._bridge, self._proxy, *self._signs_of_life)
        signs_of_life = tuple(s for s in servers if s is not None)
        self._runner = TurnRunner(
            launch.session,
            self._proc,
            config.turn_limits(),
            self._bridge,
            self._emit,
            signs_of_life,
        )
        try:
            self._proc.start()
        except HarnessError as exc:
            return Outcome.STARTUP_FAILED, str(exc)
        error_type, error = self._runner.startup(self.trajectory.startup_events)
        if error_type:
            self._stop_process()
        return error_type, error

    def _budget(self) -> float | None:
        """When the episode's wall budget runs out (``time.monotonic()``), if it has one."""
        limit = self.config.episode_timeout_s
        return None if limit is None else self._episode_started + limit

    def _emit(self, event: HarnessEvent) -> None:
        if self.on_event is not None:  # the guard does nothing without one (hot path)
            self._callbacks(self.on_event, event)  # never raises an Exception; see CallbackGuard

    def _make_mode(self) -> Mode:
        """The episode's driver for this env's mode, recording into one ``Recorder``."""
        recorder = Recorder(self._rewards, lambda: self.reward_fn, self._check_open)
        if self._model_options is None:
            return TurnMode(recorder)
        from gym_harness.modes.model import ModelMode

        user_fn = None if self._user_fn is None else UserFnRunner(self._user_fn)
        return ModelMode(recorder, self.harness.side_call, self._model_options, user_fn)

    def _check_open(self, turn: int) -> None:
        """Before a turn is recorded: raise ``ResetNeeded`` if ``close()`` came meanwhile."""
        if self._state is Lifecycle.STOPPED:
            raise ResetNeeded(f"close() was called (from another thread) during turn {turn}.")

    def _info(
        self, turn: int, error_type: str, error: str, events: Sequence[HarnessEvent], elapsed: float
    ) -> dict[str, Any]:
        code, tail = (0, "") if self._proc is None else self._proc.exit_report()
        info = self.trajectory.step_info(turn, error_type, error, events, elapsed, code, tail)
        return dict(info)  # gymnasium's signature: a plain dict (with StepInfo's keys)

    def _become(self, state: Lifecycle, why: str = "") -> None:
        """Move to ``state`` (and say why), unless the env is closed: then it stays closed."""
        with self._state_lock:
            if self._state is not Lifecycle.STOPPED:
                self._state, self._ended_why = state, why

    def _abandon(self, why: str) -> None:
        """End the episode after an exception left a step or reset mid-way."""
        why = f"{why}; the harness was stopped so no later step reads its reply"
        self._become(Lifecycle.ENDED, why)
        self._stop_process()

    def _stop_process(self) -> None:
        if self._proc is not None:
            self._proc.stop()
        self._mode.end(self.trajectory)  # model mode: no call of the episode waits on

    def _end_episode(self) -> None:
        with interrupts_held():  # whole: no half-ended episode for a later step to read
            self._stop_process()
            self._proc = self._runner = None
            self._owned.end_episode()
