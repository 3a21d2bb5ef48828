"""HarnessConfig: every setting of an env, in one frozen dataclass.

A setting is a value (a number, a string, a path, a flag), never code: the env's
components (the harness, its tools, the reward, the tasks, callbacks) are
``HarnessEnv``'s own keywords, and every other keyword of ``HarnessEnv`` /
``gymnasium.make`` is a field here. The config is validated at construction, pickles
and round-trips JSON (``to_dict`` / ``from_dict``), so it can travel to vector-env
workers and into episode records. Its parts go each to the one reader that needs them:
``process_spec()`` to ``HarnessProcess``, ``turn_limits()`` to the turn runner.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gym_harness.errors import ConfigError

__all__ = [
    "DEFAULT_INHERIT_ENV",
    "SANDBOX_TIERS",
    "INTERRUPT_GRACE_S",
    "MODES",
    "MODEL_CALLS",
    "HarnessConfig",
    "ProcessSpec",
    "TurnLimits",
]

#: Variables allowed through from our environment unless the config says otherwise.
DEFAULT_INHERIT_ENV: tuple[str, ...] = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TMPDIR",
    "TZ",
    "PYTHONPATH",
)
#: The disk an episode's workspace, home and tmp may hold by default (``max_workspace_bytes``).
DEFAULT_WORKSPACE_BYTES = 4 << 30
#: The ``sandbox`` settings: use what the kernel offers, demand all of it, or none.
SANDBOX_TIERS = ("auto", "strict", "off")
#: The ``mode`` settings: a step is a user turn, or a step answers one model call.
MODES = ("turns", "model")
#: The ``model_calls`` settings: side calls get a short fixed answer, or every call is a step.
MODEL_CALLS = ("main", "all")
#: How long an interrupted turn may take to wind down, at most (and at most ``stop_grace_s``).
INTERRUPT_GRACE_S = 1.0


@dataclass(frozen=True)
class ProcessSpec:
    """What ``HarnessProcess`` needs to start, read and stop one harness; nothing about turns.

    Made from a config by :meth:`HarnessConfig.process_spec`; the fields mean what
    the config's fields of the same name mean, and the defaults are the same.

    Args:
        command: The argv to start.
        cwd: The working directory; ``None`` means our own.
        env: Extra environment variables (after ``inherit_env``).
        inherit_env: Names let through from our own environment; nothing else is.
        stop_grace_s: Time between SIGTERM and SIGKILL when stopping.
        stderr_tail_lines: How many stderr lines are kept for error reports.
        max_line_bytes: Longest output line kept whole; longer ones are cut and marked.
        cgroup: Also contain the tree in a cgroup v2 of its own, where one can be made.
        sandbox: ``"auto"``, ``"strict"`` or ``"off"`` (see ``HarnessConfig``).
        memory_limit_mb: Resident memory the whole tree may use; ``None`` for no limit.
        max_processes: Processes the tree may hold at once; ``None`` for no limit.
        max_workspace_bytes: Disk the episode's workspace, home and tmp may hold;
            ``None`` for no limit.
        readable_paths: More paths the confined harness may read (and execute).
        connect_ports: More TCP ports the confined harness may connect to.

    Example:
        >>> spec = HarnessConfig(command=["cat"], stop_grace_s=0.5).process_spec()
        >>> spec.command, spec.stop_grace_s
        (('cat',), 0.5)
    """

    command: Sequence[str] = ()
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    inherit_env: Sequence[str] = DEFAULT_INHERIT_ENV
    stop_grace_s: float = 2.0
    stderr_tail_lines: int = 50
    max_line_bytes: int = 8 * 1024 * 1024
    cgroup: bool = True
    sandbox: str = "auto"
    memory_limit_mb: int | None = None
    max_processes: int | None = None
    max_workspace_bytes: int | None = DEFAULT_WORKSPACE_BYTES
    readable_paths: Sequence[str] = ()
    connect_ports: Sequence[int] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "readable_paths", tuple(self.readable_paths))
        object.__setattr__(self, "connect_ports", tuple(self.connect_ports))
        object.__setattr__(self, "inherit_env", tuple(self.inherit_env))
        object.__setattr__(self, "env", dict(self.env))


@dataclass(frozen=True)
class TurnLimits:
    """The deadlines the turn runner keeps; made by :meth:`HarnessConfig.turn_limits`.

    Args:
        startup_timeout_s: How long the harness may take to become ready.
        turn_timeout_s: Wall-clock budget of one turn.
        idle_timeout_s: How long a turn may go without any sign of life.
        episode_timeout_s: Wall-clock budget of a whole episode; ``None`` for none
            (the env keeps the episode's deadline; the runner names it in messages).
        interrupt_grace_s: How long an interrupted turn may wind down before it ends.
    """

    startup_timeout_s: float = 60.0
    turn_timeout_s: float = 900.0
    idle_timeout_s: float = 300.0
    episode_timeout_s: float | None = None
    interrupt_grace_s: float = INTERRUPT_GRACE_S


@dataclass(frozen=True)
class HarnessConfig:
    """Every setting of an env: the harness process, its turns, tools, capture and mode.

    ``HarnessEnv(..., KEY=VALUE)``, ``gymnasium.make(ID, KEY=VALUE)`` and ``gym-harness
    --set KEY=VALUE`` all map onto these fields (a harness adapter starts from its own
    ``default_config()``). The fields by concern: the process (``command`` to
    ``max_line_bytes``, ``cgroup``), its turns (the ``*_timeout_s``), the episode's
    directories (``workspace``, ``keep_workspace``, ``max_fork_bytes``), the env's tools
    (``tool_prefix``, ``tool_timeout_s``, ``tool_workers``, ``max_mcp_sessions``), capture
    (``capture`` to ``capture_tokens``), model mode (``mode``, ``policy_timeout_s``,
    ``model_calls``) and confinement (``sandbox`` to ``connect_ports``).

    Args:
        command: The argv to start (a list of strings; never a shell string).
        cwd: The working directory; ``None`` means the episode workspace.
        env: Extra environment variables for the harness (after ``inherit_env``).
        inherit_env: Names let through from our own environment; nothing else is.
        startup_timeout_s: How long the harness may take to become ready.
        turn_timeout_s: Wall-clock budget of one turn (``step``).
        idle_timeout_s: How long a turn may go without any sign of life.
        episode_timeout_s: Wall-clock budget of a whole episode; ``None`` for none.
        stop_grace_s: Time between SIGTERM and SIGKILL when stopping.
        stderr_tail_lines: How many stderr lines are kept for error reports.
        max_line_bytes: Longest output line kept whole; longer ones are cut and marked.
        allow_plain_text: Treat non-JSON stdout lines as text instead of a protocol error.
        capture_max_bytes: With ``capture``, each recorded model request and answer body is
            kept up to this many bytes (the record says ``truncated``); the harness still
            gets the whole answer.
        capture_tokens: With ``capture``, ask an OpenAI-compatible Chat Completions upstream
            (vLLM, SGLang) for the sampled token ids, the prompt's token ids and logprobs
            (``return_token_ids``, ``logprobs``), record them with each exchange
            (``Trajectory.training_trace()``), and take them back out of the answer the
            harness gets. An upstream that ignores the request is recorded as text-level.
        capture_sampling: With ``capture``, sampling fields (``{"temperature": 1.0,
            "top_p": 1.0, ...}``) set on each Chat Completions request on its way upstream,
            over the harness's own: a trainer's sampling policy (TRL's harness worker passes
            one), so the recorded logprobs are the policy's. ``None`` leaves requests as
            the harness wrote them.
        max_mcp_sessions: MCP sessions one episode may open on the env's tool bridge at
            once; one more ``initialize`` gets a JSON-RPC error (open ones keep working).
        tool_workers: Threads the bridge runs sync env tools on, at most; a call that
            finds them all taken waits within ``tool_timeout_s``, then gets a "busy" error.
        cgroup: Also put the harness's tree in a cgroup v2 of its own, ended with
            ``cgroup.kill``, where this process may create cgroups (root, or a
            delegated subtree); elsewhere the keeper's subreaper alone contains it.
        reward_timeout_s: Longest a ``reward_fn`` call may take (it then runs in a
            worker thread; past it the turn ends as ``reward_timeout``); ``None`` for none.
        sandbox: How the harness is confined (README, "Confinement"): ``"auto"`` applies
            what this kernel offers (Landlock filesystem and TCP rules, signal scoping,
            a seccomp filter, no capabilities) and says what it could not;
            ``"strict"`` also gives each env a network namespace with only loopback,
            and raises ``ConfigError`` if anything is missing; ``"off"`` confines nothing.
        memory_limit_mb: Resident memory the harness's whole tree may use, in MiB; past
            it the tree is ended and the turn is ``resource_limit``. ``None``: no limit.
        max_processes: Processes the harness's tree may hold at once; past it the tree
            is ended and the turn is ``resource_limit``. ``None``: no limit.
        max_workspace_bytes: Disk the episode's workspace, private home and tmp may hold
            together (4 GiB by default); past it the tree is ended and the turn is
            ``resource_limit``. ``None``: no limit.
        readable_paths: Paths a confined harness may read and execute beside its own
            install tree, the interpreter and the system directories (a data set, say).
        connect_ports: TCP ports a confined harness may connect to beside the env's
            endpoints and its adapter's model API (a model server a Command harness calls
            itself). Landlock's rules name ports, not hosts: any host on these ports.
        max_fork_bytes: Most bytes of workspace and private home ``HarnessEnv.fork`` copies
            (a turn-mode fork copies both; README, "Forking"); a larger episode fails to
            fork with ``ForkUnsupported`` saying how much it holds. 1 GiB by default.
        workspace: A directory copied into every episode's fresh workspace.
        keep_workspace: Keep episode directories after the episode (for inspection).
        tool_prefix: Prefix for env tools whose names clash with harness built-ins.
        tool_timeout_s: A tool call running longer returns an error to the harness.
        capture: Route the harness's model calls through a loopback ``ModelProxy``
            that records every exchange as ``llm_request`` / ``llm_response`` events.
        upstream: With ``capture``, the real API's origin (``https://api.example.com``,
            ``http://127.0.0.1:8000``: no ``/v1``, each adapter appends its API's own
            path); the harness (in ``mode="model"``, its side calls) goes to the proxy.
        upstream_api_key_env: With ``capture``, the variable holding the real key; it
            stays in this process (the harness gets a per-episode proxy token).
        request_logprobs: With ``capture``, ask Chat Completions upstreams for logprobs.
        mode: ``"turns"`` (a step is a user turn) or ``"model"`` (a step answers one model
            call of the harness; see the README's "You are the model").
        policy_timeout_s: In model mode, how long the policy may take to answer a call.
        model_calls: In model mode, ``"main"`` (side calls get a short fixed answer) or
            ``"all"`` (every model call is a step).

    Raises:
        ConfigError: A field has a value of the wrong type or out of range.

    Example:
        >>> cfg = HarnessConfig(command=["python", "agent.py"], turn_timeout_s=30)
        >>> HarnessConfig.from_dict(cfg.to_dict()) == cfg
        True
    """

    command: Sequence[str] = ()
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    inherit_env: Sequence[str] = DEFAULT_INHERIT_ENV
    startup_timeout_s: float = 60.0
    turn_timeout_s: float = 900.0
    idle_timeout_s: float = 300.0
    episode_timeout_s: float | None = None
    stop_grace_s: float = 2.0
    stderr_tail_lines: int = 50
    max_line_bytes: int = 8 * 1024 * 1024
    allow_plain_text: bool = False
    capture_max_bytes: int = 4 * 1024 * 1024
    capture_tokens: bool = False
    capture_sampling: Mapping[str, float] | None = None
    max_mcp_sessions: int = 64
    tool_workers: int = 32
    cgroup: bool = True
    reward_timeout_s: float | None = None
    sandbox: str = "auto"
    memory_limit_mb: int | None = None
    max_processes: int | None = None
    max_workspace_bytes: int | None = DEFAULT_WORKSPACE_BYTES
    readable_paths: Sequence[str] = ()
    connect_ports: Sequence[int] = ()
    max_fork_bytes: int = 1 << 30
    workspace: str | None = None
    keep_workspace: bool = False
    tool_prefix: str = "env_"
    tool_timeout_s: float = 120.0
    capture: bool = False
    upstream: str | None = None
    upstream_api_key_env: str | None = None
    request_logprobs: bool = False
    mode: str = "turns"
    policy_timeout_s: float = 600.0
    model_calls: str = "main"

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "command", _str_tuple("command", self.command))
        set_(self, "readable_paths", _str_tuple("readable_paths", self.readable_paths))
        ports = self.connect_ports
        if (
            isinstance(ports, str | bytes)
            or not isinstance(ports, Sequence)
            or not all(
                isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536 for p in ports
            )
        ):
            raise ConfigError(
                f"HarnessConfig.connect_ports must be a list of TCP ports (1-65535), got {ports!r}."
            )
        set_(self, "connect_ports", tuple(ports))
        if self.sandbox not in SANDBOX_TIERS:
            raise ConfigError(
                f"HarnessConfig.sandbox must be one of {list(SANDBOX_TIERS)}, got "
                f"{self.sandbox!r}; 'auto' confines as far as this kernel allows."
            )
        set_(self, "inherit_env", _str_tuple("inherit_env", self.inherit_env))
        for name in ("cwd", "workspace"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                set_(self, name, _as_path_str(name, value))
        if not isinstance(self.env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise ConfigError(
                f"HarnessConfig.env must map str to str, got {self.env!r}; "
                "convert values with str() first."
            )
        set_(self, "env", dict(self.env))
        for name in (
            "startup_timeout_s",
            "turn_timeout_s",
            "idle_timeout_s",
            "stop_grace_s",
            "tool_timeout_s",
            "policy_timeout_s",
        ):
            _positive(name, getattr(self, name))
        for name in ("episode_timeout_s", "reward_timeout_s"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        for name in (
            "stderr_tail_lines",
            "max_line_bytes",
            "capture_max_bytes",
            "max_mcp_sessions",
            "tool_workers",
            "max_fork_bytes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"HarnessConfig.{name} must be a positive int, got {value!r}.")
        for name in ("memory_limit_mb", "max_processes", "max_workspace_bytes"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigError(
                    f"HarnessConfig.{name} must be a positive int or None, got {value!r}."
                )
        for name in (
            "allow_plain_text",
            "cgroup",
            "capture_tokens",
            "keep_workspace",
            "capture",
            "request_logprobs",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"HarnessConfig.{name} must be a bool, got {getattr(self, name)!r}."
                )
        sampling = self.capture_sampling
        if sampling is not None and not (
            isinstance(sampling, Mapping)
            and all(
                isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
                for k, v in sampling.items()
            )
        ):
            raise ConfigError(
                "HarnessConfig.capture_sampling must map field names to numbers "
                f'({{"temperature": 1.0, "top_p": 1.0}}), got {sampling!r}.'
            )
        for name in ("upstream", "upstream_api_key_env"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"HarnessConfig.{name} must be a str or None, got {value!r}.")
        if not isinstance(self.tool_prefix, str):
            raise ConfigError(f"HarnessConfig.tool_prefix must be a str, got {self.tool_prefix!r}.")
        self._check_modes()

    def _check_modes(self) -> None:
        """Raise ``ConfigError`` saying what to fix in a bad mode, capture or upstream."""
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {list(MODES)}, got {self.mode!r}.")
        if self.model_calls not in MODEL_CALLS:
            raise ConfigError(
                f"model_calls must be one of {list(MODEL_CALLS)}, got {self.model_calls!r}."
            )
        if self.mode == "model" and self.capture:
            raise ConfigError(
                'mode="model" serves the harness\'s model calls itself (they are recorded in '
                "trajectory.calls): drop capture=True."
            )
        upstream = self.upstream
        if self.captured and not (
            isinstance(upstream, str) and upstream.startswith(("http://", "https://"))
        ):
            raise ConfigError(
                f"capture=True (or upstream= with mode='model') needs "
                f"upstream='http(s)://host[:port]' (the real API's origin), got {upstream!r}."
            )
        if self.capture_tokens and not self.captured:
            raise ConfigError(
                "capture_tokens=True asks the capture proxy's upstream for token ids: it needs "
                "capture=True and upstream= (in mode='model' the policy's actions carry the ids)."
            )

    @property
    def captured(self) -> bool:
        """Whether a capture proxy runs: ``capture=True``, or model mode's side calls going
        to an ``upstream``."""
        return self.capture or (self.mode == "model" and self.upstream is not None)

    def process_spec(self) -> ProcessSpec:
        """Return the fields ``HarnessProcess`` reads (argv, environment, grace, caps)."""
        return ProcessSpec(
            command=self.command,
            cwd=self.cwd,
            env=self.env,
            inherit_env=self.inherit_env,
            stop_grace_s=self.stop_grace_s,
            stderr_tail_lines=self.stderr_tail_lines,
            max_line_bytes=self.max_line_bytes,
            cgroup=self.cgroup,
            sandbox=self.sandbox,
            memory_limit_mb=self.memory_limit_mb,
            max_processes=self.max_processes,
            max_workspace_bytes=self.max_workspace_bytes,
            readable_paths=self.readable_paths,
            connect_ports=self.connect_ports,
        )

    def turn_limits(self) -> TurnLimits:
        """Return the deadlines the turn runner keeps."""
        return TurnLimits(
            startup_timeout_s=self.startup_timeout_s,
            turn_timeout_s=self.turn_timeout_s,
            idle_timeout_s=self.idle_timeout_s,
            episode_timeout_s=self.episode_timeout_s,
            interrupt_grace_s=min(INTERRUPT_GRACE_S, self.stop_grace_s),
        )

    def replace(self, **changes: Any) -> HarnessConfig:
        """Return a copy with ``changes`` applied (validated like the original).

        Raises:
            ConfigError: A name is not a field, or a value is invalid.
        """
        unknown = sorted(set(changes) - FIELD_NAMES)
        if unknown:
            raise ConfigError(
                f"Unknown HarnessConfig field(s) {unknown}; known fields: {sorted(FIELD_NAMES)}."
            )
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict of every field."""
        data = dataclasses.asdict(self)
        data["command"] = list(self.command)
        data["inherit_env"] = list(self.inherit_env)
        data["readable_paths"] = list(self.readable_paths)
        data["connect_ports"] = list(self.connect_ports)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HarnessConfig:
        """Build a config from ``to_dict`` output (or any subset of the fields).

        Raises:
            ConfigError: Unknown keys or invalid values.
        """
        return cls().replace(**dict(data))


FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(HarnessConfig))


def _str_tuple(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ConfigError(
            f"HarnessConfig.{name} must be a list of strings, got {value!r}; for example "
            f'{name}=["python", "agent.py"] '
            f"""(gym-harness: --set '{name}=["python","agent.py"]')."""
        )
    items = tuple(value)
    if not all(isinstance(item, str) for item in items):
        raise ConfigError(f"HarnessConfig.{name} must contain only strings, got {items!r}.")
    return items


def _as_path_str(name: str, value: object) -> str:
    import os

    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise ConfigError(f"HarnessConfig.{name} must be a path or None, got {value!r}.")


def _positive(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(
            f"HarnessConfig.{name} must be a positive number of seconds, got {value!r}."
        )
