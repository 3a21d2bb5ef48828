"""The seccomp filter a confined harness runs under: what it refuses, why, and its program.

Loaded by ``confine`` by its file path (the keeper runs as ``python -I -S``): built-in
modules only, ``struct`` on first use. :func:`program` assembles the classic BPF program
``confine.prepare`` hands to the kernel; ``confine.apply`` loads it last.
"""

from __future__ import annotations

TYPE_CHECKING = False  # no typing import at run time

__all__ = ["ARCHES", "NUMBERS", "SECCOMP_DENIED", "SECCOMP_WHY", "program"]

_EPERM, _ENOSYS = 1, 38
#: os.uname().machine -> (AUDIT_ARCH_*, its column in NUMBERS).
ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}
# seccomp BPF (linux/filter.h, linux/seccomp.h). struct seccomp_data: nr, arch, then
# args[i] at 16 + 8 i, of which the filter reads the low 32 bits (little-endian).
_LD_W_ABS, _JEQ, _JGE, _JSET, _AND, _RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
_NR, _ARCH, _ARG0, _ARG1, _ARG2, _ARG3 = 0, 4, 16, 24, 32, 40
_RET_KILL_PROCESS, _RET_ERRNO, _RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_SECCOMP_GET_ACTION_AVAIL, _X32_BIT = 2, 0x40000000
_AF_UNIX, _AF_INET, _AF_INET6, _AF_NETLINK, _SOCK_STREAM, _IPPROTO_TCP = 1, 2, 10, 16, 1, 6
_MSG_FASTOPEN = 0x20000000
_CLONE_NEW = 0x7E020000  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET (NEWTIME: clone3)

#: Why the seccomp filter refuses each call (space-separated names, then the answer and
#: its reason). Every other call is allowed; another architecture's calls kill the
#: process (their numbers mean other calls), and x32 numbers on x86_64 get EPERM.
SECCOMP_WHY: tuple[tuple[str, str], ...] = (
    ("socket", "EPERM unless AF_UNIX, AF_NETLINK, or AF_INET/AF_INET6 SOCK_STREAM with "
     "protocol 0 or IPPROTO_TCP: no UDP, ICMP, raw or packet socket (Landlock covers TCP "
     "only), no MPTCP or SCTP (they pass its TCP rules), no other family (vsock reaches a "
     "VM's host; AF_ALG, RDS ... are kernel attack surface)"),
    ("sendto sendmsg sendmmsg", "EPERM with MSG_FASTOPEN: a TCP connect Landlock misses"),
    ("ioctl", "EPERM for TIOCSTI and TIOCLINUX: typing input into a terminal (any terminal "
     "the harness holds, its own included) runs commands as whoever reads it"),
    ("clone", "EPERM with a CLONE_NEW* flag: a user namespace hands back every capability"),
    ("clone3", "ENOSYS: its flags sit in memory a filter cannot read; libc falls back to "
     "clone, as in containers"),
    ("unshare setns", "EPERM: namespaces, as for clone"),
    ("ptrace process_vm_readv process_vm_writev", "EPERM: reading or steering other "
     "processes, inside the sandbox too (Landlock covers those outside it)"),
    ("bpf perf_event_open userfaultfd", "EPERM: kernel attack surface no harness needs"),
    ("io_uring_setup io_uring_enter io_uring_register", "EPERM: io_uring opens files and "
     "sockets where seccomp never sees them"),
    ("mount umount2 pivot_root move_mount open_tree open_tree_attr fsopen fsconfig "
     "fsmount fspick mount_setattr", "EPERM: the tree stays the one Landlock's rules see"),
    ("kexec_load kexec_file_load init_module finit_module delete_module", "EPERM: kernel code"),
    ("keyctl add_key request_key", "EPERM: keyrings are per user, shared with every "
     "process of the uid, sandboxed or not"),
)  # fmt: skip
#: The calls the seccomp filter refuses (some only with the arguments SECCOMP_WHY names).
SECCOMP_DENIED: tuple[str, ...] = tuple(" ".join(names for names, _ in SECCOMP_WHY).split())
_BY_ARGUMENT = ("socket", "sendto", "sendmsg", "sendmmsg", "clone", "clone3", "ioctl")
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C

# fmt: off
#: Syscall numbers (x86_64, aarch64); from io_uring (425) on both tables agree.
NUMBERS = {
    "ioctl": (16, 29), "socket": (41, 198), "sendto": (44, 206), "sendmsg": (46, 211),
    "sendmmsg": (307, 269),
    "clone": (56, 220), "clone3": (435, 435), "unshare": (272, 97), "setns": (308, 268),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "mount": (165, 40), "umount2": (166, 39),
    "pivot_root": (155, 41), "move_mount": (429, 429), "open_tree": (428, 428),
    "open_tree_attr": (467, 467), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "keyctl": (250, 219),
    "add_key": (248, 217), "request_key": (249, 218), "seccomp": (317, 277),
}
# fmt: on


def program(machine: str, cache: dict[str, object]) -> bytes:
    """The seccomp filter of :data:`SECCOMP_WHY` for ``machine``, built once (in ``cache``)."""
    cached = cache.get(f"bpf:{machine}")
    if isinstance(cached, bytes):
        return cached
    audit_arch, column = ARCHES[machine]
    nrs = {name: numbers[column] for name, numbers in NUMBERS.items()}
    code: list[str | tuple[int | str, ...]] = [(_LD_W_ABS, _ARCH), (_JEQ, audit_arch, 0, "kill")]
    code.append((_LD_W_ABS, _NR))
    if machine == "x86_64":
        code.append((_JGE, _X32_BIT, "eperm", 0))
    # Where each call the filter looks at goes; a binary search over their numbers, so
    # the kernel's walk of the program for each call number (the allow cache it builds
    # when the filter loads) and each call's own walk take a few steps, not one per name.
    where = {nrs[name]: "eperm" for name in SECCOMP_DENIED if name not in _BY_ARGUMENT}
    where.update({nrs["clone3"]: "enosys", nrs["socket"]: "socket", nrs["clone"]: "clone",
                  nrs["ioctl"]: "ioctl", nrs["sendmsg"]: "flags_in_arg2",
                  nrs["sendto"]: "flags_in_arg3", nrs["sendmmsg"]: "flags_in_arg3"})  # fmt: skip
    code += _search(sorted(where.items()), "allow", [0])
    # fmt: off
    code += [
        "socket", (_LD_W_ABS, _ARG0),
        (_JEQ, _AF_UNIX, "allow", 0), (_JEQ, _AF_NETLINK, "allow", 0),
        (_JEQ, _AF_INET, "inet", 0), (_JEQ, _AF_INET6, "inet", "eperm"),
        "inet", (_LD_W_ABS, _ARG1), (_AND, 0xF),  # the type less SOCK_NONBLOCK/CLOEXEC
        (_JEQ, _SOCK_STREAM, 0, "eperm"),
        (_LD_W_ABS, _ARG2), (_JEQ, 0, "allow", 0), (_JEQ, _IPPROTO_TCP, "allow", "eperm"),
        "clone", (_LD_W_ABS, _ARG0), (_JSET, _CLONE_NEW, "eperm", "allow"),
        "ioctl", (_LD_W_ABS, _ARG1),
        (_JEQ, _TIOCSTI, "eperm", 0), (_JEQ, _TIOCLINUX, "eperm", "allow"),
        "flags_in_arg2", (_LD_W_ABS, _ARG2), (_JSET, _MSG_FASTOPEN, "eperm", "allow"),
        "flags_in_arg3", (_LD_W_ABS, _ARG3), (_JSET, _MSG_FASTOPEN, "eperm", "allow"),
        "allow", (_RET, _RET_ALLOW), "eperm", (_RET, _RET_ERRNO | _EPERM),
        "enosys", (_RET, _RET_ERRNO | _ENOSYS), "kill", (_RET, _RET_KILL_PROCESS),
    ]
    # fmt: on
    built = cache[f"bpf:{machine}"] = _assemble(code)
    return built


def _search(
    calls: list[tuple[int, str]], otherwise: str, serial: list[int]
) -> list[str | tuple[int | str, ...]]:
    """Jump to each call number's label, else to ``otherwise``: a binary search on the
    number (``JGE``) down to runs of three at most, compared one by one (``JEQ``)."""
    if len(calls) <= 3:
        *first, (last, to) = calls
        return [*((_JEQ, nr, label, 0) for nr, label in first), (_JEQ, last, to, otherwise)]
    half = len(calls) // 2
    serial[0] += 1
    upper = f"search{serial[0]}"
    below = _search(calls[:half], otherwise, serial)
    return [(_JGE, calls[half][0], upper, 0), *below, upper,
            *_search(calls[half:], otherwise, serial)]  # fmt: skip


def _assemble(code: list[str | tuple[int | str, ...]]) -> bytes:
    """Pack ``(op, k[, jump_if_true, jump_if_false])`` (a jump: a label's str, or 0) as BPF."""
    labels: dict[int | str, int] = {}
    pc = 0
    for item in code:
        if isinstance(item, str):
            labels[item] = pc
        else:
            pc += 1
    import struct

    pack, out = struct.pack, list[bytes]()
    for item in code:
        if not isinstance(item, str):
            op, k, *jumps = item
            offsets = [0 if to == 0 else labels[to] - len(out) - 1 for to in jumps or (0, 0)]
            out.append(pack("HBBI", op, *offsets, k))
    return b"".join(out)
