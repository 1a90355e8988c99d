"""A wake-up at a commit of another process, at once and free while idle (Linux: inotify).

A commit to a database in WAL mode writes its ``-wal`` file. One inotify instance per process
(``inotify_init1`` through ctypes) watches the directory of every database that waits in this
process (``watch``), and one thread of the process blocks on it and calls each database's
callbacks when its log is written (or made again, after a checkpoint removed it). A database
wakes its own waiters from there (``Database.wait_for_change``).

A wake may come a moment before the commit is visible (SQLite writes the log, then its index) or
for no commit at all (a checkpoint truncating the log): the waiter confirms with ``PRAGMA
data_version``, and looks again briefly after a wake. Where inotify cannot be had (another
system, the user's limit of instances or watches, ``INOTIFY`` set False) ``watch`` answers False
and the waiter polls instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import struct
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["INOTIFY", "broken", "watch"]

INOTIFY = sys.platform.startswith("linux")
"""Whether waits use inotify (False: every database polls, as the tests of that path set it)."""

_IN_MODIFY = 0x00000002
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_ONLYDIR = 0x01000000
_MASK = _IN_MODIFY | _IN_CREATE | _IN_MOVED_TO | _IN_ONLYDIR
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_init1.restype = ctypes.c_int
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_add_watch.restype = ctypes.c_int
    return libc


def _events(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """The events of one read: (watch, mask, name)."""
    at = 0
    while at + _EVENT.size <= len(data):
        wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
        at += _EVENT.size
        yield wd, mask, data[at : at + length].rstrip(b"\0")
        at += length


class _Watcher:
    """The process's inotify instance, its watches (one a directory) and the thread reading it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fd = -1
        self.libc: ctypes.CDLL | None = None
        self.failed = False  # inotify could not be had, or its thread stopped: poll from now on
        self.watches: dict[int, tuple[bytes, list[weakref.WeakMethod[Callable[[], None]]]]] = {}

    def watch(self, directory: Path, name: str, callback: Callable[[], None]) -> bool:
        with self.lock:
            if self.failed or not INOTIFY:
                return False
            if self.fd < 0:
                try:
                    libc = _libc()
                    fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
                except (OSError, AttributeError):  # no libc, or a libc without inotify
                    fd = -1
                if fd < 0:  # EMFILE: the user's instances are all taken
                    self.failed = True
                    return False
                self.fd, self.libc = fd, libc
                threading.Thread(target=self._read, args=(fd,), name="runplane-commit-watch", daemon=True).start()
            assert self.libc is not None
            wd = self.libc.inotify_add_watch(self.fd, os.fsencode(directory), _MASK)
            if wd < 0:  # ENOSPC (the user's watches are all taken), ENOENT: this database polls
                return False
            entry = self.watches.setdefault(wd, (os.fsencode(name), []))
            method = weakref.WeakMethod(callback)
            if method not in entry[1]:
                entry[1][:] = [m for m in entry[1] if m() is not None] + [method]
            return True

    def _read(self, fd: int) -> None:
        """Block on the instance; call the callbacks of each watch whose file was written."""
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        try:
            while True:
                poller.poll()
                try:
                    data = os.read(fd, 64 * 1024)
                except BlockingIOError:
                    continue
                hit: set[int] = set()
                gone: set[int] = set()
                for wd, mask, name in _events(data):
                    if mask & _IN_Q_OVERFLOW:
                        with self.lock:
                            hit.update(self.watches)  # events were lost: wake them all
                    elif mask & _IN_IGNORED:
                        gone.add(wd)  # the directory went: wake its waiters, a later wait watches again
                    elif (entry := self.watches.get(wd)) is not None and name == entry[0]:
                        hit.add(wd)
                self._call(hit | gone, drop=gone)
        except Exception:  # the instance broke (or this thread did): every waiter polls from now on
            with self.lock:
                self.failed = True
                wds = set(self.watches)
            self._call(wds)
            with contextlib.suppress(OSError):
                os.close(fd)

    def _call(self, wds: set[int], drop: frozenset[int] | set[int] = frozenset()) -> None:
        with self.lock:
            methods = [m for wd in wds if wd in self.watches for m in self.watches[wd][1]]
            for wd in drop:
                self.watches.pop(wd, None)
        for method in methods:
            if (callback := method()) is not None:
                callback()


_watcher = _Watcher()


def _forked() -> None:
    """In a forked child: the parent's thread is not there, and its instance is the parent's."""
    global _watcher
    if _watcher.fd >= 0:
        with contextlib.suppress(OSError):
            os.close(_watcher.fd)
    _watcher = _Watcher()


os.register_at_fork(after_in_child=_forked)


def watch(directory: Path, name: str, callback: Callable[[], None]) -> bool:
    """Call ``callback`` (from another thread) whenever ``directory/name`` is written or made, from
    now on; True when it will be, False when the caller must poll instead. A callback is held
    weakly; watching the same directory again is cheap."""
    return _watcher.watch(directory, name, callback)


def broken() -> bool:
    """Whether the watching stopped (its waiters were woken, and poll from now on)."""
    return _watcher.failed
