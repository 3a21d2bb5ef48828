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
  bus) has no path there, so no ``connect`` reaches it. As root, the read-only part of
  the view is mounted once per env, in a namespace the keeper keeps (rooted in the view:
  the host's root is not in it), and each child joins a copy of it, adding its writable
  paths, ``/dev/pts`` and ``/dev/shm``; otherwise each child mounts its whole view in a
  user namespace of its own (uid and gid mapped to themselves).

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
    from collections.abc import Callable
    from typing import Any

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
#: The character devices a view's ``/dev`` holds, when the policy grants them.
VIEW_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")

# The seccomp filter (seccomp.py beside this file, loaded by its path as we are).
_RET_KILL_PROCESS, _SECCOMP_GET_ACTION_AVAIL, _EINVAL, _EOPNOTSUPP = 0x80000000, 2, 22, 95


def _sibling(name: str) -> Any:
    """``NAME.py`` beside this file, loaded by its path once (as the keeper loads us)."""
    module = _cache.get(f"module:{name}")
    if module is None:
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
        spec = importlib.util.spec_from_file_location(f"_gym_harness_{name}", path)
        assert spec is not None and spec.loader is not None
        module = _cache[f"module:{name}"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


_cache: dict[str, object] = {}
_seccomp = _sibling("seccomp")
#: Why the seccomp filter refuses each call (``seccomp.SECCOMP_WHY``).
SECCOMP_WHY: tuple[tuple[str, str], ...] = _seccomp.SECCOMP_WHY
#: The calls the seccomp filter refuses (some only with the arguments SECCOMP_WHY names).
SECCOMP_DENIED: tuple[str, ...] = _seccomp.SECCOMP_DENIED
_NUMBERS: dict[str, tuple[int, int]] = _seccomp.NUMBERS
_ARCHES: dict[str, tuple[int, int]] = _seccomp.ARCHES

# fmt: off
#: Policy keys and what each holds (None or absent: that layer is not asked for).
_POLICY: dict[str, type | str] = {
    "read": str, "write": str, "devices": str, "connect": int, "bind": int,
    "scope": bool, "seccomp": bool, "drop_caps": bool, "view": bool, "shm_mb": "size",
}
# fmt: on
_WANTED = {
    str: "a list of absolute paths",
    int: "a list of TCP ports",
    bool: "True or False",
    "size": "a positive int (MiB)",
}
_NETNS_WAIT_S = 5.0
#: Mount points for writable paths a view namespace's tmpfs holds before it is made
#: again (episodes' paths differ; a few each).
_MOUNT_POINTS_KEPT = 1024
#: View namespaces kept (one per set of read-only paths: an env's keeper uses one).
_NAMESPACES_KEPT = 4


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
        # For apply()'s loop over the bounding set: small ints (a capability, zeros) go
        # without argtypes, which a call converts at about a third of the cost.
        self.prctl_ints = libc["prctl"]
        self.capget.argtypes = self.capset.argtypes = (word, word)
        self.unshare = libc.unshare
        self.mount = libc.mount
        self.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, word,
                               ctypes.c_char_p)  # fmt: skip

    def syscall(self, name: str, nr: int, *args: object) -> int:
        wrapped = [self.ctypes.c_long(a) if isinstance(a, int) else a for a in (nr, *args)]
        return self.check(name, self._syscall(*wrapped))

    def add_rule(self, name: str, ruleset: int, fd: int, access: int) -> None:
        """Grant ``access`` beneath the file of ``fd`` in ``ruleset`` (a path rule)."""
        rule = self.struct.pack("=Qi", access, fd)  # packed struct landlock_path_beneath_attr
        c_long = self.ctypes.c_long
        result = self._syscall(c_long(_SYS_ADD_RULE), c_long(ruleset), c_long(_RULE_PATH_BENEATH),
                               rule, c_long(0))  # fmt: skip
        self.check(f"landlock_add_rule({name!r})", result)

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
        _sibling("view").check(libc)

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
        self._libc = libc
        self.ruleset_fd, self.drop_caps, self.closed = ruleset_fd, drop_caps, False
        self.view, self._handled_fs = view, handled_fs
        self.seccomp = program is not None
        # What apply() points the kernel at, made once per process: capget's header and
        # data, zeros for capset (each child writes only its own copy), and the program.
        self._caps, self._filter = _kernel_buffers(libc, program)
        # What the view makes of its own, granted in the child once it is made: its
        # /dev (the granted devices, its own terminals beneath /dev/pts, nothing to
        # create) and its /dev/shm (every file right).
        self._namespace = -1  # the env's namespace of the view, or -1
        self._view_rules = (
            ("/dev", (_FS_READ | _FS_DEVICE) & handled_fs),
            ("/dev/shm", handled_fs & ~_FS_IOCTL_DEV),
        )

    def close(self) -> None:
        """Close the ruleset fd and the view's namespace fd in this process (idempotent,
        never raises)."""
        fds = (self.ruleset_fd, self._namespace)
        self.ruleset_fd, self._namespace, self.closed = -1, -1, True
        for fd in fds:
            if fd >= 0:
                try:  # noqa: SIM105  (contextlib is not imported here)
                    os.close(fd)
                except OSError:
                    pass


def _kernel_buffers(libc: _Libc, program: bytes | None) -> tuple[tuple[int, int, int], int]:
    """Addresses of capget's header and data and capset's zeros, and of a struct
    sock_fprog for ``program`` (0 for none); allocated once per process, kept in the cache."""
    ctypes = libc.ctypes
    caps = _cache.get("caps")
    if caps is None:
        header, data = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0), (ctypes.c_uint32 * 6)()
        buffers = (header, data, (ctypes.c_uint32 * 6)())
        caps = _cache["caps"] = (buffers, tuple(ctypes.addressof(b) for b in buffers))
    if program is None:
        return caps[1], 0  # type: ignore[index]
    fprog = _cache.get("fprog")
    if fprog is None or fprog[0] != program:  # type: ignore[index]
        # struct sock_fprog: a count, then, aligned, a pointer to the code.
        code = ctypes.create_string_buffer(program, len(program))
        packed = libc.struct.pack("HP", len(program) // 8, ctypes.addressof(code))
        fprog = _cache["fprog"] = (program, code, ctypes.create_string_buffer(packed))
    return caps[1], ctypes.addressof(fprog[2])  # type: ignore[index]


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
    program = _seccomp.program(machine, _cache) if seccomp else None
    plan = _sibling("view").plan(policy, VIEW_DEVICES, _cache) if view else None
    ruleset = -1
    if handled_fs or handled_net or scoped:
        attr = libc.struct.pack("QQQ", handled_fs, handled_net, scoped)
        ruleset = libc.syscall("landlock_create_ruleset", _SYS_CREATE_RULESET, attr, len(attr), 0)
        try:
            _add_rules(libc, ruleset, policy, handled_fs)
        except BaseException:
            os.close(ruleset)
            raise
    prepared = Prepared(libc, ruleset, program, bool(policy.get("drop_caps")), plan, handled_fs)
    try:
        if plan is not None and (namespace := _view_namespace(libc, plan)) >= 0:
            prepared._namespace = os.dup(namespace)  # its own: the cache may close the one kept
    except BaseException:  # the ruleset's fd with it: a keeper spawns many times
        prepared.close()
        raise
    return prepared


def _view_namespace(libc: _Libc, plan: dict[str, Any]) -> int:
    """The env's namespace holding ``plan``'s read-only view (``view.build``), made once
    per set of read-only paths while their directories stay the same ones, with the
    mount points of ``plan``'s writable paths; -1 where none can be made (not root: each
    spawn mounts its whole view)."""
    arch = _ARCHES.get(os.uname().machine)
    if os.geteuid() != 0 or arch is None:
        return -1
    view, key = _sibling("view"), plan["key"]
    kept = _cache.setdefault("namespaces", {})
    assert isinstance(kept, dict)
    try:
        found = tuple((s.st_dev, s.st_ino) for s in map(os.stat, plan["sources"]))
    except OSError:
        found = ()
    held = kept.pop(key, None)  # put back last: the most recently used
    if isinstance(held, dict):
        if held["namespace"] < 0 and held["identity"] == found:
            kept[key] = held
            return -1  # could not be made for these paths: not tried again
        if held["identity"] == found and len(held["made"]) < _MOUNT_POINTS_KEPT:
            kept[key] = held
            view.add_mount_points(plan, held["root"], held["made"])
            return int(held["namespace"])
        _close_namespace(held)  # replaced paths, or many mount points: made again
    while len(kept) >= _NAMESPACES_KEPT:
        _close_namespace(kept.pop(next(iter(kept))))  # the least recently used
    numbers = _cache["numbers"] = {name: nrs[arch[1]] for name, nrs in _NUMBERS.items()}
    made: set[bytes] = set()
    namespace, root = -1, -1
    try:
        if found:
            namespace, root = view.build(libc, plan, numbers)
            view.add_mount_points(plan, root, made)
    except OSError:  # each spawn mounts its whole view, as without root
        for fd in (namespace, root):
            if fd >= 0:
                os.close(fd)
        namespace, root = -1, -1
    kept[key] = {"namespace": namespace, "root": root, "identity": found, "made": made}
    return namespace


def _close_namespace(held: dict[str, Any]) -> None:
    for fd in (held["namespace"], held["root"]):
        if fd >= 0:
            os.close(fd)


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
        libc.add_rule(path, ruleset, fd, access)
    finally:
        os.close(fd)


def _add_view_rules(prepared: Prepared) -> None:
    """Grant what the view made of its own (in the child, before the ruleset applies)."""
    if prepared.ruleset_fd >= 0 and prepared._handled_fs:
        libc, ruleset = prepared._libc, prepared.ruleset_fd
        for path, access in prepared._view_rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)  # closed by the exec
            libc.add_rule(path, ruleset, fd, access)


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
        view, add_rules = _sibling("view"), lambda: _add_view_rules(prepared)
        if prepared._namespace >= 0:
            numbers = _cache["numbers"]
            view.join(libc, prepared.view, prepared._namespace, numbers, add_rules)
        else:
            view.enter(libc, prepared.view, add_rules)
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
        while libc.prctl_ints(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
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
