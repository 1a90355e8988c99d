"""The processes of a session in a run's container, as this host's /proc shows them, and their end.

Docker has no call that ends an exec: dropping its socket leaves the command (and its children)
running. The engine's runtime makes every exec's process a session leader (its session id is its
pid), so what a session started is: the processes whose session id is the exec's pid, their
descendants, and any process of the container whose environment says ``RUNPLANE_SESSION=<id>``
(a double fork with ``setsid`` leaves the first two). Only processes of the container's own cgroup
are ever looked at or signalled: a pid reused by another process of the host is not one of them.

This needs the agent in the Docker engine's PID namespace (``exec_inspect``'s Pid is the engine's).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KILL_SECONDS = 5.0
"""How long ending a session's processes may take before what is left is reported."""


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    sid: int
    state: str

    @property
    def zombie(self) -> bool:
        """Ended, waiting for its parent to read its status: nothing of it runs."""
        return self.state in ("Z", "X")


class Procs:
    """/proc as this host has it (``root``: another directory laid out alike, for a test)."""

    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = root

    def _read(self, pid: int, name: str) -> bytes | None:
        try:
            return (self.root / str(pid) / name).read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            return None

    def stat(self, pid: int) -> Proc | None:
        raw = self._read(pid, "stat")
        if raw is None:
            return None
        # the command name is in parentheses and may hold anything: what follows its last ')'
        fields = raw[raw.rfind(b")") + 2 :].split()
        try:
            return Proc(pid, int(fields[1]), int(fields[3]), fields[0].decode())
        except (IndexError, ValueError):
            return None

    def in_container(self, pid: int, container_id: str) -> bool:
        cgroup = self._read(pid, "cgroup")
        return cgroup is not None and container_id.encode() in cgroup

    def has_session(self, pid: int, session_id: str) -> bool:
        environ = self._read(pid, "environ")
        return environ is not None and f"RUNPLANE_SESSION={session_id}".encode() in environ.split(b"\0")

    def container(self, container_id: str) -> list[Proc]:
        """Every process of the container's cgroup."""
        try:
            pids = [int(entry.name) for entry in self.root.iterdir() if entry.name.isdigit()]
        except OSError:
            return []
        found = []
        for pid in pids:
            proc = self.stat(pid)
            if proc is not None and self.in_container(pid, container_id):
                found.append(proc)
        return found

    def of_session(self, container_id: str, exec_pid: int | None, session_id: str) -> list[Proc]:
        """The processes ``session_id`` started in the container (``exec_pid``: its exec's, if it had one)."""
        procs = self.container(container_id)
        # the exec is a session leader: its session id is its pid (a pid reused since is not)
        chosen = {p.pid for p in procs if exec_pid and p.sid == exec_pid}
        chosen |= {p.pid for p in procs if self.has_session(p.pid, session_id)}
        grew = True
        while grew:  # and their descendants, whatever session they made
            more = {p.pid for p in procs if p.ppid in chosen} - chosen
            chosen |= more
            grew = bool(more)
        return [p for p in procs if p.pid in chosen]


def end_session(
    procs: Procs,
    container_id: str,
    exec_pid: int | None,
    session_id: str,
    sleep: Callable[[float], None] = time.sleep,
    seconds: float = KILL_SECONDS,
) -> list[Proc]:
    """SIGKILL every process of the session, looking again until none runs (zombies wait for their
    parent and run nothing); returns those still running after ``seconds`` (empty: all ended)."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [p for p in procs.of_session(container_id, exec_pid, session_id) if not p.zombie]
        if not alive or time.monotonic() >= deadline:
            return alive
        for proc in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)
        sleep(0.02)


def can_see(procs: Procs, pid: int, container_id: str) -> bool:
    """Whether this agent sees the container's process ``pid`` as the engine does (its PID namespace)."""
    return pid > 0 and procs.in_container(pid, container_id)
