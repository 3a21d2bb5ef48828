"""Redactor: takes secrets out of a byte stream that arrives in pieces.

The model proxy relays an upstream's answer to the harness piece by piece and records
it; the real API key and the proxy token must reach neither, even when an upstream
echoes a request header in its answer and the secret straddles two socket reads.
A piece is passed on at once unless it ends with what may be the start of a secret;
only then are those few bytes held back until the next piece (or the end) decides.
SSE pieces end with a newline, which no secret contains, so a stream is never delayed.

Threads: one Redactor per answer, used by one thread.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["MASK", "MIN_SECRET", "Redactor"]

#: What a secret is replaced with.
MASK = b"[redacted]"
#: Shorter values are not treated as secrets: masking every "a" would garble answers.
MIN_SECRET = 8


class Redactor:
    """Replace every occurrence of the secrets in a stream of byte pieces with :data:`MASK`.

    Args:
        secrets: The values to take out (those shorter than :data:`MIN_SECRET` are ignored).
    """

    __slots__ = ("_alphabet", "_held", "_secrets")

    def __init__(self, secrets: Iterable[str | bytes | None]) -> None:
        found = {s.encode() if isinstance(s, str) else s for s in secrets if s}
        # Longest first: a secret that contains another is masked whole.
        self._secrets = tuple(sorted((s for s in found if len(s) >= MIN_SECRET), key=len)[::-1])
        self._alphabet = frozenset(b"".join(self._secrets))
        self._held = b""

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def scrub(self, data: bytes) -> bytes:
        """``data`` with every whole secret masked (no state kept)."""
        for secret in self._secrets:
            if secret in data:
                data = data.replace(secret, MASK)
        return data

    def feed(self, piece: bytes) -> bytes:
        """The part of the stream so far that is safe to pass on (may be ``b""``)."""
        data = self.scrub(self._held + piece if self._held else piece)
        # A secret's start can end the data only if its last byte is one secrets use.
        cut = self._partial_start(data) if data and data[-1] in self._alphabet else len(data)
        self._held = data[cut:]
        return data[:cut] if self._held else data

    def flush(self) -> bytes:
        """What was held back, at the end of the stream (it was no secret after all)."""
        held, self._held = self._held, b""
        return held

    def _partial_start(self, data: bytes) -> int:
        """Where the longest tail of ``data`` that begins a secret starts (else ``len``)."""
        n = cut = len(data)
        for secret in self._secrets:
            start = max(0, n - len(secret) + 1)
            i = data.find(secret[:1], start)
            while 0 <= i < cut:
                if secret.startswith(data[i:]):
                    cut = i
                    break
                i = data.find(secret[:1], i + 1)
        return cut
