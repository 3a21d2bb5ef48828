"""The view: what a confined harness's own mount namespace shows (``confine``'s ``view``).

The keeper's child gets a mount namespace of its own (in a user namespace of its own
when it is not root) whose root is a small tmpfs holding only what the policy grants,
each at its own path: the granted directories bound from the host, the links on the way
to each made again (``/bin -> usr/bin``), a ``/dev`` of the granted devices by name, a
new devpts instance (its own terminals only) and a tmpfs for ``/dev/shm``. A pathname
unix socket outside (a multiprocessing forkserver's, Ray's, a session bus) has no path
there, so no ``connect`` reaches it: Landlock (ABI < 9) does not govern that connect.

As root, what the read-only paths make is mounted once per env (:func:`build`: a mount
namespace whose root is the view, kept open by the keeper) and each child joins a copy
of it, adding what it has of its own (:func:`join`: its writable paths, ``/dev/pts``,
``/dev/shm``): an ``unshare`` of a handful of mounts, then a mount per writable path and
two more, not the whole view each spawn. Without root each child mounts its whole view
(:func:`enter`).

Loaded by ``confine`` by its file path, in the keeper (a ``python -I -S`` script): it
imports built-in modules only. :func:`plan`, :func:`build` and :func:`add_mount_points`
run in the keeper before the fork, :func:`enter` or :func:`join` in the forked child,
before the rest of the confinement.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False  # no typing import at run time
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

__all__ = ["add_mount_points", "build", "check", "enter", "enter_namespace", "join", "plan"]

_CLONE_NEWUSER, _CLONE_NEWNS = 0x10000000, 0x00020000
_PR_SET_DUMPABLE = 4
# mount(2) flags.
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_O_DIR_PATH = os.O_PATH | os.O_CLOEXEC
_MNT_DETACH, _OPEN_TREE_CLONE, _AT_RECURSIVE, _MOVE_MOUNT_F_EMPTY_PATH = 2, 1, 0x8000, 4
_BUILD_WAIT_S = 5.0  # how long build() waits for its child's answer
#: Where the child builds its view (any directory: a tmpfs covers it in its own namespace).
_STAGE = "/tmp"
#: Links a view's ``/dev`` always holds (what ``/dev`` has on every Linux).
_DEV_LINKS = (("/dev/fd", "/proc/self/fd"), ("/dev/stdin", "/proc/self/fd/0"),
              ("/dev/stdout", "/proc/self/fd/1"), ("/dev/stderr", "/proc/self/fd/2"),
              ("/dev/ptmx", "pts/ptmx"))  # fmt: skip
_MAX_LINKS = 40  # links followed while mirroring one path (the kernel's own bound)
#: Plans kept for their writable paths, and what sets of read-only paths make (one
#: keeper serves one env: a few episodes' worth; a command naming a file of its
#: workspace reads a path of its episode's).
_PLANS_KEPT = 8


def check(libc: Any) -> None:
    """Make a namespace and mount a tmpfs in it, as :func:`enter` would (in a child).

    Raises:
        OSError: Either step failed.
    """
    enter_namespace(libc)
    libc.check("mount tmpfs", libc.mount(b"none", _STAGE.encode(), b"tmpfs", 0, None))


def enter_namespace(libc: Any, shared: bool = True) -> None:
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


def plan(
    policy: dict[str, object], devices: Sequence[str], cache: dict[str, object]
) -> dict[str, object]:
    """What the child mounts, as ready-made arguments: each granted path's real directory
    bound at its own path (none beneath another, none in ``/dev``), the links on the way
    to each re-made, and the granted ones of ``devices`` by name.

    What the read-only paths and the devices make is found once per set of them (kept in
    ``cache``: they are mostly the same for every episode); the writable paths (an
    episode's own) are added once per set of them, for as long as each is still a
    directory. The last :data:`_PLANS_KEPT` sets of each are kept: an episode's turns
    spawn with the same ones.
    """
    read: tuple[str, ...] = tuple(policy.get("read") or ())  # type: ignore[arg-type]
    granted: tuple[str, ...] = tuple(policy.get("devices") or ())  # type: ignore[arg-type]
    write: tuple[str, ...] = tuple(policy.get("write") or ())  # type: ignore[arg-type]
    plans = cache.setdefault("view:plans", {})
    assert isinstance(plans, dict)
    whole = (read, granted, write, policy.get("shm_mb"))
    made = plans.get(whole)
    if made is not None and all(os.path.isdir(path) for path in write):
        return made
    made = _plan(policy, devices, cache, read, granted, write)
    if all(os.path.isdir(path) for path in write):
        while len(plans) >= _PLANS_KEPT:
            del plans[next(iter(plans))]  # the oldest
        plans[whole] = made
    return made


def _plan(
    policy: dict[str, object],
    devices: Sequence[str],
    cache: dict[str, object],
    read: tuple[str, ...],
    granted: tuple[str, ...],
    write: tuple[str, ...],
) -> dict[str, object]:
    key = f"view:{read!r}:{granted!r}"
    kept = cache.setdefault("view:reads", {})
    assert isinstance(kept, dict)
    cached = kept.get(key)
    if cached is None:
        roots, links = _roots([], read)
        nodes = []
        for device in devices:
            try:
                found = os.stat(device) if device in granted else None
            except OSError:
                continue
            if found is not None and stat.S_ISCHR(found.st_mode):
                nodes.append((device, found.st_rdev))
        while len(kept) >= _PLANS_KEPT:
            del kept[next(iter(kept))]  # the oldest
        cached = kept[key] = (roots, links, nodes, _shared_mounts())
    read_roots, read_links, nodes, shared = cached
    roots, links = _roots(read_roots, write, dict(read_links))
    shm_mb = policy.get("shm_mb")
    made = _arguments(roots, links, nodes)
    # The same split in two: what the read-only paths make (an env's namespace holds it
    # once, see build) and what an episode's writable ones add to it (see join).
    fixed = _arguments(read_roots, read_links, nodes)
    before = set(fixed["dirs"])
    made.update(
        shm=f"mode=1777,size={shm_mb}m".encode() if shm_mb else b"mode=1777",
        shared=shared,
        key=key,
        fixed=fixed,
        sources=tuple(read_roots),
        added={
            "dirs": [d for d in made["dirs"] if d not in before],
            "binds": [b for b in made["binds"] if b not in fixed["binds"]],
            "links": [link for link in made["links"] if link not in fixed["links"]],
        },
    )
    return made


def _arguments(
    roots: list[str], links: dict[str, str], nodes: list[tuple[str, int]]
) -> dict[str, Any]:
    """The directories, binds, devices and links that show ``roots`` in the stage."""
    dirs: list[str] = ["/dev", "/dev/pts", "/dev/shm"]
    for path in [*roots, *(os.path.dirname(p) for p in [*links, *(d for d, _ in nodes)])]:
        _add_dirs(path, dirs, last=path in roots)
    stage = _STAGE.encode()
    return {
        "dirs": [stage + d.encode() for d in dirs],
        "binds": [(root.encode(), stage + root.encode()) for root in roots],
        "devices": [(stage + d.encode(), rdev) for d, rdev in nodes],
        "links": [(to.encode(), stage + at.encode()) for at, to in (*links.items(), *_DEV_LINKS)],
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


def enter(libc: Any, plan: dict[str, Any], add_rules: Callable[[], None]) -> None:
    """Mount the view of ``plan`` in a new mount namespace and ``chroot`` into it; then
    ``add_rules`` (the Landlock rules for what the view made of its own).

    The view is a tmpfs: directories, the granted paths bound from the host, the devices
    (made with ``mknod`` as root, bound otherwise), links, a new devpts instance and a
    tmpfs for ``/dev/shm``. ``chroot`` rather than ``pivot_root``: the host's root stays
    out of reach once the capabilities are gone (no ``chroot`` again, no mount call past
    the seccomp filter, no descriptor open outside) and the spawn skips an unmount that
    waits for an RCU grace period. The working directory is entered again in the view.
    """
    cwd = os.getcwd()
    enter_namespace(libc, bool(plan["shared"]))
    _make(libc, plan)
    _own_dev(libc, _STAGE.encode(), plan["shm"])
    os.chroot(_STAGE)
    _enter_cwd(cwd)
    add_rules()


def build(libc: Any, plan: dict[str, Any], numbers: dict[str, int]) -> tuple[int, int]:
    """An env's mount namespace holding the read-only part of ``plan``'s view as its root
    (made once, in a child of the caller's, which must be root): file descriptors of the
    namespace and of its root directory.

    Each spawn then joins it (:func:`join`) instead of mounting all of the view again:
    its own copy of it, with the episode's writable paths, ``/dev/pts`` and ``/dev/shm``
    added. The namespace has no other mount: the host's root is unmounted from it
    (``pivot_root``), so a process that joins it reaches nothing else. The caller makes
    the directories the writable paths are bound on through the root's descriptor
    (:func:`add_mount_points`), so a spawn does not.

    Raises:
        OSError: The child could not make it (the message says which step), or did not
            answer within :data:`_BUILD_WAIT_S`.
    """
    import select

    ready_r, ready_w = os.pipe()  # the child's report, then EOF
    hold_r, hold_w = os.pipe()  # the child holds the namespace until its EOF
    try:
        pid = os.fork()
    except OSError:  # EAGAIN at the process limit: the keeper goes on without the view's
        for fd in (ready_r, ready_w, hold_r, hold_w):
            os.close(fd)
        raise
    if pid == 0:  # only calls into the libc already loaded, then leaves
        try:
            os.close(ready_r)
            os.close(hold_w)
            enter_namespace(libc, bool(plan["shared"]))
            _make(libc, plan["fixed"])
            os.chdir(_STAGE)
            libc.syscall("pivot_root", numbers["pivot_root"], b".", b".")
            libc.syscall("unmounting the host's root", numbers["umount2"], b".", _MNT_DETACH)
            os.chdir("/")
            os.write(ready_w, b"ok")
            os.read(hold_r, 1)
        except BaseException as exc:  # reported to the caller
            try:  # noqa: SIM105
                os.write(ready_w, f"{getattr(exc, 'errno', 0) or 1} {exc}".encode()[:500])
            except OSError:
                pass
        os._exit(0)
    os.close(ready_w)
    os.close(hold_r)
    try:
        report = b""
        if select.select([ready_r], [], [], _BUILD_WAIT_S)[0]:
            report = os.read(ready_r, 512)
        if report != b"ok":
            number, _, text = report.decode(errors="replace").partition(" ")
            why = text or f"no answer within {_BUILD_WAIT_S} s"
            raise OSError(int(number) if number.isdigit() else 0, f"the view's namespace: {why}")
        namespace = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return namespace, os.open(f"/proc/{pid}/root", _O_DIR_PATH | os.O_DIRECTORY)
        except OSError:
            os.close(namespace)
            raise
    finally:
        os.close(ready_r)
        os.close(hold_w)  # the child leaves; the namespace lives on while the fd is open
        try:  # noqa: SIM105  (contextlib is not imported here)
            os.kill(pid, 9)  # a child that never answered
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)


def add_mount_points(plan: dict[str, Any], root: int, made: set[bytes]) -> None:
    """Make in :func:`build`'s namespace, through ``root`` (its root directory), the
    directories and links ``plan``'s writable paths need that ``made`` does not hold yet;
    add them to it. Each step stays in the namespace's tmpfs: the paths are the view's
    own, none through a link."""
    cut = len(_STAGE) + 1  # relative to root
    for path in plan["added"]["dirs"]:
        if path not in made:
            try:  # noqa: SIM105
                os.mkdir(path[cut:], 0o755, dir_fd=root)
            except FileExistsError:
                pass
            made.add(path)
    for target, path in plan["added"]["links"]:
        if path not in made:
            try:  # noqa: SIM105
                os.symlink(target, path[cut:], dir_fd=root)
            except FileExistsError:
                pass
            made.add(path)


def join(
    libc: Any,
    plan: dict[str, Any],
    namespace: int,
    numbers: dict[str, int],
    add_rules: Callable[[], None],
) -> None:
    """Enter a copy of :func:`build`'s namespace and add to it what this spawn has of its
    own: the writable paths (cloned here first, where the host's tree is visible; bound on
    :func:`add_mount_points`'s directories), a new ``/dev/pts`` and ``/dev/shm``; then
    ``add_rules``. What :func:`enter` does, with an ``unshare`` of a handful of mounts and
    a few mounts in place of the whole view."""
    cwd = os.getcwd()
    added = plan["added"]
    cut = len(_STAGE)
    trees = []
    for source, target in added["binds"]:  # OPEN_TREE_CLONE | AT_RECURSIVE, close-on-exec
        flags = _OPEN_TREE_CLONE | _AT_RECURSIVE | os.O_CLOEXEC
        try:
            fd = libc.syscall(
                f"cloning {source.decode()}", numbers["open_tree"], -100, source, flags
            )
        except FileNotFoundError:
            continue  # gone since the plan: nothing to show
        trees.append((fd, target[cut:]))
    libc.syscall("joining the view's namespace", numbers["setns"], namespace, _CLONE_NEWNS)
    libc.check("unshare(CLONE_NEWNS)", libc.unshare(_CLONE_NEWNS))
    for fd, target in trees:  # MOVE_MOUNT_F_EMPTY_PATH: the tree of fd itself
        name = f"binding {target.decode()} into the view"
        libc.syscall(name, numbers["move_mount"], fd, b"", -100, target, _MOVE_MOUNT_F_EMPTY_PATH)
    _own_dev(libc, b"", plan["shm"])
    _enter_cwd(cwd)
    add_rules()


def _make(libc: Any, plan: dict[str, Any]) -> None:
    """Mount the stage's tmpfs and fill it: directories, binds, devices, links."""
    # The directories to bind, opened in the new namespace (a descriptor opened before
    # the unshare names a mount of the old one, which the kernel does not bind here) and
    # before the tmpfs covers the stage; close-on-exec: the exec closes them.
    binds = []
    for source, target in plan["binds"]:
        try:
            binds.append((b"/proc/self/fd/%d" % os.open(source, _O_DIR_PATH), target))
        except OSError:
            continue  # gone since the plan: nothing to show
    stage = _STAGE.encode()
    check, mount = libc.check, libc.mount
    check("mounting the view", mount(b"gym_harness", stage, b"tmpfs", _MS_NOSUID, b"mode=0755"))
    for path in plan["dirs"]:
        os.mkdir(path, 0o755)
    for source, target in binds:
        bound = mount(source, target, None, _MS_BIND | _MS_REC, None)
        check(f"binding {target.decode()} into the view", bound)
    root = os.geteuid() == 0
    for target, rdev in plan["devices"]:
        if root:
            os.mknod(target, stat.S_IFCHR | 0o666, rdev)
            continue  # a user namespace may not make devices: bind the host's
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        host = target[len(stage) :]
        check(f"binding {host.decode()}", mount(host, target, None, _MS_BIND, None))
    for target, path in plan["links"]:
        os.symlink(target, path)


def _own_dev(libc: Any, root: bytes, shm_options: bytes) -> None:
    """Mount a new devpts instance and a tmpfs at ``root``'s ``/dev/pts`` and ``/dev/shm``."""
    check, mount, flags = libc.check, libc.mount, _MS_NOSUID
    pts, shm = root + b"/dev/pts", root + b"/dev/shm"
    options = b"newinstance,ptmxmode=0666,mode=0620"
    check("mounting /dev/pts", mount(b"devpts", pts, b"devpts", flags | _MS_NOEXEC, options))
    check("mounting /dev/shm", mount(b"shm", shm, b"tmpfs", flags | _MS_NODEV, shm_options))


def _enter_cwd(cwd: str) -> None:
    try:
        os.chdir(cwd)
    except OSError as exc:
        raise OSError(exc.errno, f"confinement: the working directory {cwd!r} is outside "
                      "what the harness may reach") from None  # fmt: skip
