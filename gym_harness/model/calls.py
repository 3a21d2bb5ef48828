"""Model mode's call tracking: the :class:`ModelCall` records kept under bounds.

The record itself (``ModelCall``) lives in ``gym_harness.records.calls``.
:class:`CallLog` keeps the records, in the order the calls arrived, under a count and a byte bound.
:class:`CallKey` tells a harness's retry from a new call, and :class:`ReplayTable`
remembers recent answers so that a retry gets the same answer again. :class:`Lapses`
counts the calls the policy left past ``policy_timeout_s`` since the last answer.
:class:`EndpointConfig` holds the endpoint's settings and these bounds.

Threads: :class:`CallLog`, :class:`ReplayTable` and
:class:`Lapses` lock nothing themselves: their owner (``ModelEndpoint``) calls them under
its lock.
"""

from __future__ import annotations

import bisect
import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from gym_harness.errors import ConfigError
from gym_harness.loopback.connections import MAX_CONNECTIONS
from gym_harness.model.answer import Usage
from gym_harness.records.calls import Completion, ModelCall
from gym_harness.records.chat_format import CONVERSATION_KEYS

if TYPE_CHECKING:
    from gym_harness.model.request import ModelRequest

__all__ = ["CallKey", "CallLog", "EndpointConfig", "Lapses", "ModelCall", "ReplayTable"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EndpointConfig:
    """How a :class:`ModelEndpoint` answers, and its bounds.

    Attributes:
        model_calls: ``"main"`` (side calls get ``side_answer`` at once) or ``"all"``
            (every model call waits for the policy).
        keepalive_s: Pause between keep-alives on a waiting stream.
        policy_timeout_s: Longest wait for the policy, from the call's arrival.
        max_pending: Most main calls waiting at once; more get 429.
        max_request_bytes: Largest request body; a larger one gets 413.
        max_records: Most records kept between two ``drain()`` calls.
        max_record_bytes: Most bytes of observations and completions kept in records.
        max_replay: Most answered calls remembered for retries (their completions take at
            most a quarter of ``max_record_bytes``).
        side_answer: The text side calls get.
        max_connections: Most open connections.
    """

    model_calls: str = "main"
    keepalive_s: float = 5.0
    policy_timeout_s: float = 600.0
    max_pending: int = 64
    max_request_bytes: int = 32 * 1024 * 1024
    max_records: int = 4096
    max_record_bytes: int = 256 * 1024 * 1024
    max_replay: int = 64
    side_answer: str = "OK"
    max_connections: int = MAX_CONNECTIONS

    def __post_init__(self) -> None:
        if self.model_calls not in ("main", "all"):
            raise ConfigError(f'model_calls must be "main" or "all", got {self.model_calls!r}')
        if not (self.keepalive_s > 0 and self.policy_timeout_s > 0):
            raise ConfigError("keepalive_s and policy_timeout_s must be positive seconds")
        ints = [f.name for f in fields(self) if f.name.startswith("max_")]
        bad = [n for n in ints if type(getattr(self, n)) is not int or getattr(self, n) < 1]
        if bad:
            raise ConfigError(f"{bad[0]} must be a positive int, got {getattr(self, bad[0])!r}")


# The request fields that carry the conversation itself, in each API; a retry the SDK
# makes with a new stream form or a new token limit keeps these.
_CONVERSATION = (
    "messages",
    "system",
    "input",
    "instructions",
    "previous_response_id",
    "contents",
    "systemInstruction",
    "system_instruction",
    "tools",
)
_STREAM_KEYS = frozenset({"stream", "stream_options"})


def weight(request_bytes: int, completion: Completion | None) -> int:
    """About how many bytes a record holds (its request body, its completion)."""
    if completion is None:
        return request_bytes + 256
    size = len(completion.content) + sum(
        len(c.name) + len(c.arguments_json) for c in completion.tool_calls
    )
    traces = (completion.token_ids, completion.logprobs, completion.prompt_token_ids)
    size += 8 * sum(len(trace or ()) for trace in traces)
    return request_bytes + size + 256


class CallLog:
    """The records since the last :meth:`drain`, oldest arrival first, under two bounds.

    Past ``max_bytes`` a record keeps its facts but loses its observation and
    completion (``truncated``); past ``max_records`` a record is not kept, and
    :attr:`dropped` counts it (with one warning), so the loss is never silent.

    Args:
        max_records: Most records kept.
        max_bytes: Most bytes (see :func:`weight`) of observations and completions kept.
    """

    def __init__(self, max_records: int, max_bytes: int) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.dropped = 0
        self._calls: list[ModelCall] = []
        self._bytes = 0

    def add(self, call: ModelCall, request_bytes: int) -> None:
        """Keep ``call``, whose request's body had ``request_bytes`` (see :func:`weight`)."""
        size = weight(request_bytes, call.completion)
        if len(self._calls) >= self.max_records:
            if not self.dropped:
                logger.warning(
                    "model endpoint: %d records kept, the limit; drop them with drain()",
                    self.max_records,
                )
            self.dropped += 1
            return
        if self._bytes + size > self.max_bytes:
            call = replace(call, observation=None, completion=None, truncated=True)
            size = 256
        self._bytes += size
        bisect.insort(self._calls, call, key=lambda c: c.seq)

    def records(self) -> list[ModelCall]:
        """The records kept (not consumed)."""
        return list(self._calls)

    def drain(self) -> list[ModelCall]:
        """The records kept; forgets them (and the count of dropped ones)."""
        out, self._calls, self._bytes, self.dropped = self._calls, [], 0, 0
        return out


@dataclass(frozen=True, eq=False)
class CallKey:
    """What tells a harness's retry from a new call, without hashing whole bodies.

    ``cheap`` (the path, Gemini's streamed and unstreamed paths as one, and the
    conversation's length) picks the candidates; the bodies themselves decide, compared
    as parsed values. Bodies of one conversation share their parsed prefix
    (``RequestReader``), so comparing a retry with its call is mostly identity checks.

    Attributes:
        cheap: ``(path, conversation length)``: equal for a call and its retries.
        body: The request body as parsed.
    """

    cheap: tuple[str, int]
    body: dict[str, Any]

    @classmethod
    def of(cls, path: str, request: ModelRequest) -> CallKey:
        """The key of ``request``, received on ``path``."""
        path = path.replace(":streamGenerateContent", ":generateContent")
        talk = request.body.get(CONVERSATION_KEYS.get(request.api, ""))
        length = len(talk) if isinstance(talk, list | str) else -1
        return cls((path, length), request.body)

    def matches(self, other: CallKey, conversation_only: bool) -> bool:
        """``other`` is the same call: its body bar ``stream``/``stream_options`` (a
        streamed call retried unstreamed, as Claude Code's fallback does, keeps it), or
        with ``conversation_only`` (an SDK retry: ``x-stainless-retry-count`` > 0) only
        what holds the conversation (messages, system, tools, ...), so a retry that also
        changed a token limit still joins its call."""
        if self.cheap != other.cheap:
            return False
        mine, theirs = self.body, other.body
        if conversation_only:
            names: Iterable[str] = _CONVERSATION
        else:
            names = (mine.keys() | theirs.keys()) - _STREAM_KEYS
        for name in names:
            if name not in mine or name not in theirs:
                if name in mine or name in theirs:
                    return False
            elif mine[name] is not theirs[name] and mine[name] != theirs[name]:
                return False
        return True


@dataclass(frozen=True)
class Answered:
    """What re-writes an answer byte for byte: the completion, its wire usage and ids."""

    completion: Completion
    usage: Usage
    answer_id: str
    created: int
    record_seq: int


class ReplayTable:
    """Recently answered calls by :class:`CallKey`, least recently used dropped first.

    Args:
        max_entries: Most answers remembered.
        max_bytes: Most bytes remembered (see :func:`weight`: the request, whose body an
            entry keeps for comparing, and the completion).
    """

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._table: OrderedDict[CallKey, tuple[Answered, int]] = OrderedDict()
        self._by_cheap: dict[tuple[str, int], list[CallKey]] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._table)

    def put(self, key: CallKey, answer: Answered, request_bytes: int = 0) -> None:
        """Remember ``answer`` under ``key`` (its request's body had ``request_bytes``)."""
        size = weight(request_bytes, answer.completion)
        if size > self.max_bytes:
            return
        self._pop(key)
        self._table[key] = (answer, size)
        self._by_cheap.setdefault(key.cheap, []).append(key)
        self._bytes += size
        while self._table and (len(self._table) > self.max_entries or self._bytes > self.max_bytes):
            self._pop(next(iter(self._table)))

    def get(self, key: CallKey, conversation_only: bool = False) -> Answered | None:
        """The answer to the newest call ``key`` matches (now the most recently used)."""
        for kept in reversed(self._by_cheap.get(key.cheap, ())):
            if key.matches(kept, conversation_only):
                self._table.move_to_end(kept)
                return self._table[kept][0]
        return None

    def clear(self) -> None:
        """Forget everything (a new episode)."""
        self._table.clear()
        self._by_cheap.clear()
        self._bytes = 0

    def _pop(self, key: CallKey) -> None:
        found = self._table.pop(key, None)
        if found is None:
            return
        self._bytes -= found[1]
        same = self._by_cheap[key.cheap]
        same.remove(key)
        if not same:
            del self._by_cheap[key.cheap]


class Lapses:
    """The calls that timed out since the last answer was delivered: a count, and the
    request ids of the first :attr:`KEPT` of them (oldest first)."""

    #: Most request ids kept (the count goes on).
    KEPT = 16

    def __init__(self) -> None:
        self.count = 0
        self.ids: list[str] = []

    def add(self, request_id: str) -> None:
        """Count one more call that timed out."""
        self.count += 1
        if len(self.ids) < self.KEPT:
            self.ids.append(request_id)

    def clear(self) -> None:
        """Start again (an answer was delivered, or a new episode began)."""
        self.count = 0
        self.ids.clear()
