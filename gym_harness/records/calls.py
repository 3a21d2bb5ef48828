"""The record of one model call of model mode: :class:`ModelCall` and its :class:`Completion`.

A :class:`ModelCall` is what a rollout record's ``calls`` list is made of: the
observation the policy saw (messages, tools, sampling), the completion it gave, its
``token_ids``/``logprobs``/``prompt_token_ids``/``usage``, and how the exchange ended.
The endpoint that makes them, and the bounds they are kept under, live in
``gym_harness.model``; this module holds the values only.

Threads: every value here is immutable.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from gym_harness.records.exchanges import api_of

__all__ = [
    "SIDE_MODEL",
    "CallRequest",
    "Completion",
    "ModelCall",
    "ToolCall",
    "assistant_message",
    "chat_tool_calls",
]

#: The model name adapters give their CLI's small or fast model in model mode, so that
#: its side calls (titles, summaries) are told apart from the agent's own calls.
SIDE_MODEL = "gym-side"


class CallRequest(Protocol):
    """What a :class:`ModelCall` reads of the request it records (``ModelRequest``)."""

    @property
    def api(self) -> str:
        """The wire API: ``"anthropic"``, ``"responses"``, ``"chat"`` or ``"gemini"``."""
        ...

    def observation(self) -> dict[str, Any]:
        """What the policy saw of the request."""
        ...


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a completion.

    Attributes:
        id: The call id (the policy's, or one made in the style of the request's API).
        name: A tool name the request offered, as the observation spelled it.
        arguments: The arguments (always a JSON object).
    """

    id: str
    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        """The arguments as JSON text (what Chat Completions and Responses carry)."""
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class Completion:
    """A checked answer to one model request.

    Attributes:
        content: The assistant's text ("" for none).
        tool_calls: The tool calls, in order.
        stop_reason: One of ``gym_harness.model.action.STOP_REASONS``.
        token_ids: The policy's token ids, kept for training (never sent to the harness).
        logprobs: The policy's log-probabilities, kept for training (never sent).
        usage: The policy's token counts, kept for training.
        prompt_token_ids: The engine's own ids of the prompt it sampled from, kept for
            training (never sent; nothing re-tokenises the messages).
    """

    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: str = "stop"
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[Any, ...] | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    prompt_token_ids: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the record of a call keeps this)."""
        out = asdict(self)
        out["tool_calls"] = [asdict(call) for call in self.tool_calls]
        for key in ("token_ids", "logprobs", "prompt_token_ids"):
            out[key] = None if out[key] is None else list(out[key])
        return out


def chat_tool_calls(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    """Tool calls in the OpenAI chat form (``{"id", "type": "function", "function"}``)."""
    return [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments_json},
        }
        for c in calls
    ]


def assistant_message(completion: Completion) -> dict[str, Any]:
    """``completion`` as an assistant message in the chat form of the observations."""
    message: dict[str, Any] = {"role": "assistant", "content": completion.content}
    if completion.tool_calls:
        message["tool_calls"] = chat_tool_calls(completion.tool_calls)
    return message


@dataclass(frozen=True)
class ModelCall:
    """One model call of the harness and how it ended.

    Attributes:
        seq: Arrival order on the endpoint (1, 2, ...).
        request_id: The id the observation carried.
        api: ``"anthropic"``, ``"responses"``, ``"chat"`` or ``"gemini"``.
        path: The request path.
        side: The adapter called it a side call (a title, a summary): no policy step.
        observation: What the policy saw (:meth:`ModelRequest.observation`); ``None`` for
            a call refused before it was read, or a record cut by the byte bound.
        completion: The answer, or ``None`` when it ended in an error.
        status: The HTTP status the harness got (200, or the error's).
        error: Why the call ended without an answer ("" when answered).
        started: Wall-clock time the request arrived.
        answered: Wall-clock time it was answered or given up.
        retries: How many retries of the harness joined this call.
        truncated: The record lost its observation and completion to the byte bound.
    """

    seq: int
    request_id: str
    api: str
    path: str
    side: bool
    observation: dict[str, Any] | None
    completion: Completion | None
    status: int
    error: str
    started: float
    answered: float
    retries: int = 0
    truncated: bool = False

    @classmethod
    def of(
        cls,
        seq: int,
        request_id: str,
        request: CallRequest | None,
        path: str,
        side: bool,
        completion: Completion | None,
        status: int,
        error: str,
        started: float,
        retries: int = 0,
    ) -> ModelCall:
        """The record of a call that ends now (``request`` is ``None`` if it was not read)."""
        return cls(
            seq=seq,
            request_id=request_id,
            api=request.api if request else api_of(path),
            path=path,
            side=side,
            observation=request.observation() if request else None,
            completion=completion,
            status=status,
            error=error,
            started=started,
            answered=time.time(),
            retries=retries,
        )

    @property
    def token_ids(self) -> list[int] | None:
        """The policy's token ids for this completion, when the action carried them."""
        found = self.completion.token_ids if self.completion else None
        return None if found is None else list(found)

    @property
    def logprobs(self) -> list[Any] | None:
        """The policy's log-probabilities, when the action carried them."""
        found = self.completion.logprobs if self.completion else None
        return None if found is None else list(found)

    @property
    def prompt_token_ids(self) -> list[int] | None:
        """The engine's ids of the prompt this completion was sampled from, if reported."""
        found = self.completion.prompt_token_ids if self.completion else None
        return None if found is None else list(found)

    @property
    def usage(self) -> dict[str, Any]:
        """The policy's token counts, when the action carried them."""
        return dict(self.completion.usage) if self.completion else {}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``token_ids``/``logprobs``/``usage`` sit at the top level."""
        completion = self.completion.to_dict() if self.completion else None
        if completion is not None:
            for key in ("token_ids", "logprobs", "usage", "prompt_token_ids"):
                completion.pop(key, None)
        return {
            "seq": self.seq,
            "request_id": self.request_id,
            "api": self.api,
            "path": self.path,
            "side": self.side,
            "observation": self.observation,
            "completion": completion,
            "token_ids": self.token_ids,
            "logprobs": self.logprobs,
            "prompt_token_ids": self.prompt_token_ids,
            "usage": self.usage,
            "status": self.status,
            "error": self.error,
            "started": self.started,
            "answered": self.answered,
            "retries": self.retries,
            "truncated": self.truncated,
        }
