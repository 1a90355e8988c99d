"""A connection to ``127.0.0.1:port`` inside a run's own network namespace, for a port-forward.

A thread made for it alone enters the namespace of the container's process (``setns`` moves only
the calling thread), connects, and goes back before it ends; the socket stays in the run's
namespace. Nothing listens anywhere, no binary is needed in the image, and the only address ever
dialled is the run's own loopback: a port the host listens on is not reachable this way. The
process is checked to be the container's (its cgroup) after its namespace is opened, so a pid
taken over meanwhile fails rather than leading elsewhere. If the thread cannot go back, the
agent exits: a thread left in a run's namespace must never serve anything again.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading

from worker_agent.sessions.procs import Procs

CLONE_NEWNET = 0x40000000
DIAL_SECONDS = 5.0
STUCK_EXIT = 70
"""The agent's exit status when a thread could not leave a run's network namespace."""

_libc = ctypes.CDLL(None, use_errno=True)


class DialFailed(Exception):
    """The connection could not be made; the message says why, for the other side."""


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def dial(
    pid: int, container_id: str, port: int, procs: Procs | None = None, timeout: float = DIAL_SECONDS
) -> socket.socket:
    """A socket connected to ``127.0.0.1:port`` in the network namespace of process ``pid``, which
    must be of container ``container_id``. Raises DialFailed."""
    if not 1 <= port <= 65535:
        raise DialFailed(f"no port {port}")
    try:
        theirs = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise DialFailed(f"the run's network is not reachable: {e.strerror}") from e
    try:
        if not (procs or Procs()).in_container(pid, container_id):
            raise DialFailed("the run's container is gone")
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            same = os.fstat(theirs), os.fstat(own)
            if (same[0].st_dev, same[0].st_ino) == (same[1].st_dev, same[1].st_ino):
                raise DialFailed("the run shares this worker's network namespace")
            return _dial_in(theirs, own, port, timeout)
        finally:
            os.close(own)
    finally:
        os.close(theirs)


def _dial_in(theirs: int, own: int, port: int, timeout: float) -> socket.socket:
    result: list[socket.socket] = []
    errors: list[BaseException] = []

    def inside() -> None:
        try:
            _setns(theirs)
        except OSError as e:
            errors.append(DialFailed(f"cannot enter the run's network namespace: {e.strerror}"))
            return
        try:
            result.append(socket.create_connection(("127.0.0.1", port), timeout=timeout))
        except OSError as e:
            errors.append(DialFailed(f"127.0.0.1:{port} in the run: {e.strerror or e}"))
        finally:
            try:
                _setns(own)
            except OSError:
                os._exit(STUCK_EXIT)

    thread = threading.Thread(target=inside, name="netns-dial", daemon=True)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    sock = result[0]
    sock.settimeout(None)
    return sock
