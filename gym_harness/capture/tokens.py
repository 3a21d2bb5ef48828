"""Asking an OpenAI-compatible upstream for token ids, and keeping them from the harness.

With ``capture_tokens=True`` the proxy adds to each Chat Completions request what vLLM
and SGLang read as a request for the engine's own tokens: ``"return_token_ids": true``
(the answer then carries ``prompt_token_ids`` at its top level, in a stream's first
chunk, and ``token_ids`` in each choice or delta) and ``"logprobs": true`` (each choice's
``logprobs.content[i].logprob``). The record keeps the answer as the upstream sent it;
:class:`TokenStripper` takes out of the harness's copy what the harness did not ask for
itself, so its client sees an ordinary answer. A hosted API that does not know the
fields ignores them, and the record is then text-level.

Threads: the proxy's event loop; a :class:`TokenStripper` belongs to one exchange.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gym_harness.utils import bounded_json

__all__ = ["MAX_EVENT_BYTES", "MAX_HELD_BYTES", "TokenStripper", "ask_for_tokens", "set_sampling"]

#: Most bytes a stripper holds back of a JSON answer (it is held whole); past it the rest
#: of the answer goes to the harness as the upstream sent it.
MAX_HELD_BYTES = 32 * 1024 * 1024
#: Most bytes it holds back of one SSE event (a chunk is a few hundred bytes).
MAX_EVENT_BYTES = 1024 * 1024
#: The request fields that ask for tokens, and the value that asks.
_ASK = (("return_token_ids", True), ("logprobs", True))


def ask_for_tokens(content: bytes) -> tuple[bytes, tuple[str, ...]]:
    """A Chat Completions body that asks for token ids and logprobs.

    Returns:
        The body to send upstream, and the fields this added (none when the harness had
        asked itself, or the body is not a JSON object: it then goes up as it came).
    """
    try:
        body = bounded_json.loads(content)  # the harness wrote it: bounded
    except ValueError:
        return content, ()
    if not isinstance(body, dict):
        return content, ()
    added = tuple(name for name, value in _ASK if body.get(name) is not value)
    if not added:
        return content, ()
    body.update({name: value for name, value in _ASK})
    return json.dumps(body).encode(), added


def set_sampling(content: bytes, sampling: Mapping[str, float]) -> bytes:
    """A Chat Completions body whose sampling fields are ``sampling``'s (a trainer's policy:
    the upstream samples as the trainer scores), over whatever the harness set.

    A body that is not a JSON object goes up as it came.
    """
    try:
        body = bounded_json.loads(content)  # the harness wrote it: bounded
    except ValueError:
        return content
    if not isinstance(body, dict) or all(body.get(k) == v for k, v in sampling.items()):
        return content
    body.update(sampling)
    return json.dumps(body).encode()


class TokenStripper:
    """Takes the fields ``ask_for_tokens`` added out of an answer on its way to the harness.

    Feed it the answer's body as it arrives; it returns what to send on. A JSON answer
    is held whole (it is one object) and rewritten at :meth:`end`; a stream is rewritten
    event by event, each sent on as soon as its blank line arrives. Anything it cannot
    read (not JSON, ``[DONE]``, more than ``max_held`` bytes) is sent as it came.

    Args:
        added: The fields the proxy added to the request.
        streamed: The answer is a server-sent event stream.
        max_held: Most bytes held back at once (default :data:`MAX_EVENT_BYTES` for a
            stream, :data:`MAX_HELD_BYTES` for a JSON answer).
    """

    def __init__(self, added: tuple[str, ...], streamed: bool, max_held: int | None = None) -> None:
        self.ids = "return_token_ids" in added
        self.logprobs = "logprobs" in added
        self.streamed = streamed
        self.max_held = max_held or (MAX_EVENT_BYTES if streamed else MAX_HELD_BYTES)
        self._parts: list[bytes] = []  # held back, in order (joined once: no quadratic copy)
        self._size = 0
        self._passing = False  # gave up (too large): the rest goes through as it is

    def feed(self, data: bytes) -> bytes:
        """What of ``data`` (and the bytes held before it) can go to the harness now."""
        if self._passing:
            return data
        self._hold(data)
        # An event can end only where a line does: without a newline, nothing to look for.
        out = self._events() if self.streamed and b"\n" in data else b""
        if self._size > self.max_held:
            self._passing = True
            out += self._release()
        return out

    def end(self) -> bytes:
        """The rest, at the answer's end."""
        held = self._release()
        if self._passing or not held:
            return held
        return self._event(held) if self.streamed else self._json(held)

    def _hold(self, data: bytes) -> None:
        self._parts.append(data)
        self._size += len(data)

    def _release(self) -> bytes:
        held = b"".join(self._parts)
        self._parts, self._size = [], 0
        return held

    def _events(self) -> bytes:
        """The complete events held, rewritten; the start of the next stays held."""
        held = self._release()
        events: list[bytes] = []
        while (cut := _event_end(held)) >= 0:
            events.append(self._event(held[:cut]))
            held = held[cut:]
        if held:
            self._hold(held)
        return b"".join(events)

    def _event(self, event: bytes) -> bytes:
        lines = event.split(b"\n")
        for i, line in enumerate(lines):
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload.startswith(b"{"):
                    lines[i] = b"data: " + self._json(payload) + line[len(line.rstrip(b"\r")) :]
        return b"\n".join(lines)

    def _json(self, raw: bytes) -> bytes:
        try:
            obj = bounded_json.loads(raw)
        except ValueError:
            return raw
        if not isinstance(obj, dict) or not self._strip(obj):
            return raw
        return json.dumps(obj, ensure_ascii=False).encode()

    def _strip(self, obj: dict[str, Any]) -> bool:
        changed = False
        if self.ids and "prompt_token_ids" in obj:
            del obj["prompt_token_ids"]
            changed = True
        choices = obj.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            if self.ids and "token_ids" in choice:
                del choice["token_ids"]
                changed = True
            if self.logprobs and choice.get("logprobs") is not None:
                choice["logprobs"] = None  # what an answer that was not asked for carries
                changed = True
        return changed


def _event_end(buf: bytes) -> int:
    """Where the first complete SSE event of ``buf`` ends (its blank line included), or -1."""
    ends = [i + len(sep) for sep in (b"\n\n", b"\r\n\r\n") if (i := buf.find(sep)) >= 0]
    return min(ends) if ends else -1
