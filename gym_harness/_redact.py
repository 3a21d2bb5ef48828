"""Redactor: takes secrets out of a byte stream that arrives in pieces.

The model proxy relays an upstream's answer to the harness piece by piece and records
it; the real API key and the proxy token must reach neither, even when an upstream
echoes a request header in its answer and the secret straddles two socket reads.
A piece is passed on at once unless it ends with what may be the start of a secret;
only then are those few bytes held back until the next piece (or the end) decides.
SSE pieces end with a newline, which no secret contains, so a stream is never delayed.

Threads: a Redactor is immutable; any thread may use it.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["MASK", "MIN_SECRET", "Redactor"]

#: What a secret is replaced with.
MASK = b"[redacted]"
#: Shorter values are not treated as secrets: masking every "a" would garble answers.
MIN_SECRET = 8


class Redactor:
    """Replace every occurrence of the secrets, in bytes or in a stream, with :data:`MASK`.

    Immutable, so one serves every answer of a token's episode; a stream's state is the
    ``held`` bytes its caller passes from one :meth:`split` to the next.

    Args:
        secrets: The values to take out (those shorter than :data:`MIN_SECRET` are ignored).
    """

    __slots__ = ("_alphabet", "_secrets")

    def __init__(self, secrets: Iterable[str | bytes | None]) -> None:
        found = {s.encode() if isinstance(s, str) else s for s in secrets if s}
        # Longest first: a secret that contains another is masked whole.
        self._secrets = tuple(sorted((s for s in found if len(s) >= MIN_SECRET), key=len)[::-1])
        self._alphabet = frozenset(b"".join(self._secrets))

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def scrub(self, data: bytes) -> bytes:
        """``data`` with every whole secret masked."""
        for secret in self._secrets:
            if secret in data:
                data = data.replace(secret, MASK)
        return data

    def scrub_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """Header values with every secret masked (one search when there is none)."""
        joined = b"\n".join(v for _, v in headers)
        if self.scrub(joined) is joined:  # nothing found: nothing copied
            return headers
        return [(k, self.scrub(v)) for k, v in headers]

    def split(self, data: bytes) -> tuple[bytes, bytes]:
        """``(safe, held)``: the part of a stream's next bytes that may be passed on now,
        and the tail that may be the start of a secret. Call it with the previous
        ``held`` prepended to the next piece; at the stream's end ``held`` is passed on
        as it is (it was no secret after all).
        """
        for secret in self._secrets:
            if secret in data:
                data = data.replace(secret, MASK)
        # A secret's start can end the data only if its last byte is one secrets use.
        if not data or data[-1] not in self._alphabet:
            return data, b""
        cut = self._partial_start(data)
        return data[:cut], data[cut:]

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
