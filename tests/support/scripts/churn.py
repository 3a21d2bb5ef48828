"""A harness's stand-in that changes its tree while a fork copies it (``support.churn``).

Usage: ``python churn.py ROOT OUTSIDE GROW_BYTES``. Over and over, until it is killed:
each directory ``ROOT/swap*`` trades places with a link to ``OUTSIDE`` in one atomic
step (``renameat2(RENAME_EXCHANGE)``, so a copy that saw a directory may open a link),
21 times; the files of ``ROOT/tmp`` are deleted and written again; ``ROOT/grow.bin``
grows by GROW_BYTES; the swaps go back, 21 times; ``grow.bin`` is emptied. It prints
``churning`` once the first round is done.
"""

from __future__ import annotations

import ctypes
import os
import sys

AT_FDCWD = -100
RENAME_EXCHANGE = 2
FLIPS = 21  # odd: a round leaves each directory's place to the link, the next gives it back


def main() -> None:
    root, outside, grow_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    libc = ctypes.CDLL(None, use_errno=True)
    pairs = []
    for name in sorted(os.listdir(root)):
        if name.startswith("swap"):
            place = os.path.join(root, name)
            os.symlink(outside, place + ".link")
            pairs.append((place.encode(), (place + ".link").encode()))
    tmp, grow = os.path.join(root, "tmp"), os.path.join(root, "grow.bin")
    chunk = b"g" * grow_bytes

    def flip() -> None:
        for _ in range(FLIPS):
            for place, link in pairs:
                if libc.renameat2(AT_FDCWD, place, AT_FDCWD, link, RENAME_EXCHANGE) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, os.strerror(code))

    first = True
    while True:
        flip()
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        for n in range(20):
            with open(os.path.join(tmp, f"t{n}"), "wb") as out:
                out.write(b"t" * 100)
        with open(grow, "ab") as out:
            out.write(chunk)
        flip()
        os.truncate(grow, 0)
        if first:
            print("churning", flush=True)
            first = False


if __name__ == "__main__":
    main()
