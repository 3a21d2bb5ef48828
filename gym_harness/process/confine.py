"""Kernel confinement of one harness: Landlock, no-new-privs, capabilities, seccomp.

The keeper calls :func:`prepare` before it forks a harness (it opens the policy's paths
and builds the kernel objects: a Landlock ruleset fd and a packed seccomp program), and
:func:`apply` in the forked child just before ``execve``, where only system calls are
left to make. The keeper loads this file by path and runs as ``python -I -S``: it
imports built-in modules only, and ``ctypes`` and ``struct`` on first use.

What each layer enforces (the policy keys that ask for it in parentheses):

* no_new_privs (always; Landlock and seccomp need it): ``execve`` grants nothing, setuid
  bits and file capabilities are ignored.
* capabilities (``drop_caps``): bounding set emptied (when CAP_SETPCAP is held), ambient
  cleared, effective/permitted/inheritable zeroed: root execs with no capability.
* Landlock files (``read``/``write``/``devices``): open, execute, list, create, remove,
  rename/link (ABI 2), truncate (ABI 3), device ioctls (ABI 5) only beneath the granted
  paths. Every right the running ABI knows is handled: what is not granted is denied.
  With any ruleset, no ptrace of (nor ``/proc/<pid>/environ`` ... of) a process outside.
* Landlock TCP, ABI 4 (``connect``/``bind``): TCP connect and bind to the listed ports.
* Landlock scope, ABI 6 (``scope``): no signal to, nor connect to an abstract unix socket
  of, a process outside the sandbox (the keeper included).
* seccomp (``seccomp``): the calls of :data:`SECCOMP_WHY`.
* a mount namespace (``view``): the child sees only the paths it is granted, each at its
  own path (bound from the host, the links along the way re-made), a ``/dev`` of the
  devices it is granted by name, a private ``/dev/pts`` (a new devpts instance: its own
  terminals only) and a private ``/dev/shm`` (tmpfs, ``shm_mb`` large). A pathname unix
  socket outside the granted paths (a multiprocessing forkserver's, Ray's, a session
  bus) has no path there, so no ``connect`` reaches it; as root the namespace is the
  child's own, otherwise inside a user namespace of its own (uid and gid mapped to
  themselves).

What they do not enforce (kernel documentation, and measured here on Linux 6.18, ABI 7):

* Landlock leaves ``stat``, ``chmod``, ``chown``, ``utime``, ``setxattr``, ``chdir``,
  ``access`` and ``flock`` alone: root without capabilities still owns root's files and
  may ``chmod`` them. Run the harness as an unprivileged uid where that matters.
* TCP rules name ports, not addresses: an allowed port is allowed on every host. Only a
  network namespace makes the harness loopback-only.
* TCP rules see TCP only. MPTCP and SCTP sockets pass them (an MPTCP connect to a denied
  port succeeds), and so does TCP Fast Open (``sendto(MSG_FASTOPEN)`` connects without
  ``connect``): the seccomp filter refuses both. ``listen`` on an unbound socket takes an
  ephemeral port on every address without a ``bind`` for Landlock to check.
* Connecting to a pathname unix socket needs no right before ABI 9
  (``LANDLOCK_ACCESS_FS_RESOLVE_UNIX``, handled from that ABI on); only creating one does:
  the mount namespace (``view``) is what hides the sockets outside.
* Files and sockets open before :func:`apply` (the harness's pipes) are not checked.
* Landlock and seccomp bind the calling thread and what it starts later: call
  :func:`apply` in a single-threaded process (after ``fork``).
* seccomp sees syscall arguments, never memory they point to (hence ``clone3`` ENOSYS).
"""

from __future__ import annotations

import os
import stat  # already loaded by os

TYPE_CHECKING = False  # no typing import at run time
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["SECCOMP_DENIED", "SECCOMP_WHY", "VIEW_DEVICES", "Prepared", "apply",
           "bring_loopback_up", "prepare", "probe"]  # fmt: skip

# Landlock (linux/landlock.h); its syscalls are 444-446 on every architecture.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_ABI1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV, _FS_RESOLVE_UNIX = 1 << 13, 1 << 14, 1 << 15, 1 << 16
_FS_LATER = ((2, _FS_REFER), (3, _FS_TRUNCATE), (5, _FS_IOCTL_DEV), (9, _FS_RESOLVE_UNIX))
_FS_FILE = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_FS_READ = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
_FS_DEVICE = _FS_READ_FILE | _FS_WRITE_FILE | _FS_READ_DIR | _FS_TRUNCATE | _FS_IOCTL_DEV
_NET_BIND_TCP, _NET_CONNECT_TCP, _SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1, 1, 2

# prctl, capabilities, network interfaces, errno.
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, _PR_SET_DUMPABLE = 22, 2, 4
_CAP_VERSION_3, _CAP_SETPCAP = 0x20080522, 8
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_NEWNS = 0x10000000, 0x40000000, 0x00020000
# mount(2) flags, umount2, pivot_root (x86_64, aarch64).
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
#: Where the child builds its view (any directory: a tmpfs covers it in its own namespace).
_STAGE = "/tmp"
#: The character devices a view's ``/dev`` holds, when the policy grants them.
VIEW_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
#: Links a view's ``/dev`` always holds (what ``/dev`` has on every Linux).
_DEV_LINKS = (("/dev/fd", "/proc/self/fd"), ("/dev/stdin", "/proc/self/fd/0"),
              ("/dev/stdout", "/proc/self/fd/1"), ("/dev/stderr", "/proc/self/fd/2"),
              ("/dev/ptmx", "pts/ptmx"))  # fmt: skip
_MAX_LINKS = 40  # links followed while mirroring one path (the kernel's own bound)
_EPERM, _EINVAL, _ENOSYS, _EOPNOTSUPP = 1, 22, 38, 95

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
_NUMBERS = {
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
#: Policy keys and what each holds (None or absent: that layer is not asked for).
_POLICY: dict[str, type | str] = {
    "read": str, "write": str, "devices": str, "connect": int, "bind": int,
    "scope": bool, "seccomp": bool, "drop_caps": bool, "view": bool, "shm_mb": "size",
}
# fmt: on
#: os.uname().machine -> (AUDIT_ARCH_*, its column in _NUMBERS).
_ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}
_WANTED = {
    str: "a list of absolute paths",
    int: "a list of TCP ports",
    bool: "True or False",
    "size": "a positive int (MiB)",
}
_NETNS_WAIT_S = 5.0
_cache: dict[str, object] = {}


class _Libc:
    """libc through ctypes, loaded once; apply()'s calls take plain ints (no allocation)."""

    def __init__(self) -> None:
        import ctypes
        import struct

        self.ctypes, self.struct = ctypes, struct
        libc = ctypes.CDLL(None, use_errno=True)
        word = ctypes.c_ulong
        self._syscall, self.restrict_self = libc["syscall"], libc["syscall"]
        self._syscall.restype = self.restrict_self.restype = ctypes.c_long
        self.restrict_self.argtypes = (word, word, word)
        self.prctl, self.capget, self.capset = libc.prctl, libc.capget, libc.capset
        self.prctl.argtypes = (ctypes.c_int, word, word, word, word)
        self.capget.argtypes = self.capset.argtypes = (word, word)
        self.unshare = libc.unshare
        self.mount = libc.mount
        self.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, word,
                               ctypes.c_char_p)  # fmt: skip

    def syscall(self, name: str, nr: int, *args: object) -> int:
        wrapped = [self.ctypes.c_long(a) if isinstance(a, int) else a for a in (nr, *args)]
        return self.check(name, self._syscall(*wrapped))

    def check(self, name: str, result: int) -> int:
        if result < 0:
            code = self.ctypes.get_errno()
            raise OSError(code, f"confinement: {name} failed: {os.strerror(code)}")
        return int(result)


def _libc() -> _Libc:
    libc = _cache.get("libc")
    if not isinstance(libc, _Libc):
        libc = _cache["libc"] = _Libc()
    return libc


def probe() -> dict[str, object]:
    """What this kernel offers, found once per process (the first call forks once).

    Returns:
        ``landlock_abi`` (int, 0 = none), ``fs`` (Landlock file rules), ``net_tcp``
        (TCP port rules, ABI 4), ``scope`` (signal and abstract-socket scoping, ABI 6),
        ``seccomp`` (a filter can be loaded on this architecture), and ``netns``:
        "" when a network namespace can be created here, else why not.

    Example:
        >>> offered = probe()
        >>> policy = {"read": ["/usr"], "connect": [8080] if offered["net_tcp"] else None}
    """
    cached = _cache.get("probe")
    if isinstance(cached, dict):
        return dict(cached)
    abi = _landlock_abi()
    found: dict[str, object] = {"landlock_abi": abi, "fs": abi >= 1, "net_tcp": abi >= 4}
    netns, view = _namespace_checks()
    found.update(scope=abi >= 6, seccomp=_seccomp_available(), netns=netns, view=view)
    _cache["probe"] = found
    return dict(found)


def _landlock_abi() -> int:
    abi = _cache.get("abi")
    if not isinstance(abi, int):
        try:  # flags 1: LANDLOCK_CREATE_RULESET_VERSION
            abi = _libc().syscall("landlock_create_ruleset", _SYS_CREATE_RULESET, None, 0, 1)
        except OSError:  # ENOSYS: not built in; EOPNOTSUPP: not enabled at boot
            abi = 0
        _cache["abi"] = abi
    return abi


def _seccomp_available() -> bool:
    arch = _ARCHES.get(os.uname().machine)
    if arch is None:
        return False
    libc = _libc()
    action = libc.ctypes.byref(libc.ctypes.c_uint32(_RET_KILL_PROCESS))
    nr = _NUMBERS["seccomp"][arch[1]]
    try:  # ENOSYS/EINVAL: no seccomp filters; EOPNOTSUPP: no KILL_PROCESS (before 4.14)
        libc.syscall("seccomp", nr, _SECCOMP_GET_ACTION_AVAIL, 0, action)
    except OSError:
        return False
    return True


def _namespace_checks() -> tuple[str, str]:
    """Whether a network namespace, and a mount namespace with a view, can be made here:
    "" for each that can, else why not (a forked child tries each)."""
    libc = _libc()

    def netns() -> None:
        if libc.unshare(_CLONE_NEWNET) and libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET):
            raise OSError(libc.ctypes.get_errno() or 1, "unshare")

    def view() -> None:
        _enter_mount_namespace(libc)
        libc.check("mount tmpfs", libc.mount(b"none", _STAGE.encode(), b"tmpfs", 0, None))

    return _in_child(netns), _in_child(view)


def _in_child(check: Callable[[], None]) -> str:
    """Run ``check`` in a forked child: "" if it returned, else why not."""
    import time

    pid = os.fork()
    if pid == 0:  # only calls into the libc already loaded, then leaves
        try:
            check()
        except OSError as exc:
            os._exit(exc.errno or 1)
        except BaseException:
            os._exit(1)
        os._exit(0)
    deadline = time.monotonic() + _NETNS_WAIT_S
    while not (done := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
        time.sleep(0.001)
    if not done[0]:
        os.kill(pid, 9)
        done = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(done[1])
    why = os.strerror(code) if code > 0 else f"the check ended by signal {-code}"
    return "" if code == 0 else f"needs root or unprivileged user namespaces: {why}"


def _enter_mount_namespace(libc: _Libc, shared: bool = True) -> None:
    """Give the calling (single-threaded) process a mount namespace of its own, in a user
    namespace of its own when it is not root; mounts in it do not propagate out (with
    ``shared``, some mount propagates: all are made private)."""
    if os.geteuid() == 0:
        libc.check("unshare(CLONE_NEWNS)", libc.unshare(_CLONE_NEWNS))
    else:
        uid, gid = os.geteuid(), os.getegid()
        # The keeper is not dumpable, so its child's /proc/self files are root's: it
        # could not write its own maps. The child is about to exec the harness anyway.
        libc.check("PR_SET_DUMPABLE", libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0))
        both = libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS)
        libc.check("unshare(CLONE_NEWUSER|CLONE_NEWNS)", both)
        for name, text in (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny"),
                           ("gid_map", f"{gid} {gid} 1")):  # fmt: skip
            fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
    if shared:
        private = libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None)
        libc.check("making / private", private)


def _shared_mounts() -> bool:
    """Whether a mount of this process's namespace propagates (``shared:`` in mountinfo)."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            return b" shared:" in f.read()
    except OSError:
        return True


class Prepared:
    """A policy made into kernel objects, for :func:`apply` in forked children.

    Made and closed by the keeper's one thread; each child gets a copy by ``fork``.
    It may serve many forks until :meth:`close`.

    Attributes:
        ruleset_fd: The Landlock ruleset (close-on-exec), or -1 without Landlock rules.
        seccomp: Whether :func:`apply` loads the seccomp filter.
        drop_caps: Whether :func:`apply` drops every capability.
        view: What :func:`apply` mounts in the child's own mount namespace (``binds``:
            ``(source, target)`` directories; ``links``: ``(path, target)``; ``shm_mb``), or
            None for no mount namespace.
        closed: Whether :meth:`close` ran.
    """

    def __init__(
        self,
        libc: _Libc,
        ruleset_fd: int,
        program: bytes | None,
        drop_caps: bool,
        view: dict[str, object] | None = None,
        handled_fs: int = 0,
    ) -> None:
        ctypes = libc.ctypes
        self._libc = libc
        self.ruleset_fd, self.drop_caps, self.closed = ruleset_fd, drop_caps, False
        self.view, self._handled_fs = view, handled_fs
        self.seccomp = program is not None
        # What apply() points the kernel at, allocated here: capget's header and data,
        # zeros for capset, and struct sock_fprog (a count, then, aligned, a pointer).
        header, data = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0), (ctypes.c_uint32 * 6)()
        self._buffers: list[object] = [header, data, (ctypes.c_uint32 * 6)()]
        self._caps = tuple(ctypes.addressof(b) for b in self._buffers)
        self._filter = 0
        if program is not None:
            code = ctypes.create_string_buffer(program, len(program))
            fprog = libc.struct.pack("HP", len(program) // 8, ctypes.addressof(code))
            self._buffers += [code, ctypes.create_string_buffer(fprog, len(fprog))]
            self._filter = ctypes.addressof(self._buffers[-1])

    def close(self) -> None:
        """Close the ruleset fd in this process (idempotent, never raises)."""
        fd, self.ruleset_fd, self.closed = self.ruleset_fd, -1, True
        if fd >= 0:
            try:  # noqa: SIM105  (contextlib is not imported here)
                os.close(fd)
            except OSError:
                pass


def prepare(policy: dict[str, object]) -> Prepared:
    """Turn ``policy`` into a Landlock ruleset and a seccomp program (before ``fork``).

    A layer applies when its keys are given (``None`` or absent: not restricted):

    * ``read``, ``write``, ``devices`` (lists of absolute paths): Landlock file rules.
      ``read`` grants read and execute beneath each path, ``write`` every right,
      ``devices`` read, write and ioctl; everything else is denied. A path may name a
      file; paths that do not exist are skipped.
    * ``connect``, ``bind`` (lists of TCP ports): every other TCP connect or bind is
      denied (a ``bind`` rule for port 0 allows binding an ephemeral port).
    * ``scope``, ``seccomp``, ``drop_caps`` (bools, default False): see the module.

    Args:
        policy: The keys above.

    Returns:
        The kernel objects; :meth:`Prepared.close` them in the parent after the fork.

    Raises:
        ValueError: An unknown key or a value of the wrong form.
        OSError: The kernel lacks a layer the policy asks for (consult :func:`probe`
            first), or a path cannot be opened.

    Example:
        >>> prepared = prepare({"read": ["/usr", "/etc"], "write": ["/tmp/ws"],
        ...                     "connect": [8080], "seccomp": True, "drop_caps": True})
        >>> # in the child, after fork: apply(prepared); os.execve(...)
        >>> prepared.close()
    """
    _check_policy(policy)
    libc, abi, machine = _libc(), _landlock_abi(), os.uname().machine
    fs = any(policy.get(key) is not None for key in ("read", "write", "devices"))
    net = any(policy.get(key) is not None for key in ("connect", "bind"))
    scope, seccomp = bool(policy.get("scope")), bool(policy.get("seccomp"))
    view = bool(policy.get("view"))
    for missing, what, key in (
        (fs and abi < 1, "paths (read/write/devices) need Landlock", "fs"),
        (net and abi < 4, f"TCP ports (connect/bind) need Landlock ABI 4, not {abi}", "net_tcp"),
        (scope and abi < 6, f"scope needs Landlock ABI 6, not {abi}", "scope"),
        (view and bool(probe()["view"]), f"view: {probe()['view']}", "view"),
        (seccomp and machine not in _ARCHES, f"no seccomp filter for {machine}", "seccomp"),
    ):
        if missing:
            why = f"confinement: {what}; ask for it only where probe()[{key!r}] is True"
            raise OSError(_EOPNOTSUPP, why)
    later = sum(right for since, right in _FS_LATER if abi >= since)
    handled_fs = _FS_ABI1 | later if fs else 0
    handled_net = _NET_BIND_TCP | _NET_CONNECT_TCP if net else 0
    scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL if scope else 0
    ruleset = -1
    if handled_fs or handled_net or scoped:
        attr = libc.struct.pack("QQQ", handled_fs, handled_net, scoped)
        ruleset = libc.syscall("landlock_create_ruleset", _SYS_CREATE_RULESET, attr, len(attr), 0)
        try:
            _add_rules(libc, ruleset, policy, handled_fs)
        except BaseException:
            os.close(ruleset)
            raise
    program = _filter_program(machine) if seccomp else None
    plan = _view_plan(policy) if view else None
    return Prepared(libc, ruleset, program, bool(policy.get("drop_caps")), plan, handled_fs)


def _check_policy(policy: object) -> None:
    if not isinstance(policy, dict):
        raise ValueError(f"confinement policy: expected a dict, got {policy!r}")
    for key, value in policy.items():
        kind = _POLICY.get(key)
        if kind is None:
            raise ValueError(f"confinement policy: unknown key {key!r}; known: {list(_POLICY)}")
        if value is not None and not _valid(value, kind):
            raise ValueError(f"confinement policy: {key} must be {_WANTED[kind]}, not {value!r}")
    if policy.get("view") and not policy.get("read"):
        raise ValueError("confinement policy: view needs read (the paths the view shows)")


def _valid(value: object, kind: type | str) -> bool:
    if kind == "size":
        return type(value) is int and value > 0
    if kind is bool or not isinstance(value, list | tuple):
        return kind is bool and isinstance(value, bool)
    if kind is str:
        return all(isinstance(path, str) and path.startswith("/") for path in value)
    return all(type(port) is int and 0 <= port <= 65535 for port in value)


def _add_rules(libc: _Libc, ruleset: int, policy: dict[str, object], handled_fs: int) -> None:
    for key, grant in (("read", _FS_READ), ("write", handled_fs), ("devices", _FS_DEVICE)):
        for path in policy.get(key) or ():  # type: ignore[attr-defined]
            _add_path(libc, ruleset, path, grant & handled_fs)
    rights: dict[int, int] = {}
    for key, right in (("connect", _NET_CONNECT_TCP), ("bind", _NET_BIND_TCP)):
        for port in policy.get(key) or ():  # type: ignore[attr-defined]
            rights[port] = rights.get(port, 0) | right
    for port, right in sorted(rights.items()):
        rule = libc.struct.pack("QQ", right, port)  # struct landlock_net_port_attr
        libc.syscall(f"landlock_add_rule({port})", _SYS_ADD_RULE, ruleset, _RULE_NET_PORT, rule, 0)


def _add_path(libc: _Libc, ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return  # nothing there to grant
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= _FS_FILE  # directory rights on a file are EINVAL
        rule = libc.struct.pack("=Qi", access, fd)  # packed struct landlock_path_beneath_attr
        kind = _RULE_PATH_BENEATH
        libc.syscall(f"landlock_add_rule({path!r})", _SYS_ADD_RULE, ruleset, kind, rule, 0)
    finally:
        os.close(fd)


def _view_plan(policy: dict[str, object]) -> dict[str, object]:
    """What the child mounts, as ready-made arguments: each granted path's real directory
    bound at its own path (none beneath another, none in ``/dev``), the links on the way
    to each re-made, and the granted devices of :data:`VIEW_DEVICES` by name.

    What the read-only paths and the devices make is found once per set of them (they are
    the same for every episode); the writable paths (an episode's own) are added each time.
    """
    read: tuple[str, ...] = tuple(policy.get("read") or ())  # type: ignore[arg-type]
    granted: tuple[str, ...] = tuple(policy.get("devices") or ())  # type: ignore[arg-type]
    key = f"view:{read!r}:{granted!r}"
    cached = _cache.get(key)
    if not isinstance(cached, tuple):
        roots, links = _roots([], read)
        devices = []
        for device in VIEW_DEVICES:
            try:
                found = os.stat(device) if device in granted else None
            except OSError:
                continue
            if found is not None and stat.S_ISCHR(found.st_mode):
                devices.append((device, found.st_rdev))
        cached = _cache[key] = (roots, links, devices, _shared_mounts())
    roots, links, devices, shared = cached
    roots, links = _roots(roots, policy.get("write") or (), dict(links))  # type: ignore[arg-type]
    dirs: list[str] = ["/dev", "/dev/pts", "/dev/shm"]
    for path in [*roots, *(os.path.dirname(p) for p in [*links, *(d for d, _ in devices)])]:
        _add_dirs(path, dirs, last=path in roots)
    stage = _STAGE.encode()
    shm_mb = policy.get("shm_mb")
    return {
        "dirs": [stage + d.encode() for d in dirs],
        "binds": [(root.encode(), stage + root.encode()) for root in roots],
        "devices": [(stage + d.encode(), rdev) for d, rdev in devices],
        "links": [(to.encode(), stage + at.encode()) for at, to in (*links.items(), *_DEV_LINKS)],
        "shm": f"mode=1777,size={shm_mb}m".encode() if shm_mb else b"mode=1777",
        "shared": shared,
    }


def _roots(
    roots: list[str], paths: Sequence[str], links: dict[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """``roots`` with the real directories of ``paths`` that exist (none beneath another,
    none in ``/dev``), and ``links`` with the links on the way to each of ``paths``."""
    found = set(roots)
    for path in paths:
        real = os.path.realpath(path)
        if not os.path.isdir(real):  # a file: its directory is bound (Landlock grants it alone)
            real = os.path.dirname(real) if os.path.exists(real) else "/"
        if real in ("/", "/dev") or real.startswith("/dev/"):
            continue  # the view's own /dev holds the devices by name
        found.add(real)
    kept: list[str] = []
    for real in sorted(found):
        if not any(real.startswith(root + "/") for root in kept):
            kept.append(real)
    links = {} if links is None else links
    for path in paths:
        _mirror(os.path.abspath(path), kept, links, 0)
    return kept, links


def _add_dirs(path: str, dirs: list[str], last: bool) -> None:
    """Append the directories to make for ``path`` (its ancestors; itself if ``last``)."""
    parts = [part for part in path.split("/") if part]
    for n in range(1, len(parts) + (1 if last else 0)):
        here = "/" + "/".join(parts[:n])
        if here not in dirs:
            dirs.append(here)


def _mirror(path: str, roots: list[str], links: dict[str, str], depth: int) -> None:
    """Record the links on the way to ``path`` (up to where a bound root starts)."""
    parts = [part for part in path.split("/") if part]
    here = "/"
    for n, name in enumerate(parts):
        there = os.path.join(here, name)
        if any(there == root or there.startswith(root + "/") for root in roots):
            return  # the rest is the host's own, seen through the bind
        try:
            target = os.readlink(there)
        except OSError:  # a directory (or nothing): go on
            here = there
            continue
        links.setdefault(there, target)
        if depth < _MAX_LINKS:
            onward = os.path.normpath(os.path.join(here, target, *parts[n + 1 :]))
            _mirror(onward, roots, links, depth + 1)
        return


def _enter_view(prepared: Prepared) -> None:
    """Mount the view of ``prepared.view`` in a new mount namespace and ``chroot`` into it.

    The view is a tmpfs: directories, the granted paths bound from the host, the devices
    (made with ``mknod`` as root, bound otherwise), links, a new devpts instance and a
    tmpfs for ``/dev/shm``. ``chroot`` rather than ``pivot_root``: the host's root stays
    out of reach once the capabilities are gone (no ``chroot`` again, no mount call past
    the seccomp filter, no descriptor open outside) and the spawn skips an unmount that
    waits for an RCU grace period. The working directory is entered again in the view.
    """
    libc, plan = prepared._libc, prepared.view
    assert plan is not None
    cwd = os.getcwd()
    _enter_mount_namespace(libc, bool(plan["shared"]))
    opened = []
    for source, target in plan["binds"]:  # type: ignore[attr-defined]
        try:
            opened.append((os.open(source, os.O_PATH | os.O_CLOEXEC), target))
        except OSError:
            continue  # gone since the plan: nothing to show
    stage, flags = _STAGE.encode(), _MS_NOSUID
    check, mount = libc.check, libc.mount
    check("mounting the view", mount(b"gym_harness", stage, b"tmpfs", flags, b"mode=0755"))
    for path in plan["dirs"]:  # type: ignore[attr-defined]
        os.mkdir(path, 0o755)
    for fd, target in opened:
        bound = mount(b"/proc/self/fd/%d" % fd, target, None, _MS_BIND | _MS_REC, None)
        os.close(fd)
        check(f"binding {target.decode()} into the view", bound)
    root = os.geteuid() == 0
    for target, rdev in plan["devices"]:  # type: ignore[attr-defined]
        if root:
            os.mknod(target, stat.S_IFCHR | 0o666, rdev)
            continue  # a user namespace may not make devices: bind the host's
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        host = target[len(stage) :]
        check(f"binding {host.decode()}", mount(host, target, None, _MS_BIND, None))
    pts, shm = stage + b"/dev/pts", stage + b"/dev/shm"
    options = b"newinstance,ptmxmode=0666,mode=0620"
    check("mounting /dev/pts", mount(b"devpts", pts, b"devpts", flags | _MS_NOEXEC, options))
    check("mounting /dev/shm", mount(b"shm", shm, b"tmpfs", flags | _MS_NODEV, plan["shm"]))
    for target, path in plan["links"]:  # type: ignore[attr-defined]
        os.symlink(target, path)
    os.chroot(_STAGE)
    try:
        os.chdir(cwd)
    except OSError as exc:
        raise OSError(exc.errno, f"confinement: the working directory {cwd!r} is outside "
                      "what the harness may reach") from None  # fmt: skip
    if prepared.ruleset_fd >= 0 and prepared._handled_fs:
        handled = prepared._handled_fs
        _add_path(libc, prepared.ruleset_fd, "/dev", _FS_READ & handled)  # all of it is ours
        _add_path(libc, prepared.ruleset_fd, "/dev/pts", _FS_DEVICE & handled)
        _add_path(libc, prepared.ruleset_fd, "/dev/shm", handled & ~_FS_IOCTL_DEV)


def _filter_program(machine: str) -> bytes:
    """The seccomp filter of :data:`SECCOMP_WHY` for ``machine``, built once."""
    cached = _cache.get(f"bpf:{machine}")
    if isinstance(cached, bytes):
        return cached
    audit_arch, column = _ARCHES[machine]
    nrs = {name: numbers[column] for name, numbers in _NUMBERS.items()}
    code: list[str | tuple[int | str, ...]] = [(_LD_W_ABS, _ARCH), (_JEQ, audit_arch, 0, "kill")]
    code += [(_LD_W_ABS, _NR), (_JEQ, nrs["clone3"], "enosys", 0)]
    if machine == "x86_64":
        code.append((_JGE, _X32_BIT, "eperm", 0))
    code += [(_JEQ, nrs[name], "eperm", 0) for name in SECCOMP_DENIED if name not in _BY_ARGUMENT]
    # fmt: off
    code += [
        (_JEQ, nrs["socket"], "socket", 0), (_JEQ, nrs["clone"], "clone", 0),
        (_JEQ, nrs["ioctl"], "ioctl", 0),
        (_JEQ, nrs["sendmsg"], "flags_in_arg2", 0), (_JEQ, nrs["sendto"], "flags_in_arg3", 0),
        (_JEQ, nrs["sendmmsg"], "flags_in_arg3", "allow"),
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
    program = _cache[f"bpf:{machine}"] = _assemble(code)
    return program


def _assemble(code: list[str | tuple[int | str, ...]]) -> bytes:
    """Pack ``(op, k[, jump_if_true, jump_if_false])`` (a jump: a label's str, or 0) as BPF."""
    labels: dict[int | str, int] = {}
    pc = 0
    for item in code:
        if isinstance(item, str):
            labels[item] = pc
        else:
            pc += 1
    pack, out = _libc().struct.pack, list[bytes]()
    for item in code:
        if not isinstance(item, str):
            op, k, *jumps = item
            offsets = [0 if to == 0 else labels[to] - len(out) - 1 for to in jumps or (0, 0)]
            out.append(pack("HBBI", op, *offsets, k))
    return b"".join(out)


def apply(prepared: Prepared) -> None:
    """Confine the calling process (in the forked child, just before ``execve``).

    With a view, first moves into a mount namespace of its own and makes the view its
    root (:func:`prepare`'s ``view``). Then sets no_new_privs; drops capabilities
    (``drop_caps``; first, while CAP_SETPCAP is held); enforces the Landlock ruleset (it
    needs no_new_privs); loads the seccomp filter last, so it filters none of these
    calls. Irreversible.

    Raises:
        ValueError: ``prepared`` was closed.
        OSError: A step failed; the message names it (the process is then partly
            confined and should exit without exec).
    """
    if prepared.closed:
        raise ValueError("confinement: apply() of a closed Prepared")
    libc = prepared._libc
    if prepared.view is not None:
        _enter_view(prepared)
    libc.check("PR_SET_NO_NEW_PRIVS", libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
    if prepared.drop_caps:
        _drop_caps(libc, *prepared._caps)
    if prepared.ruleset_fd >= 0:
        result = libc.restrict_self(_SYS_RESTRICT_SELF, prepared.ruleset_fd, 0)
        libc.check("landlock_restrict_self", result)
    if prepared._filter:
        result = libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, prepared._filter, 0, 0)
        libc.check("PR_SET_SECCOMP", result)


def _drop_caps(libc: _Libc, header: int, data: int, zeros: int) -> None:
    libc.check("capget", libc.capget(header, data))
    effective = libc.ctypes.c_uint32.from_address(data).value
    if effective & 1 << _CAP_SETPCAP:  # dropping the bounding set needs it
        cap = 0  # no /proc read: EINVAL marks the kernel's last capability
        while libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
            cap += 1
        if cap == 0 or libc.ctypes.get_errno() != _EINVAL:
            libc.check(f"PR_CAPBSET_DROP({cap})", -1)
    result = libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    libc.check("PR_CAP_AMBIENT_CLEAR_ALL", result)
    libc.check("capset", libc.capset(header, zeros))


def bring_loopback_up() -> None:
    """Set ``lo`` up in this network namespace (a fresh one starts with it down).

    Raises:
        OSError: The ioctl failed (it needs CAP_NET_ADMIN in the namespace).
    """
    import _socket
    import fcntl

    pack, unpack = _libc().struct.pack, _libc().struct.unpack
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        request = pack("16sH22x", b"lo", 0)  # struct ifreq: the name, then ifr_flags
        flags = unpack("16sH22x", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request))[1]
        if not flags & _IFF_UP:
            fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, pack("16sH22x", b"lo", flags | _IFF_UP))
    except OSError as exc:
        raise OSError(exc.errno, f"confinement: cannot bring lo up: {exc.strerror}") from exc
    finally:
        sock.close()
