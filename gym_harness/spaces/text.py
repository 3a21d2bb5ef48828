"""UnicodeText: a gymnasium space of arbitrary Unicode strings.

``gymnasium.spaces.Text`` keeps an explicit character set and checks every
character against it; a charset spanning all of Unicode costs seconds and
hundreds of MB to build. A harness's messages and replies are free text, so
this space describes "any ``str`` of bounded length that is valid Unicode"
with a length check and one encode, and samples without any table.

The vector-env helpers of gymnasium dispatch on the space type; the ones that
have no generic fallback (``create_empty_array``, ``batch_differing_spaces`` and
the three shared-memory functions) are registered for ``UnicodeText`` at the end
of this module, so ``SyncVectorEnv`` and ``AsyncVectorEnv`` accept it as they are
(shared memory on or off; see ``gym_harness.spaces.memory`` for how text of any
length fits gymnasium's fixed shared buffers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from copy import deepcopy
from typing import Any

import numpy as np
from gymnasium.spaces import Space, Tuple
from gymnasium.vector.utils import (
    batch_differing_spaces,
    create_empty_array,
    create_shared_memory,
    read_from_shared_memory,
    write_to_shared_memory,
)

from gym_harness.spaces.memory import TextBatchView, TextSegments

__all__ = ["UnicodeText"]

# Printable ASCII plus newline and tab: what most messages are made of.
_ASCII_POOL = np.array([0x09, 0x0A, *range(0x20, 0x7F)], dtype=np.int64)
_ASCII_SHARE = 0.5

# Non-ASCII code points come from these half-open ranges, none of which holds a
# surrogate (U+D800..U+DFFF): common scripts, CJK and emoji most of the time, and
# the whole of the BMP and the astral planes some of the time so nothing is out of reach.
_BLOCKS: tuple[tuple[int, int, float], ...] = (
    (0x00A0, 0x0250, 0.20),  # Latin-1 supplement, Latin extended A/B
    (0x0370, 0x0500, 0.10),  # Greek, Cyrillic
    (0x4E00, 0xA000, 0.20),  # CJK unified ideographs
    (0x1F300, 0x1FB00, 0.15),  # pictographs and emoji
    (0x0080, 0xD800, 0.10),  # anything in the BMP below the surrogates
    (0xE000, 0xFFFE, 0.05),  # ... and above them (U+FFFE/U+FFFF are noncharacters)
    (0x10000, 0x110000, 0.20),  # any astral code point
)
_BLOCK_STARTS = np.array([start for start, _, _ in _BLOCKS], dtype=np.int64)
_BLOCK_SPANS = np.array([stop - start for start, stop, _ in _BLOCKS], dtype=np.int64)
_BLOCK_WEIGHTS = np.array([weight for _, _, weight in _BLOCKS], dtype=np.float64)
_BLOCK_WEIGHTS /= _BLOCK_WEIGHTS.sum()


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


class UnicodeText(Space[str]):
    """Any ``str`` of ``min_length`` to ``max_length`` code points with no lone surrogate.

    Unlike ``gymnasium.spaces.Text`` there is no character set: every Unicode
    scalar value is allowed, membership is a length check plus one encode, and
    the space pickles to a few hundred bytes. It is not flattenable to a numpy
    array (``is_np_flattenable`` is ``False``).

    Args:
        max_length: Longest allowed string, in code points (inclusive).
        min_length: Shortest allowed string, in code points (inclusive).
        seed: Seed or generator for ``sample``.

    Raises:
        TypeError: A length is not an integer.
        ValueError: ``min_length`` is negative or larger than ``max_length``.

    Example:
        >>> space = UnicodeText(16, seed=0)
        >>> space.contains("héllo, 世界")
        True
        >>> space.contains("\\ud800")  # a lone surrogate is not valid Unicode
        False
        >>> space.sample() in space
        True
    """

    def __init__(
        self,
        max_length: int,
        min_length: int = 0,
        *,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        if not _is_int(max_length) or not _is_int(min_length):
            raise TypeError(
                "UnicodeText expects integer lengths, got "
                f"max_length={max_length!r}, min_length={min_length!r}"
            )
        if min_length < 0:
            raise ValueError(f"UnicodeText min_length must be >= 0, got {min_length}")
        if min_length > max_length:
            raise ValueError(
                f"UnicodeText min_length ({min_length}) must not exceed max_length ({max_length})"
            )
        self.max_length = int(max_length)
        self.min_length = int(min_length)
        super().__init__(dtype=str, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        """Always ``False``: free text has no fixed-size numeric form."""
        return False

    def contains(self, x: Any) -> bool:
        """Return whether ``x`` is a ``str`` within the length bounds and valid Unicode."""
        if not isinstance(x, str) or not self.min_length <= len(x) <= self.max_length:
            return False
        if x.isascii():
            return True
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate
            return False
        return True

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> str:
        """Return a random string from the space, using ``self.np_random``.

        About half the characters are printable ASCII (with newline and tab);
        the rest are drawn from common scripts, CJK, emoji, and anywhere in Unicode.
        The length is log-uniform between the bounds (every length can occur, short
        ones most often: a 16M-character space samples messages, not megabytes)
        unless fixed by ``mask``.

        Args:
            mask: ``None``, or ``(length, None)`` to fix the length as ``Text`` does.
                A character mask is not supported (there is no character list).
            probability: Must be ``None``; per-character probabilities are not supported.

        Returns:
            A string that ``contains`` accepts.

        Raises:
            ValueError: ``probability`` or a character mask was given, or the
                length is outside the bounds.
        """
        if probability is not None:
            raise ValueError("UnicodeText.sample does not support a probability mask")
        length = self._length_from_mask(mask)
        rng = self.np_random
        if length is None:
            span = self.max_length - self.min_length + 1
            offset = int(np.exp(rng.uniform(0, np.log(span + 1)))) - 1
            length = self.min_length + min(offset, span - 1)
        if length == 0:
            return ""
        ascii_mask = rng.random(length) < _ASCII_SHARE
        codes = np.empty(length, dtype=np.int64)
        n_ascii = int(ascii_mask.sum())
        codes[ascii_mask] = _ASCII_POOL[rng.integers(0, len(_ASCII_POOL), n_ascii)]
        blocks = rng.choice(len(_BLOCKS), size=length - n_ascii, p=_BLOCK_WEIGHTS)
        codes[~ascii_mask] = _BLOCK_STARTS[blocks] + rng.integers(0, _BLOCK_SPANS[blocks])
        return codes.astype("<u4").tobytes().decode("utf-32-le")

    def _length_from_mask(self, mask: Any | None) -> int | None:
        if mask is None:
            return None
        if not isinstance(mask, tuple) or len(mask) != 2 or mask[1] is not None:
            raise ValueError(
                f"UnicodeText.sample mask must be None or (length, None), got {mask!r}"
            )
        length = mask[0]
        if length is None:
            return None
        if not _is_int(length) or not self.min_length <= length <= self.max_length:
            raise ValueError(
                f"UnicodeText.sample length must be an integer in "
                f"[{self.min_length}, {self.max_length}], got {length!r}"
            )
        return int(length)

    def to_jsonable(self, sample_n: Iterable[str]) -> list[str]:
        """Return the batch as a list of plain ``str`` (JSON strings already)."""
        return [str(sample) for sample in sample_n]

    def from_jsonable(self, sample_n: list[Any]) -> list[str]:
        """Inverse of ``to_jsonable``."""
        return [str(sample) for sample in sample_n]

    def __repr__(self) -> str:
        return f"UnicodeText(max_length={self.max_length}, min_length={self.min_length})"

    def __eq__(self, other: object, /) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.max_length == other.max_length
            and self.min_length == other.min_length
        )

    def __hash__(self) -> int:
        return hash((UnicodeText, self.max_length, self.min_length))


# The vector-env helpers with no fallback for custom spaces. A batch of strings
# is a tuple of strings, as for gymnasium's own Text space.
@create_empty_array.register(UnicodeText)
def _create_empty_array_unicode_text(
    space: UnicodeText, n: int = 1, fn: Callable[..., Any] = np.zeros
) -> tuple[str, ...]:
    return tuple(" " * space.min_length for _ in range(n))


# Dispatched on the type of the first space of the sequence (gymnasium looks it up itself).
@batch_differing_spaces.register(UnicodeText)
def _batch_differing_unicode_text(spaces: Sequence[UnicodeText]) -> Tuple:  # type: ignore[misc]
    return Tuple([deepcopy(space) for space in spaces], seed=deepcopy(spaces[0].np_random))


# AsyncVectorEnv(shared_memory=True): one growable segment per sub-env (see _text_memory).
# ``ctx`` is gymnasium's multiprocessing context; the segments need none of its objects.
@create_shared_memory.register(UnicodeText)
def _create_shared_memory_unicode_text(
    space: UnicodeText, n: int = 1, ctx: Any = None
) -> TextSegments:
    return TextSegments(n)


@read_from_shared_memory.register(UnicodeText)
def _read_from_shared_memory_unicode_text(
    space: UnicodeText, shared_memory: TextSegments, n: int = 1
) -> TextBatchView:
    return TextBatchView(shared_memory)


@write_to_shared_memory.register(UnicodeText)
def _write_to_shared_memory_unicode_text(
    space: UnicodeText, index: int, value: str, shared_memory: TextSegments
) -> None:
    if not isinstance(value, str):
        raise TypeError(f"a UnicodeText observation must be a str, got {type(value)!r}")
    shared_memory.write(index, value)
