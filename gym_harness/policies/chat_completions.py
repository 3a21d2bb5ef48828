"""A model-mode policy that forwards each model call to an OpenAI-compatible server.

``ChatCompletionsPolicy(base_url, model)`` is a ``policy(request) -> action`` for
``mode="model"``: it POSTs the request the env observed (chat messages, tools as
function schemas, sampling) to ``{base_url}/chat/completions``, unstreamed, and returns
the first choice as the action dict ``parse_action`` reads: ``content``, ``tool_calls``
(arguments parsed from their JSON text), ``stop_reason``, ``usage``, and the engine's
``token_ids``, ``logprobs`` and ``prompt_token_ids`` when the server returns them (vLLM
with ``return_token_ids=True`` and ``logprobs=True``).

Every failure of the server (no connection, a non-2xx status, a body that is no chat
completion, no answer within ``timeout_s``, an answer over ``max_answer_bytes``) raises
:class:`~gym_harness.errors.PolicyError` with what happened and what to do; a rollout ends
that episode as ``policy_error``. A tool call whose arguments are no JSON object is passed
on as the model wrote it: the env judges it (``invalid_action``), as any policy's.

Threads: one policy may serve many threads at once (a local rollout's workers). The
HTTP client (one connection pool, at most ``max_connections``) is made on first use under
a lock and is itself thread-safe; everything else is read-only configuration.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gym_harness.errors import ConfigError, PolicyError

if TYPE_CHECKING:
    import httpx2

__all__ = ["FORWARDED_SAMPLING", "ChatCompletionsPolicy"]

#: What the harness asked of the sampler that is sent on: the request's ``sampling``
#: under these common names. ``max_tokens`` is not: a CLI sizes it for its vendor's
#: model (Claude Code asks 32000), which a local model's context may not hold; pass
#: ``max_tokens=N`` to the policy to set one.
FORWARDED_SAMPLING = ("temperature", "top_p", "stop", "seed")
#: A finish reason sent on as the action's ``stop_reason``; others are left out (the env
#: then derives it from the tool calls).
_STOP_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter"})
#: Characters of a failed answer's body quoted in the error.
_QUOTE = 300
#: Keywords a chat message keeps, per role (OpenAI's schema; stricter servers refuse others).
_MESSAGE_KEYS = {
    "assistant": ("role", "content", "tool_calls"),
    "tool": ("role", "content", "tool_call_id"),
}


class ChatCompletionsPolicy:
    """Answer model-mode calls with any OpenAI-compatible chat-completions server.

    Args:
        base_url: The server's base URL, up to and including ``/v1``
            (``http://127.0.0.1:8000/v1``); requests go to ``{base_url}/chat/completions``.
        model: The model name the server serves (vLLM's ``--served-model-name``).
        api_key_env: The environment variable holding the server's API key, sent as a
            bearer token (never a key itself: argv and pickles are readable). ``None``:
            no key.
        timeout_s: Longest wait for the answer (its head, then each read); keep it under
            the env's ``policy_timeout_s`` (600 s by default), so the episode ends as
            ``policy_error`` rather than ``policy_timeout``.
        connect_timeout_s: Longest wait to connect.
        max_connections: Connections kept to the server at most (threads share them).
        max_answer_bytes: Largest answer body read.
        **sampling: Fields added to every request body, over the harness's own
            (``temperature=0.7``, ``max_tokens=1024``, vLLM's ``return_token_ids=True``,
            ``logprobs=True``, ``top_k=20`` ...). A field set to ``None`` is left out, even
            when the harness asked for it.

    Raises:
        ConfigError: ``base_url`` is no http(s) URL, a bound is not positive, or
            ``api_key_env`` names a variable that is not set.

    Example:
        >>> policy = ChatCompletionsPolicy(  # doctest: +SKIP
        ...     "http://127.0.0.1:8000/v1", "Qwen/Qwen3-8B", return_token_ids=True)
        >>> with open("out.jsonl", "w") as out:  # doctest: +SKIP
        ...     local_rollout("gym_harness/ClaudeCode-v0", {"mode": "model"},
        ...                   load_tasks("tasks.jsonl"), out=out, policy=policy)
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        *,
        timeout_s: float = 540.0,
        connect_timeout_s: float = 10.0,
        max_connections: int = 16,
        max_answer_bytes: int = 64 * 1024 * 1024,
        **sampling: Any,
    ) -> None:
        if not (isinstance(base_url, str) and base_url.startswith(("http://", "https://"))):
            raise ConfigError(
                f"base_url must be an http(s) URL such as 'http://127.0.0.1:8000/v1', "
                f"got {base_url!r}."
            )
        if not (isinstance(model, str) and model):
            raise ConfigError(f"model must name the model the server serves, got {model!r}.")
        for name, value in (
            ("timeout_s", timeout_s),
            ("connect_timeout_s", connect_timeout_s),
            ("max_connections", max_connections),
            ("max_answer_bytes", max_answer_bytes),
        ):
            if not value > 0:
                raise ConfigError(f"{name} must be positive, got {value!r}.")
        if api_key_env is not None and api_key_env not in os.environ:
            raise ConfigError(
                f"api_key_env names {api_key_env!r}, which is not set: export "
                f"{api_key_env}=<the server's key>, or pass api_key_env=None for no key."
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.max_connections = int(max_connections)
        self.max_answer_bytes = int(max_answer_bytes)
        self.sampling: dict[str, Any] = dict(sampling)
        self._lock = threading.Lock()
        self._client: httpx2.Client | None = None

    @property
    def url(self) -> str:
        """Where requests go: ``{base_url}/chat/completions``."""
        return f"{self.base_url}/chat/completions"

    def __call__(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Answer one model call.

        Args:
            request: The observation of a model-mode step, as a dict (``messages``,
                ``tools``, ``sampling``, ...).

        Returns:
            The action: ``content``, ``tool_calls``, and whichever of ``stop_reason``,
            ``usage``, ``token_ids``, ``logprobs`` and ``prompt_token_ids`` the server
            gave.

        Raises:
            PolicyError: The server could not be reached, failed, was too slow, or
                answered what is no chat completion.
        """
        body = json.dumps(self.request_body(request), ensure_ascii=False).encode()
        return self.action(self._post(body))

    def request_body(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """The chat-completions request body for a model-mode request (unstreamed)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [_message(m) for m in request.get("messages") or [] if isinstance(m, dict)],
        }
        tools = [t for t in request.get("tools") or [] if isinstance(t, dict)]
        if tools:
            body["tools"] = tools
        asked = request.get("sampling")
        if isinstance(asked, Mapping):
            body.update({k: asked[k] for k in FORWARDED_SAMPLING if asked.get(k) is not None})
            choice = _tool_choice(asked.get("tool_choice"))
            if tools and choice is not None:
                body["tool_choice"] = choice
        for key, value in self.sampling.items():
            if value is None:
                body.pop(key, None)
            else:
                body[key] = value
        body["stream"] = False
        return body

    def action(self, answer: Any) -> dict[str, Any]:
        """The action for a chat completion (the parsed response body).

        Raises:
            PolicyError: ``answer`` is no chat completion with a message.
        """
        if not isinstance(answer, dict):
            raise self._malformed("the body is no JSON object", answer)
        choices = answer.get("choices")
        if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)):
            raise self._malformed("it holds no choices[0]", answer)
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise self._malformed("choices[0] holds no message", answer)
        content = message.get("content")
        if isinstance(content, list):  # content parts: their text, joined
            content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
        if content is not None and not isinstance(content, str):
            raise self._malformed("choices[0].message.content is no string", answer)
        raw_calls = message.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise self._malformed("choices[0].message.tool_calls is no list", answer)
        action: dict[str, Any] = {
            "content": content or "",
            "tool_calls": [self._tool_call(i, c, answer) for i, c in enumerate(raw_calls)],
        }
        if choice.get("finish_reason") in _STOP_REASONS:
            action["stop_reason"] = choice["finish_reason"]
        if isinstance(answer.get("usage"), dict):
            action["usage"] = answer["usage"]
        token_ids = choice.get("token_ids")
        if isinstance(token_ids, list):
            action["token_ids"] = token_ids
        prompt_ids = answer.get("prompt_token_ids", choice.get("prompt_token_ids"))
        if isinstance(prompt_ids, list):
            action["prompt_token_ids"] = prompt_ids
        logprobs = choice.get("logprobs")
        entries = logprobs.get("content") if isinstance(logprobs, dict) else None
        if isinstance(entries, list):
            action["logprobs"] = [e.get("logprob") if isinstance(e, dict) else e for e in entries]
        return action

    def close(self) -> None:
        """Close the connections to the server (a later call opens new ones). Idempotent."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __enter__(self) -> ChatCompletionsPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_lock"] = state["_client"] = None  # a copy makes its own on first use
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ChatCompletionsPolicy({self.base_url!r}, {self.model!r})"

    # -- the HTTP leg ---------------------------------------------------------------------

    def _connection(self) -> httpx2.Client:
        with self._lock:
            if self._client is None:
                import httpx2  # on first use: ``import gym_harness`` stays light

                timeout = httpx2.Timeout(self.timeout_s, connect=self.connect_timeout_s)
                limits = httpx2.Limits(
                    max_connections=self.max_connections,
                    max_keepalive_connections=self.max_connections,
                )
                self._client = httpx2.Client(timeout=timeout, limits=limits, trust_env=False)
            return self._client

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": "application/json"}
        if self.api_key_env is not None:
            key = os.environ.get(self.api_key_env)
            if key is None:
                raise PolicyError(
                    f"{self.api_key_env} is not set in this process (pid {os.getpid()}): "
                    "set it where the policy runs (a Ray worker: the job's runtime_env)."
                )
            headers["authorization"] = f"Bearer {key}"
        return headers

    def _post(self, body: bytes) -> Any:
        import httpx2

        client = self._connection()
        deadline = time.monotonic() + self.timeout_s
        try:
            with client.stream("POST", self.url, content=body, headers=self._headers()) as reply:
                data = bytearray()
                for chunk in reply.iter_bytes():
                    data += chunk
                    if len(data) > self.max_answer_bytes:
                        raise PolicyError(
                            f"the model server at {self.url} answered more than "
                            f"max_answer_bytes={self.max_answer_bytes}; raise it, or ask "
                            "for shorter completions (max_tokens)."
                        )
                    if time.monotonic() > deadline:
                        raise httpx2.ReadTimeout("the answer took too long")
                status = reply.status_code
        except httpx2.TimeoutException as exc:
            phase = "connect" if isinstance(exc, httpx2.ConnectTimeout) else "answer"
            limit = self.connect_timeout_s if phase == "connect" else self.timeout_s
            raise PolicyError(
                f"the model server at {self.url} did not {phase} within {limit:g}s "
                f"({type(exc).__name__}); is it overloaded? Raise "
                f"{'connect_timeout_s' if phase == 'connect' else 'timeout_s'}, or serve faster."
            ) from exc
        except httpx2.ConnectError as exc:
            raise PolicyError(
                f"could not connect to the model server at {self.url} ({exc}): start it, "
                "or check base_url (it ends in /v1 for vLLM and llama.cpp)."
            ) from exc
        except httpx2.HTTPError as exc:
            raise PolicyError(
                f"the model server at {self.url} broke the connection "
                f"({type(exc).__name__}: {exc}); check its log."
            ) from exc
        text = bytes(data).decode("utf-8", "replace")
        if not 200 <= status < 300:
            raise PolicyError(
                f"the model server at {self.url} answered HTTP {status}: "
                f"{_quote(_error_message(text))}; check the model name ({self.model!r}), the "
                "key, and the sampling fields the server accepts."
            )
        try:
            return json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: nested past the decoder's depth
            raise self._malformed("the body is no JSON", text) from None

    def _malformed(self, why: str, answer: Any) -> PolicyError:
        shown = answer if isinstance(answer, str) else json.dumps(answer)[: _QUOTE * 2]
        return PolicyError(
            f"the model server at {self.url} answered what is no chat completion ({why}): "
            f"{_quote(shown)}; is base_url an OpenAI-compatible /v1?"
        )

    def _tool_call(self, index: int, raw: Any, answer: Any) -> dict[str, Any]:
        function = raw.get("function") if isinstance(raw, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not (isinstance(name, str) and name):
            raise self._malformed(f"tool call {index} names no function", answer)
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            # Text that is no JSON is the model's own: the env judges it (invalid_action).
            with contextlib.suppress(ValueError):
                arguments = json.loads(arguments) if arguments.strip() else {}
        call: dict[str, Any] = {"name": name, "arguments": {} if arguments is None else arguments}
        if isinstance(raw.get("id"), str) and raw["id"]:
            call["id"] = raw["id"]
        return call


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A chat message of the observation as OpenAI's schema has it."""
    role = str(message.get("role") or "user")
    keys = _MESSAGE_KEYS.get(role, ("role", "content"))
    out = {k: message[k] for k in keys if k in message}
    if role == "assistant" and not out.get("tool_calls"):
        out.pop("tool_calls", None)  # an empty list is refused by OpenAI's schema
    return out


def _tool_choice(asked: Any) -> Any:
    """The harness's tool choice (its API's spelling) as chat completions spells it."""
    if isinstance(asked, str):
        word = {"any": "required", "validated": "required"}.get(asked.lower(), asked.lower())
        return word if word in ("auto", "none", "required") else None
    if isinstance(asked, dict):
        kind = asked.get("type")
        if kind == "function":
            return asked
        if kind == "tool" and isinstance(asked.get("name"), str):
            return {"type": "function", "function": {"name": asked["name"]}}
        if isinstance(kind, str):
            return _tool_choice(kind)
    return None


def _error_message(text: str) -> str:
    """The message of an OpenAI-style error body, else the body itself."""
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return text
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    if isinstance(error, str):
        return error
    return text


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return repr(text[:_QUOTE] + ("..." if len(text) > _QUOTE else "")) if text else "(empty)"
