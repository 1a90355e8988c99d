"""A stack's directory: held by one stack at a time (``StateLock``), emptied by ``--fresh``
(``empty``) only when nothing of a stack still uses it."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
from pathlib import Path

from runplane.adapters.local.db import DB_FILE, OBJECTS_DIR
from runplane.adapters.local.keyfile import KEY_FILE
from worker_agent.workdir import parse_mountinfo, read_mountinfo, sweep_dead

__all__ = [
    "ADMIN_TOKEN_PATH",
    "LOCK_FILE",
    "STATE_ENTRIES",
    "StateLock",
    "check_not_foreign",
    "check_stack_dir",
    "empty",
    "private_dir",
]

ADMIN_TOKEN_PATH = "admin-token"  # noqa: S105 (a file name)
"""In a stack's directory (0600): the administrator's token ``runplane dev`` prints, kept for its next start."""
LOCK_FILE = "lock"
"""In a stack's directory: locked (``flock``) by the stack using it, for as long as it runs; holds its pid."""
STATE_ENTRIES = frozenset(
    {
        DB_FILE,
        f"{DB_FILE}-wal",
        f"{DB_FILE}-shm",
        OBJECTS_DIR,
        "workers",
        "agents",
        ADMIN_TOKEN_PATH,
        LOCK_FILE,
        KEY_FILE,
    }
)
"""What a stack's directory holds: ``fresh`` empties only a directory holding nothing else (the
secrets key file too: the secrets it sealed go with the database)."""


class StateLock:
    """The lock of the stack's directory ``state_dir``, taken at once or not at all: two stacks on
    one directory would run two dispatchers on one database, and a ``--fresh`` start would empty
    it under the one running. Held until ``release`` (or the process ends, however it ends)."""

    def __init__(self, state_dir: Path) -> None:
        path = state_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            raise ValueError(f"state directory {state_dir} is in use by another runplane (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Let another stack have the directory. Idempotent."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # the lock goes with the last descriptor of its open file


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (to tell a reused pid apart), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def live_agents(state_dir: Path) -> list[str]:
    """The agents of the stack's directory still running, by their pid records (``workers/<pool>/*.json``
    of LocalCompute): ``"pid N (worker ID)"`` each."""
    found = []
    for path in sorted((state_dir / "workers").glob("*/*.json")):
        try:
            record = json.loads(path.read_text())
            pid = int(record["pid"])
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if _start_time(pid) is not None and _start_time(pid) == record.get("started"):
            found.append(f"pid {pid} (worker {record.get('id', path.stem)})")
    return found


def check_stack_dir(state_dir: Path) -> None:
    """Raise ValueError when ``state_dir`` holds what no stack keeps there (it may be another
    directory given by mistake)."""
    if not state_dir.is_dir():
        return
    strange = sorted(entry.name for entry in state_dir.iterdir() if entry.name not in STATE_ENTRIES)
    if strange:
        raise ValueError(
            f"{state_dir} does not look like a runplane stack's directory (it holds {', '.join(strange[:5])}): "
            "not emptied; remove it yourself or choose another state dir"
        )


def empty(state_dir: Path) -> None:
    """Remove what a stack keeps in ``state_dir`` (but its lock, held by the caller). Raises
    ValueError, removing nothing, when it holds anything else (it may be another directory given by
    mistake), when agents of a stack that used it still run (their runs' directories and records
    are there), or when something is mounted in it."""
    if not state_dir.is_dir():
        return
    check_stack_dir(state_dir)
    agents = live_agents(state_dir)
    if agents:
        pids = " ".join(agent.split()[1] for agent in agents)
        raise ValueError(
            f"{state_dir} is not emptied: agents of a stack that used it still run ({', '.join(agents[:5])}); "
            f"stop them first (kill {pids}; they end their runs and exit), or start without --fresh"
        )
    with contextlib.suppress(OSError):
        sweep_dead(state_dir / "agents")  # the work-dir mounts of agents gone: they are not followed
    root = state_dir.resolve()
    mounted = sorted(
        point
        for point in {Path(mount.mount_point) for mount in parse_mountinfo(read_mountinfo())}
        if root in point.parents
    )
    if mounted:
        raise ValueError(
            f"{state_dir} is not emptied: {', '.join(map(str, mounted[:5]))} is mounted in it; unmount it first"
        )
    for entry in state_dir.iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def check_not_foreign(path: Path) -> None:
    """Raise ValueError when ``path`` is a directory holding what no stack keeps: another one given
    by mistake (``/etc``, ``/var/lib``), whose modes its other users need; nothing may be written or
    changed there. A missing directory passes."""
    try:
        with os.scandir(path) as entries:
            strange = sorted(entry.name for entry in entries if entry.name not in STATE_ENTRIES)
    except FileNotFoundError:
        return
    except OSError as e:
        raise ValueError(f"state directory {path}: {e.strerror}") from None
    if strange:
        raise ValueError(
            f"{path} is not a runplane stack's directory (it holds {', '.join(strange[:5])}): nothing written "
            "there; choose a new or empty state dir"
        )


def private_dir(path: Path) -> None:
    """Make the stack's directory ``path`` 0700 (its missing parents as the umask makes them, never
    changed), or take the one there when it is empty or holds only what a stack keeps (made 0700 in
    turn). Raises ValueError, changing and writing nothing, for a directory that holds anything
    else (``check_not_foreign``)."""
    check_not_foreign(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
