"""The agent's work dir: run directories and inputs on ``nosuid,nodev`` mounts, reachable by the
agent only.

A run writes its output directory as its own uid; whatever it leaves there (a setuid binary, a
device node) must never work for a user of the worker host. Docker's bind mounts take no
``nosuid``/``nodev`` option, but a bind mount copies the flags of the mount its source is on. So
``<work_dir>/runs`` has to be on such a mount: found (the host, e.g. the AMI's unit or an
operator, made it) or made at start by the agent (a bind mount of the directory onto itself,
remounted ``nosuid,nodev``), which works only as root in the Docker engine's mount namespace.

Inputs are mounted read-only, and for a read-only bind runc remounts with ``MS_RDONLY`` alone,
dropping ``nosuid,nodev``. So the agent also makes ``<work_dir>/inputs``, a read-only
``nosuid,nodev`` view of the input cache: a plain ("rw") bind of a path in it stays read-only,
``nosuid`` and ``nodev`` in the container. Without the view (the agent cannot mount), inputs are
bound read-only from the cache itself.

The per-worker mounts are the agent's own: it removes them when it exits, and holds a lock on
its work dir meanwhile, so an agent starting later on this host removes those of an agent that
died (SIGKILL, OOM) without leaving.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import re
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_RELATIME = 0x200000
MNT_DETACH = 0x2
# statvfs f_flag bits a remount must keep (it replaces the per-mount flags it is not given)
_KEPT = {os.ST_RDONLY: MS_RDONLY, os.ST_NOEXEC: MS_NOEXEC, os.ST_NOATIME: MS_NOATIME}
_KEPT |= {os.ST_NODIRATIME: MS_NODIRATIME, os.ST_RELATIME: MS_RELATIME}
SAFE = frozenset({"nosuid", "nodev"})
LOCK = ".agent.lock"
"""In each worker's work dir, flock'ed by its agent while it lives."""


class WorkDirError(Exception):
    """The work dir cannot be made safe (and the operator did not accept it)."""


@dataclass(frozen=True)
class Mount:
    mount_point: str
    options: frozenset[str]
    """The per-mount options (``rw,nosuid,nodev,relatime``), not the file system's."""


def _unescape(text: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of ``/proc/self/mountinfo``, in its order (a later one may cover an earlier)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 6:
            mounts.append(Mount(_unescape(fields[4]), frozenset(fields[5].split(","))))
    return mounts


def covering(mounts: list[Mount], path: Path) -> Mount | None:
    """The mount ``path`` (absolute, symlinks resolved) is on: the deepest mount point at or
    above it, the last one where several share a mount point."""
    best: Mount | None = None
    for mount in mounts:
        point = mount.mount_point.rstrip("/") or "/"
        if (point == "/" or path == Path(point) or Path(point) in path.parents) and (
            best is None or len(point) >= len(best.mount_point.rstrip("/") or "/")
        ):
            best = mount
    return best


def exactly(mounts: list[Mount], path: Path) -> Mount | None:
    """The top mount whose mount point is ``path`` itself, if any."""
    found = [m for m in mounts if Path(m.mount_point) == path]
    return found[-1] if found else None


def read_mountinfo() -> str:
    return Path("/proc/self/mountinfo").read_text()


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def bind_mount(source: Path, target: Path, read_only: bool) -> None:
    """Bind ``source`` onto ``target`` and remount it ``nosuid,nodev`` (and ``ro``), keeping the
    flags of the mount it came from. Raises OSError (undoing a half-made mount)."""
    libc = _libc()
    _check(libc.mount(str(source).encode(), str(target).encode(), None, MS_BIND, None), f"bind {source}")
    kept = os.statvfs(target).f_flag
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only else 0)
    flags |= sum(ms for st, ms in _KEPT.items() if kept & st)
    try:
        _check(libc.mount(None, str(target).encode(), None, flags, None), f"remount {target} nosuid,nodev")
    except OSError:
        unmount(target)
        raise


def unmount(target: Path) -> None:
    _check(_libc().umount2(str(target).encode(), MNT_DETACH), f"unmount {target}")


def engine_shares_our_mounts(docker_host: str | None) -> bool:
    """Whether the Docker engine at ``docker_host`` (``DOCKER_HOST``; None: the default socket)
    is in this process's mount namespace, so that a mount made here is what it bind-mounts from.
    False when that cannot be told (a TCP engine, an engine outside our pid namespace)."""
    url = docker_host or "unix:///var/run/docker.sock"
    if not url.startswith("unix://"):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(url.removeprefix("unix://"))
            pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if pid <= 0:
            return False  # the engine is outside our pid namespace (we are in a container)
        return Path(f"/proc/{pid}/ns/mnt").stat().st_ino == Path("/proc/self/ns/mnt").stat().st_ino
    except OSError:
        return False


@dataclass
class WorkDir:
    """What ``prepare`` found or made. ``inputs_view`` maps the input cache to its read-only
    ``nosuid,nodev`` view (None: there is none)."""

    runs: Path
    cache: Path
    inputs_view: Path | None = None
    made: list[Path] = field(default_factory=list)
    warning: str | None = None
    lock: int | None = None

    def release(self, unmount_: Callable[[Path], None] = unmount) -> None:
        """Remove the per-worker mounts and let go of the work dir (the agent is leaving).
        Quiet when they are gone."""
        for path in reversed(self.made):
            _quietly(unmount_, path)
        self.leave_mounted()

    def leave_mounted(self) -> None:
        """Let go of the work dir, leaving its mounts for the agent that comes next."""
        self.made.clear()
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None


def _quietly(unmount_: Callable[[Path], None], path: Path) -> None:
    try:
        unmount_(path)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOENT):
            log.warning("could not remove the mount at %s: %s", path, e)


def _try_lock(path: Path) -> int | None:
    """An open descriptor holding an exclusive flock on ``path``, or None if another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _hold(work_dir: Path, wait_seconds: float = 5.0) -> int:
    """Lock this worker's work dir for the agent's life. Raises WorkDirError if another agent
    with the same worker id holds it (a sweeping agent holds it a moment only)."""
    deadline = time.monotonic() + wait_seconds
    while (fd := _try_lock(work_dir / LOCK)) is None:
        if time.monotonic() > deadline:
            raise WorkDirError(f"another agent with this worker id is running: it holds {work_dir / LOCK}")
        time.sleep(0.05)
    return fd


def sweep_dead(root: Path) -> list[Path]:
    """Remove the per-worker mounts under ``root`` (a ``--work-dir``) of agents that are gone;
    returns them. For whoever cleans up after agents (a test, an operator)."""
    return _sweep(root.resolve(), None, parse_mountinfo(read_mountinfo()), unmount)


def _sweep(root: Path, me: Path | None, mounts: list[Mount], unmount_: Callable[[Path], None]) -> list[Path]:
    """Remove the per-worker mounts under ``root`` of agents that died here without leaving:
    those whose work dir lock nobody holds."""
    swept = []
    for mount in mounts:
        point = Path(mount.mount_point)
        worker = point.parent
        if point.name not in ("runs", "inputs") or worker.parent != root or worker == me:
            continue
        if not (worker / LOCK).exists():
            continue  # not an agent's (or of an agent that never took the lock): left alone
        fd = _try_lock(worker / LOCK)
        if fd is None:
            continue  # its agent is alive
        try:
            _quietly(unmount_, point)
            swept.append(point)
        finally:
            os.close(fd)
    if swept:
        log.info("removed %d mount(s) of agents that died here: %s", len(swept), [str(p) for p in swept])
    return swept


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)  # also when an older agent made it 0755, and whatever the umask
    return path.resolve()


def prepare(
    work_dir: Path,
    cache: Path,
    *,
    why_not: str | None,
    allow_suid: bool = False,
    mountinfo: Callable[[], str] = read_mountinfo,
    mount: Callable[[Path, Path, bool], None] = bind_mount,
    unmount_: Callable[[Path], None] = unmount,
    lock_wait: float = 5.0,
) -> WorkDir:
    """Make ``work_dir`` (this worker's), its ``runs`` and the shared input ``cache``
    directories 0700 and put ``runs`` on a ``nosuid,nodev`` mount, found or made; and make the
    inputs view where possible. ``why_not``: why this agent cannot mount (None: it can).
    Raises WorkDirError (one line) when ``runs`` is on no such mount and none can be made,
    unless ``allow_suid``."""
    work_dir = _private_dir(work_dir)
    runs, cache = _private_dir(work_dir / "runs"), _private_dir(cache)
    result = WorkDir(runs, cache, lock=_hold(work_dir, lock_wait))
    try:
        _prepare(result, work_dir, why_not, allow_suid, mountinfo, mount, unmount_)
    except BaseException:
        result.release(unmount_)
        raise
    return result


def _prepare(
    result: WorkDir,
    work_dir: Path,
    why_not: str | None,
    allow_suid: bool,
    mountinfo: Callable[[], str],
    mount: Callable[[Path, Path, bool], None],
    unmount_: Callable[[Path], None],
) -> None:
    runs, cache = result.runs, result.cache
    mounts = parse_mountinfo(mountinfo())
    if why_not is None and _sweep(work_dir.parent, work_dir, mounts, unmount_):
        mounts = parse_mountinfo(mountinfo())
    on = covering(mounts, runs)
    if on is None or not on.options >= SAFE:
        problem = why_not
        if problem is None:
            try:
                mount(runs, runs, False)
                result.made.append(runs)
            except OSError as e:
                problem = str(e)
        if problem is not None:
            message = (
                f"run directories under {runs} are not on a nosuid,nodev mount and this agent cannot make one "
                f"({problem}): make one on the host (mount --bind DIR DIR && mount -o remount,bind,nosuid,nodev "
                "DIR, for the work dir) or pass --allow-suid-work-dir to accept setuid files and device nodes there"
            )
            if not allow_suid:
                raise WorkDirError(message)
            result.warning = message
    elif why_not is None and exactly(mounts, runs) is not None:
        result.made.append(runs)  # this worker's own, left by an earlier life or made for it: ours to remove
    result.inputs_view = _inputs_view(work_dir / "inputs", cache, mounts, why_not, mount, unmount_, result)


def _inputs_view(
    view: Path,
    cache: Path,
    mounts: list[Mount],
    why_not: str | None,
    mount: Callable[[Path, Path, bool], None],
    unmount_: Callable[[Path], None],
    result: WorkDir,
) -> Path | None:
    view.mkdir(mode=0o700, exist_ok=True)  # no chmod: it may be the (read-only) view already
    view = view.resolve()
    there = exactly(mounts, view)
    if there is not None:
        with contextlib.suppress(OSError):
            if there.options >= {"ro", *SAFE} and view.stat().st_ino == cache.stat().st_ino:
                if why_not is None:
                    result.made.append(view)
                return view
        if why_not is None:
            _quietly(unmount_, view)  # a stale view (of another cache): made again below
    if why_not is not None:
        return None
    try:
        mount(cache, view, True)
    except OSError as e:
        log.warning("no read-only nosuid,nodev view of the input cache (%s): inputs are bound from the cache", e)
        return None
    result.made.append(view)
    return view
