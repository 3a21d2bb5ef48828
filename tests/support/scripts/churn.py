"""A harness's stand-in that changes its tree while a fork copies it (``support.churn``).

``python churn.py ROOT OUTSIDE GROW_BYTES [TMP_FILES]`` lays out ``ROOT`` (directories
``swap0``... of 10 files, ``tmp/`` of TMP_FILES files (20), an empty ``grow.bin``),
prints ``churning`` and
then, over and over until it is killed: each ``swap*`` directory trades places with a
link to ``OUTSIDE`` in one atomic step (``renameat2(RENAME_EXCHANGE)``, so a copy that
saw a directory may open a link), 21 times; the files of ``tmp/`` are deleted and
written again; ``grow.bin`` grows by GROW_BYTES; the swaps go back, 21 times;
``grow.bin`` is emptied.

``python churn.py --agent OUTSIDE GROW_BYTES [TMP_FILES]`` is a line-protocol harness that can fork
(its ready line says ``"fork": true``): it answers each message ``echo: <message>``, and
after its first answer churns its working directory (its workspace) as above, from a
thread, for as long as it runs. A forked one (``GYM_HARNESS_FORKED_FROM`` set) only answers.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading

AT_FDCWD = -100
RENAME_EXCHANGE = 2
FLIPS = 21  # odd: a round leaves each directory's place to the link, the next gives it back
SWAPS = 8


def lay_out(root: str, files: int) -> None:
    for n in range(SWAPS):
        os.makedirs(os.path.join(root, f"swap{n}"))
        for m in range(10):
            with open(os.path.join(root, f"swap{n}", f"s{m}"), "wb") as out:
                out.write(b"s" * 100)
    os.makedirs(os.path.join(root, "tmp"))
    write_tmp(os.path.join(root, "tmp"), files)
    with open(os.path.join(root, "grow.bin"), "wb"):
        pass


def write_tmp(tmp: str, files: int) -> None:
    for n in range(files):
        with open(os.path.join(tmp, f"t{n}"), "wb") as out:
            out.write(b"t" * 100)


def churn(root: str, outside: str, grow_bytes: int, files: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    pairs = []
    for n in range(SWAPS):
        place = os.path.join(root, f"swap{n}")
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

    while True:
        flip()
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        write_tmp(tmp, files)
        with open(grow, "ab") as out:
            out.write(chunk)
        flip()
        os.truncate(grow, 0)


def agent(outside: str, grow_bytes: int, files: int) -> None:
    def emit(obj: dict[str, object]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    emit({"type": "ready", "fork": True})
    churning = "GYM_HARNESS_FORKED_FROM" in os.environ  # a fork's child only answers
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("type") != "message":
            continue
        if not churning:
            lay_out(".", files)
            work = (".", outside, grow_bytes, files)
            threading.Thread(target=churn, args=work, daemon=True).start()
            churning = True
        emit({"type": "turn_complete", "response": f"echo: {message['content']}"})


def main() -> None:
    files = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    if sys.argv[1] == "--agent":
        agent(sys.argv[2], int(sys.argv[3]), files)
        return
    root, outside, grow_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    lay_out(root, files)
    print("churning", flush=True)
    churn(root, outside, grow_bytes, files)


if __name__ == "__main__":
    main()
