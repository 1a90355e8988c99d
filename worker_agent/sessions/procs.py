"""The processes of a session in a run's container, as this host's /proc shows them, and their end.

Docker has no call that ends an exec: dropping its socket leaves the command (and its children)
running. The engine's runtime makes every exec's process a session leader (its session id is its
pid), so what a session started is: the processes whose session id is the exec's pid, their
descendants, any process of the container whose environment says ``RUNPLANE_SESSION=<id>`` (a
double fork with ``setsid`` leaves the first two), and every process of the session's own cgroup
(``confine``: as soon as the exec runs, it and what it started so far go into a cgroup of their own
under the container's, in the ``pids`` hierarchy (cgroup v1) or the unified one (v2); whatever they
start after is born in it and cannot leave it, whatever session and environment it makes: ``setsid
env -i`` too). Only processes of the container's own cgroup are ever looked at, signalled or moved,
and each through a pidfd opened while its start time is still the one listed: a pid reused since
it was listed, by any process, is never signalled nor moved into a session's cgroup.

This needs the agent in the Docker engine's PID namespace (``exec_inspect``'s Pid is the engine's);
the session's cgroup needs the host's cgroup file system writable (without it, the first three).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

KILL_SECONDS = 5.0
"""How long ending a session's processes may take before what is left is reported: a process
killed ends at once but in an uninterruptible wait (a disk, a hung mount), which it ends first."""
CGROUP_PREFIX = "runplane-session-"
"""The name of a session's cgroup under its container's: the prefix, then the session's id."""


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    sid: int
    state: str
    pgrp: int = 0
    tpgid: int = -1
    """The foreground process group of its terminal (-1: none)."""
    start: int = 0
    """When it started (clock ticks after boot): a pid reused since has another."""

    @property
    def zombie(self) -> bool:
        """Ended, waiting for its parent to read its status: nothing of it runs."""
        return self.state in ("Z", "X")


class Procs:
    """/proc as this host has it (``root``: another directory laid out alike, for a test)."""

    def __init__(self, root: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")) -> None:
        self.root, self.cgroups = root, cgroups

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
            ppid, pgrp, sid, tpgid, start = (int(fields[i]) for i in (1, 2, 3, 5, 19))
            return Proc(pid, ppid, sid, fields[0].decode(), pgrp, tpgid, start)
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

    def of_session(
        self, container_id: str, exec_pid: int | None, session_id: str, cgroup: Path | None = None
    ) -> list[Proc]:
        """The processes ``session_id`` started in the container (``exec_pid``: its exec's, if it had
        one; ``cgroup``: its own, if ``confine`` made one)."""
        procs = self.container(container_id)
        # the exec is a session leader: its session id is its pid (a pid reused since is not)
        chosen = {p.pid for p in procs if exec_pid and p.sid == exec_pid}
        chosen |= {p.pid for p in procs if self.has_session(p.pid, session_id)}
        chosen |= confined(cgroup)
        grew = True
        while grew:  # and their descendants, whatever session they made
            more = {p.pid for p in procs if p.ppid in chosen} - chosen
            chosen |= more
            grew = bool(more)
        return [p for p in procs if p.pid in chosen]

    # -- the session's own cgroup --------------------------------------------------------

    def _container_cgroup(self, pid: int, container_id: str) -> Path | None:
        """The directory of the cgroup process ``pid`` of the container is in: of the ``pids``
        hierarchy (cgroup v1), else of the unified one (v2); None when neither is here."""
        raw = self._read(pid, "cgroup")
        if raw is None or container_id.encode() not in raw:
            return None
        lines = [line.split(":", 2) for line in raw.decode(errors="replace").splitlines() if ".." not in line]
        # (a path with "..": the container's cgroup is outside this agent's cgroup namespace)
        for parts in lines:
            if len(parts) == 3 and "pids" in parts[1].split(","):
                return self.cgroups / "pids" / parts[2].lstrip("/")
        for parts in lines:
            if len(parts) == 3 and parts[0] == "0" and not parts[1]:
                return self.cgroups / parts[2].lstrip("/")
        return None

    def confine(self, container_id: str, exec_pid: int, session_id: str) -> Path | None:
        """Move the session's processes (its exec's, and what they started so far) into a cgroup of
        their own under the container's: what they start from now on is born in it and cannot leave
        it. The cgroup's directory, or None when none could be made (no writable cgroup file system:
        nothing else changes)."""
        found = self._container_cgroup(exec_pid, container_id) if exec_pid > 0 else None
        if found is None:
            return None
        where = found / f"{CGROUP_PREFIX}{session_id}"
        try:
            where.mkdir(exist_ok=True)
        except OSError as e:
            log.info("session %s: no cgroup of its own (%s): its processes are found without one", session_id, e)
            return None
        for proc in self.of_session(container_id, exec_pid, session_id):
            pidfd = self._hold(proc, container_id)
            if pidfd is None:  # gone, or its pid another process's now: never moved
                continue
            try:
                with contextlib.suppress(OSError):  # gone meanwhile
                    (where / "cgroup.procs").write_text(str(proc.pid))
            finally:
                os.close(pidfd)
        return where

    # -- signals --------------------------------------------------------------------------

    def signal(self, proc: Proc, container_id: str, signo: int) -> int | None:
        """Send ``signo`` to ``proc`` if it is still that process (the same start time, in the
        container); a pidfd of it (the caller closes it), or None when it was not sent."""
        pidfd = self._hold(proc, container_id)
        if pidfd is None:
            return None
        try:
            signal.pidfd_send_signal(pidfd, signo)
        except OSError:  # gone, or not ours to signal
            os.close(pidfd)
            return None
        return pidfd

    def _hold(self, proc: Proc, container_id: str) -> int | None:
        """A pidfd of ``proc`` while its pid is still that process (the same start time, in the
        container), or None (gone, or the pid another process's now). The pidfd names that process
        until it is closed, whatever the pid is reused for; a write of the pid (to a cgroup) right
        after names another only were the process to end and the kernel's pids to come round to
        it again in between."""
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError:  # gone
            return None
        # what the pidfd names now is what it names until it is closed: the pid's process now
        now = self.stat(proc.pid)
        if now is None or now.start != proc.start or not self.in_container(proc.pid, container_id):
            os.close(pidfd)
            return None
        return pidfd


def confined(cgroup: Path | None) -> set[int]:
    """The processes in a session's cgroup (none when it has none)."""
    try:
        listed = (cgroup / "cgroup.procs").read_text().split() if cgroup is not None else []
    except OSError:
        return set()
    return {int(pid) for pid in listed if pid.isdigit()}


def end_session(
    procs: Procs,
    container_id: str,
    exec_pid: int | None,
    session_id: str,
    cgroup: Path | None = None,
    seconds: float = KILL_SECONDS,
) -> list[Proc]:
    """SIGKILL every process of the session, looking again until none runs (zombies wait for their
    parent and run nothing), and remove its cgroup; returns those still running after ``seconds``
    (empty: all ended). Each round waits on the pidfds of what it killed (each readable once its
    process ended), not on a clock."""
    deadline = time.monotonic() + seconds
    try:
        while True:
            alive = [p for p in procs.of_session(container_id, exec_pid, session_id, cgroup) if not p.zombie]
            left = deadline - time.monotonic()
            if not alive or left <= 0:
                return alive
            pidfds = [fd for p in alive if (fd := procs.signal(p, container_id, signal.SIGKILL)) is not None]
            try:
                if pidfds:
                    _wait_ended(pidfds, left)
                else:  # none sent: each pid listed is gone or another's now; look again shortly
                    time.sleep(min(0.02, left))
            finally:
                for fd in pidfds:
                    os.close(fd)
    finally:
        if cgroup is not None:  # empty once all ended; else the container's removal takes it
            with contextlib.suppress(OSError):
                cgroup.rmdir()


def _wait_ended(pidfds: list[int], seconds: float) -> None:
    """Wait until every pidfd's process ended, or ``seconds``."""
    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    waiting, deadline = len(pidfds), time.monotonic() + seconds
    while waiting and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(left * 1000):
            poller.unregister(fd)
            waiting -= 1


def can_see(procs: Procs, pid: int, container_id: str) -> bool:
    """Whether this agent sees the container's process ``pid`` as the engine does (its PID namespace)."""
    return pid > 0 and procs.in_container(pid, container_id)
