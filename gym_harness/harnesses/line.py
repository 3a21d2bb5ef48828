"""Line protocol v1: any command that speaks gym_harness's own JSON lines.

Harness → env: ``{"type":"ready"}`` once, then per turn ``text``, ``tool_call``,
``tool_result``, ``llm_usage`` ... and ``{"type":"turn_complete","response":...,"done":...}``.
Env → harness: ``{"type":"message","content":...}``. The bridge's URL and token
reach the harness as ``GYM_HARNESS_MCP_URL`` / ``GYM_HARNESS_MCP_TOKEN``.
See ``docs/line-protocol.md``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import ClassVar

from gym_harness.config import DEFAULT_INHERIT_ENV, HarnessConfig
from gym_harness.errors import ConfigError, ForkUnsupported, ProtocolError
from gym_harness.harnesses._common import MODEL_KEY_VAR, openai_base
from gym_harness.harnesses.base import (
    FORKED_FROM_VAR,
    EpisodeContext,
    Feed,
    Harness,
    HarnessSession,
    Launch,
)
from gym_harness.records.events import EventType, HarnessEvent
from gym_harness.utils.bounded_json import (
    parse_object,  # not _common's alias: one frame less per line
)

__all__ = ["CommandHarness", "CommandSession", "ReferenceHarness"]

_encode_string = json.encoder.encode_basestring_ascii  # what json.dumps uses by default
_REFERENCE_AGENT = Path(__file__).resolve().parent.parent / "agents" / "reference.py"
MCP_URL_VAR = "GYM_HARNESS_MCP_URL"
MCP_TOKEN_VAR = "GYM_HARNESS_MCP_TOKEN"
#: With ``capture=True``: the model proxy's origin and its per-episode key.
MODEL_URL_VAR = "GYM_HARNESS_MODEL_BASE_URL"

#: Line type -> (event type, keys its data always has). A plain dict: this is the hot path.
_KINDS: dict[str, tuple[EventType, tuple[str, ...]]] = {
    kind.value: (kind, ()) for kind in EventType if kind not in (EventType.OTHER,)
}
_KINDS["text"] = (EventType.TEXT, ("text",))
_KINDS["tool_call"] = (EventType.TOOL_CALL, ("name", "arguments"))
_KINDS["tool_result"] = (EventType.TOOL_RESULT, ("name", "content", "is_error"))


class CommandHarness(Harness):
    """Any command speaking line protocol v1 (``config.command``).

    Example:
        >>> import gymnasium
        >>> env = gymnasium.make("gym_harness/Command-v0", command=["python", "my_agent.py"])
    """

    name: ClassVar[str] = "command"

    def check_config(self, config: HarnessConfig) -> None:
        if not config.command:
            raise ConfigError(
                f"The {self.name!r} harness needs a command: pass command=['prog', 'arg', ...]."
            )

    def fork_session(self, session: HarnessSession | None) -> dict[str, str]:
        """A command can be forked when its ready line said ``"fork": true``."""
        if isinstance(session, CommandSession) and session.forkable:
            return {}
        raise ForkUnsupported(
            f"the {self.name!r} harness cannot fork this turn-mode episode: its ready line did "
            'not say "fork": true (line protocol, "Forking"), so it may keep its state where '
            "a copy of its workspace and home cannot reach. Fork in mode='model' instead."
        )

    def launch(self, ctx: EpisodeContext, config: HarnessConfig) -> Launch:
        self.check_config(config)
        origin = self.resume_copy(ctx)
        env = {**config.env, MCP_URL_VAR: ctx.bridge_url, MCP_TOKEN_VAR: ctx.bridge_token}
        if origin is not None:
            env[FORKED_FROM_VAR] = origin.episode_id
        if ctx.model_base_url:  # capture: the harness's model calls go through the proxy
            env[MODEL_URL_VAR] = ctx.model_base_url
            env[MODEL_KEY_VAR] = ctx.model_api_key or ""
        session = CommandSession(plain_text=config.allow_plain_text)
        return Launch(config.replace(env=env), session)


class CommandSession(HarnessSession):
    """One episode of a line-protocol v1 command.

    Args:
        plain_text: Take a line that is not a typed JSON object as reply text
            (``HarnessConfig.allow_plain_text``) instead of a protocol error.
    """

    def __init__(self, *, plain_text: bool = False) -> None:
        self._plain_text = plain_text
        self._texts: list[str] = []
        #: The ready line said ``"fork": true`` (the harness can be forked in turn mode).
        self.forkable = False

    def message_lines(self, text: str) -> list[str]:
        self._texts = []
        # json.dumps({"type": "message", "content": text}) to the byte, minus its Python
        # layers (the step's hot path): the same C string encoder, the same separators.
        return ['{"type": "message", "content": ' + _encode_string(text) + "}"]

    def feed(self, line: str) -> Feed:
        obj, why = parse_object(line)
        if obj is None or not isinstance(obj.get("type"), str):
            if self._plain_text:
                self._texts.append(line)
                return Feed(events=[HarnessEvent(EventType.TEXT, {"text": line})])
            raise ProtocolError(
                f"expected one JSON object with a 'type' per line ({why or 'no type'}), "
                f"got {line[:200]!r}"
            )
        kind = obj.pop("type")
        if kind == "ready":
            self.forkable = obj.get("fork") is True
            return Feed(ready=True)
        if kind == "turn_complete":
            response = obj.get("response")
            if not isinstance(response, str):
                response = "".join(self._texts)
            done = bool(obj.get("done", False))
            return Feed(
                events=[
                    HarnessEvent(EventType.TURN_COMPLETE, {"response": response, "done": done})
                ],
                turn_complete=True,
                response=response,
                done=done,
            )
        known = _KINDS.get(kind)
        if known is None:  # an unknown type is kept whole, not an error
            obj["type"] = kind
            return Feed(events=[HarnessEvent(EventType.OTHER, obj)])
        event_type, keys = known
        for key in keys:
            obj.setdefault(key, None)
        if event_type is EventType.TEXT and isinstance(obj["text"], str):
            self._texts.append(obj["text"])
        return Feed(events=[HarnessEvent(event_type, obj)])


class ReferenceHarness(CommandHarness):
    """The embedded default harness, ``python -m gym_harness.agents.reference``.

    By name alone (``HarnessEnv("reference")``) it gets no tools, tasks or reward, like
    any harness; ``gymnasium.make("gym_harness/Reference-v0")`` adds the demo's
    (``gym_harness.agents.demo``: three tools, ``data/demo_tasks.jsonl``, ``demo_reward``).

    Args:
        policy: ``"scripted"`` (deterministic, no network) or ``"openai"``
            (any OpenAI-compatible chat-completions endpoint).
        model: Model name for the ``openai`` policy.
        base_url: Endpoint base URL for the ``openai`` policy (else ``OPENAI_BASE_URL``).
        api_key_env: Name of the variable holding the endpoint's key.
        max_tool_calls: Tool calls allowed per turn (``openai`` policy).
    """

    name: ClassVar[str] = "reference"

    def __init__(
        self,
        *,
        policy: str = "scripted",
        model: str | None = None,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        max_tool_calls: int = 8,
    ) -> None:
        if policy not in ("scripted", "openai"):
            raise ConfigError(f"policy must be 'scripted' or 'openai', got {policy!r}.")
        self.policy = policy
        self.model = model
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.max_tool_calls = max_tool_calls

    def default_config(self) -> HarnessConfig:
        # By path, not -m: -m would import gym_harness (gymnasium, numpy), ~0.25 s a reset.
        # -S: the agent needs the standard library alone, and ``site`` runs every .pth of
        # the environment's site-packages (editable-install finders, certifi ...) at start.
        command = [sys.executable, "-S", str(_REFERENCE_AGENT), "--policy", self.policy]
        inherit = tuple(DEFAULT_INHERIT_ENV)
        if self.policy == "openai":
            command += ["--api-key-env", self.api_key_env]
            command += ["--max-tool-calls", str(self.max_tool_calls)]
            if self.model:
                command += ["--model", self.model]
            if self.base_url:
                command += ["--base-url", self.base_url]
            inherit += (self.api_key_env, "OPENAI_BASE_URL", "OPENAI_MODEL")
        return HarnessConfig(command=command, inherit_env=inherit)

    def for_model_mode(self) -> ReferenceHarness:
        """The ``openai`` policy, whose every model call then reaches the env's endpoint."""
        if self.policy == "openai":
            return self
        return ReferenceHarness(
            policy="openai",
            model=self.model or "policy",
            api_key_env=self.api_key_env,
            max_tool_calls=self.max_tool_calls,
        )

    def launch(self, ctx: EpisodeContext, config: HarnessConfig) -> Launch:
        launch = super().launch(ctx, config)
        config = launch.config
        if self.policy == "openai" and ctx.model_base_url:
            base = openai_base(ctx.model_base_url)
            env = {**config.env, "OPENAI_BASE_URL": base, self.api_key_env: ctx.model_api_key or ""}
            command = list(config.command)
            if "--base-url" in command:
                command[command.index("--base-url") + 1] = base
            if ctx.policy_timeout_s is not None:  # model mode: outwait the policy
                command += ["--request-timeout", str(ctx.policy_timeout_s + 60)]
            config = config.replace(env=env, command=command)
        return Launch(config, launch.session)
