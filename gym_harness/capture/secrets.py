"""The model proxy's secrets: the token swapped for the real key, and both kept from leaking.

On the way up, :func:`swap_credentials` checks the proxy token the harness presented and
puts the real key in its place. On the way down, a :class:`Redactor` masks both: the
proxy relays an upstream's answer to the harness piece by piece and records it, and
neither may get a secret, even when an upstream echoes a request header in its answer
and the secret straddles two socket reads.
A piece is passed on at once unless it ends with what may be the start of a secret;
only then are those few bytes held back until the next piece (or the end) decides.
SSE pieces end with a newline, which no secret contains, so a stream is never delayed.

Threads: everything here is immutable or pure; any thread may use it.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode

__all__ = ["MASK", "MIN_SECRET", "Redactor", "carries", "swap_credentials"]

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


_KEY_HEADERS = ("x-api-key", "x-goog-api-key")
# Hop-by-hop or rewritten by us; never copied between the two connections.
_SKIP_REQUEST = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "accept-encoding",
        "authorization",
        *_KEY_HEADERS,
    }
)


def swap_credentials(
    token: str, key: str | None, headers: list[tuple[str, str]], query: str, method: str, path: str
) -> tuple[list[tuple[str, str]], str, bool]:
    """Check the proxy token and put the real key where the harness put the token.

    Returns:
        The headers to send upstream (hop-by-hop ones and the harness's credential
        dropped, ``key`` added where the token was), the query likewise, and whether the
        request presented ``token`` (or is a connectivity probe that presents nothing).
    """
    presented: str | None = None
    out = [(k, v) for k, v in headers if k not in _SKIP_REQUEST]
    out.append(("accept-encoding", "identity"))  # keep the recorded bytes readable
    for name, value in headers:
        if name == "authorization" and value.lower().startswith("bearer "):
            presented = value[7:].strip()
            if key is not None:
                out.append(("authorization", f"Bearer {key}"))
        elif name in _KEY_HEADERS:
            presented = value.strip()
            if key is not None:
                out.append((name, key))
    if "key=" in query:
        pairs = parse_qsl(query, keep_blank_values=True)
        presented = next((v for k, v in pairs if k == "key"), presented)
        pairs = [(k, v) for k, v in pairs if k != "key"]
        if key is not None:
            pairs.append(("key", key))
        query = urlencode(pairs)
    if presented is None:  # connectivity probes (Claude Code's HEAD /) carry no key
        return out, query, method in ("HEAD", "GET") and path == "/"
    return out, query, hmac.compare_digest(presented.encode(), token.encode())


def carries(token: str, body: bytes, headers: list[tuple[str, str]], query: str) -> bool:
    """Whether a request on its way upstream holds the proxy token anywhere."""
    return token.encode() in body or token in query or any(token in value for _, value in headers)
