"""A signal sent to every process of a container, from the host: each process its cgroup lists.

The engine's kill reaches the container's first process alone, the ``sh -c`` a run's command is
started under, and a shell passes no signal on to the command it runs as its child: a training
that is to checkpoint on its signal must hear it itself. This agent (root, in the host's process
namespace) sees the container's cgroup, and its list of processes names them by host pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from worker_agent.usage import CGROUP_ROOT


def cgroup_dir(container_id: str, root: Path = CGROUP_ROOT) -> Path | None:
    """The container's cgroup directory (v2: its unified one; v1: its ``pids``, else ``memory``,
    hierarchy's), under either of the engine's cgroup drivers; None where none is seen here."""
    names = (container_id, f"docker-{container_id}.scope")
    if (root / "cgroup.controllers").exists():
        bases = [root / "system.slice", root / "docker"]
    else:
        bases = [root / hierarchy / parent for hierarchy in ("pids", "memory") for parent in ("docker", "system.slice")]
    for base in bases:
        for name in names:
            if (base / name).is_dir():
                return base / name
    return None


def _procs(directory: Path) -> set[int] | None:
    """Every pid in ``directory``'s cgroup and those beneath it (None: the list cannot be read);
    a process of another pid namespace is listed as 0, and left out."""
    pids: set[int] = set()
    try:
        for at, _, _ in os.walk(directory, onerror=_raise):
            pids.update(int(line) for line in (Path(at) / "cgroup.procs").read_text().split())
    except (OSError, ValueError):
        return None
    pids.discard(0)
    return pids


def _raise(error: OSError) -> None:
    raise error


def signal_cgroup(container_id: str, signo: int, root: Path = CGROUP_ROOT) -> int | None:
    """Send ``signo`` to every process in the cgroup of ``container_id``; returns how many it
    reached, or None when the cgroup cannot be read. No pid outside the cgroup is ever sent a
    signal: each listed pid is opened (a pidfd: it names that process, never one that takes its
    number later), the list is read again, and only a pid still listed is signalled, through its
    pidfd. A process that exited meanwhile is passed over."""
    directory = cgroup_dir(container_id, root)
    listed = None if directory is None else _procs(directory)
    if directory is None or listed is None:
        return None
    opened: dict[int, int] = {}
    try:
        for pid in sorted(listed):
            with contextlib.suppress(OSError):  # exited (ESRCH), or no pidfd on this kernel
                opened[pid] = os.pidfd_open(pid)
        still = _procs(directory) or set()
        sent = 0
        for pid, fd in opened.items():
            if pid in still:
                with contextlib.suppress(ProcessLookupError):  # exited since
                    signal.pidfd_send_signal(fd, signo)
                    sent += 1
        return sent
    finally:
        for fd in opened.values():
            os.close(fd)


def signal_number(name: str) -> int | None:
    """The number of a signal named as the engine takes it (``SIGUSR1``, ``USR1`` or ``10``)."""
    if name.isdigit():
        return int(name)
    name = name.upper()
    try:
        return int(signal.Signals[name if name.startswith("SIG") else f"SIG{name}"])
    except KeyError:
        return None
