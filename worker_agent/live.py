"""Outputs while the run goes: what a run writes under its output directory's ``live/`` is
uploaded as it changes, to the keys its final upload writes too, so a long run's plots and
metrics can be read before it ends.

A thread scans ``live/`` every ``interval`` seconds and uploads the files whose size or time of
change moved since their last upload. Bounded: at most ``max_files`` files are looked at, a
file over ``max_file_bytes`` is passed over (said once), at most ``bytes_per_minute`` go up a
minute and ``max_total_bytes`` in all (then the scans stop). Files are read as the final upload
reads them (``trees.open_beneath``: never through a symlink out of the tree; fifos, devices and
sockets are passed over without being read), and exactly the size seen when opened is read, so
a file that grows meanwhile uploads no more than that. A failed upload is tried again at the
next scan and never fails the run. The final upload writes every file again once the container
has exited, after this thread stopped (``stop``; ``finish`` for an upload still under way)."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runplane.domain.errors import RunplaneError
from runplane.domain.units import format_bytes
from runplane.ports import MAX_DELETE, ObjectStore
from worker_agent.outputs import judge, upload_file
from worker_agent.settings import default
from worker_agent.trees import Refused, Unwalkable, open_beneath, scan

log = logging.getLogger(__name__)

LIVE_DIR = "live"
"""The directory of a run's output directory whose files are uploaded while it runs."""
WINDOW_SECONDS = 60.0
"""The span ``bytes_per_minute`` counts over."""
ENTRIES_PER_FILE, MIN_ENTRIES = 10, 1000
"""A scan reads at most this many entries of ``live/`` a file it may upload (and at least the latter);
as many different files at most are uploaded in one attempt."""
MAX_NOTICES, MAX_COUNTED, SHOWN_CHARS = 20, 1000, 200
"""What was passed over: the first MAX_NOTICES things are named (each path cut to SHOWN_CHARS),
the next are counted, up to MAX_COUNTED different ones in all (a long path kept as its digest)."""
_GONE = os.strerror(errno.ENOENT)


@dataclass(frozen=True)
class LiveLimits:
    interval: float = default("live_interval")  # seconds between two scans
    max_files: int = default("live_max_files")  # files looked at in live/ (the first the walk meets)
    max_file_bytes: int = default("live_max_file_bytes")  # larger ones are uploaded only when the run ends
    bytes_per_minute: int = default("live_bytes_per_minute")  # uploaded a minute, the run's files together
    max_total_bytes: int = default("live_max_total_bytes")  # uploaded in all by one attempt's scans


class LiveOutputs:
    """The live uploads of one run: ``root`` is the run's ``live/`` directory on this host,
    ``prefix`` the key its files go under (``outputs_prefix(run, attempt) + "live/"``).
    ``scan_once`` is one pass (the thread's, or a test's); ``start`` and ``stop`` run passes on
    a thread of its own. ``notices`` names what was passed over, each thing once, the first
    MAX_NOTICES of them; ``summary`` says it in a line."""

    def __init__(
        self,
        objects: ObjectStore,
        root: Path,
        prefix: str,
        clock: Callable[[], float],
        limits: LiveLimits | None = None,
        name: str = "live",
    ) -> None:
        self.objects, self.root, self.prefix, self.clock = objects, root, prefix, clock
        self.limits = limits or LiveLimits()
        self.notices: list[str] = []
        self.uploads = 0  # files uploaded (each change of a file counts)
        self.sent_bytes = 0  # bytes of every upload begun: at most max_total_bytes
        self._sent: dict[str, tuple[int, int]] = {}  # path -> (size, mtime_ns) last uploaded whole
        self._noticed: set[str] = set()  # at most MAX_COUNTED keys
        self._unnamed = 0  # things passed over past MAX_NOTICES
        self._full = False  # max_total_bytes reached: no more uploads
        self._lock = threading.Condition()  # guards _sent and _in_flight
        self._in_flight: str | None = None  # the path being uploaded
        self._late: str | None = None  # the path being uploaded when stop() gave up waiting
        self._window_start = clock()
        self._window_bytes = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop scanning: no upload begins once this is called. Waits (up to ``timeout``) for
        the thread to end; an upload it still has under way then is left to ``finish``."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        with self._lock:
            self._late = self._in_flight

    def finish(self, timeout: float) -> None:
        """Call after the final upload: an upload still under way when ``stop`` returned may
        have written its key after the final upload did, with older content. Wait for it (up to
        ``timeout``), then write that key again as the final upload does (or delete it when the
        file is no longer there to upload)."""
        with self._lock:
            late = self._late
            if late is None:
                return
            if not self._lock.wait_for(lambda: self._in_flight is None, timeout):
                log.warning("live outputs of %s: an upload of %s is still under way", self.prefix, late)
        try:
            if isinstance(upload_file(self.objects, self.root, self.prefix + late, late), str):
                self.objects.delete([self.prefix + late])
        except (RunplaneError, OSError) as e:
            log.warning("live outputs of %s: %s not written again after the final upload: %s", self.prefix, late, e)

    def _run(self) -> None:
        while not self._stopping.wait(self.limits.interval):
            try:
                self.scan_once()
            except Exception:  # never the run's end: the next scan tries again
                log.exception("live outputs of %s: scan failed", self.prefix)

    def scan_once(self) -> int:
        """One pass: upload what changed since its last upload, within the bounds. Returns how
        many files went up. Never raises for what the run wrote or the store answered."""
        if self._full or self.limits.max_total_bytes == 0:  # 0: no live uploads at all
            return 0
        files = self._files()
        uploaded = 0
        for rel in files:
            if self._stopping.is_set() or self._full:
                break
            if self._upload(rel):
                uploaded += 1
        return uploaded

    def drop_removed(self) -> None:
        """Delete the uploaded copies of files no longer in ``live/`` (called once the container
        has exited, before the final upload): the run's outputs are then what it left, not also
        what it wrote there for a while and removed (a file written aside and renamed into
        place, say). Each path uploaded is looked up itself: only one that is gone (or whose
        ``live/`` is) counts. A failure is logged: those copies stay."""
        with self._lock:
            sent = sorted(self._sent)
        if not sent:
            return
        everything = not os.path.lexists(self.root)
        gone = [self.prefix + rel for rel in sent if everything or self._gone(rel)]
        try:
            for start in range(0, len(gone), MAX_DELETE):
                self.objects.delete(gone[start : start + MAX_DELETE])
        except RunplaneError as e:
            log.warning("live outputs of %s: removed files' copies not deleted: %s", self.prefix, e)

    def summary(self, most: int = 5, without: frozenset[str] = frozenset()) -> str:
        """What was passed over, in a line: the first ``most`` things, then how many more; those in
        ``without`` (said elsewhere) left out. Empty when nothing is left."""
        notices = [n for n in self.notices if n not in without]
        more = max(0, len(notices) - most) + self._unnamed
        counted = "at least " if len(self._noticed) >= MAX_COUNTED else ""
        named = notices[:most]
        if more <= 0:
            return ", ".join(named)
        return ", ".join([*named, f"and {counted}{more} more"]) if named else f"{counted}{more} more"

    def _gone(self, rel: str) -> bool:
        try:
            os.close(open_beneath(self.root, rel))
        except Refused as e:
            return str(e) == _GONE
        return False

    def _files(self) -> list[str]:
        """The regular files and symlinks of ``live/`` (relative paths, sorted): the first
        ``max_files`` the walk meets, among at most ``max(MIN_ENTRIES, ENTRIES_PER_FILE *
        max_files)`` entries (a run that fills ``live/`` with directories or other files costs a
        scan no more than that)."""
        most = self.limits.max_files
        entries = max(MIN_ENTRIES, ENTRIES_PER_FILE * most)
        found: list[str] = []
        walk = scan(self.root)
        try:
            for seen, (prefix, entry) in enumerate(walk, 1):
                if seen > entries:
                    self._notice(":entries", f"{LIVE_DIR}/ holds more than {entries} entries: the rest is not read")
                    break
                if (judged := judge(prefix, entry)) is None:
                    continue
                rel, why = judged
                if why is not None:
                    self._notice(rel, f"{LIVE_DIR}/{_shown(rel)} ({why})")
                elif len(found) < most:
                    found.append(rel)
                else:
                    self._notice(":files", f"{LIVE_DIR}/ holds more than {most} files: only {most} are uploaded")
                    break
        except Unwalkable as e:  # its text may name this host's paths: the agent's log only
            log.info("live outputs of %s: %s", self.prefix, e)
            self._notice(":unwalkable", f"{LIVE_DIR}/ could not be read whole (not a directory, or too deep)")
        finally:
            walk.close()
        return sorted(found)

    def _upload(self, rel: str) -> bool:
        try:
            fd = open_beneath(self.root, rel)
        except Refused as e:
            if str(e) != _GONE:  # else removed since it was listed
                self._notice(rel, f"{LIVE_DIR}/{_shown(rel)} ({e})")
            return False
        try:
            return self._send(rel, fd)
        finally:
            os.close(fd)

    def _send(self, rel: str, fd: int) -> bool:
        """Upload exactly the bytes ``fd`` holds as fstat() sees it first, within the bounds; it
        counts as sent (not to be sent again until it changes) only if it did not change meanwhile."""
        st = os.fstat(fd)
        seen = (st.st_size, st.st_mtime_ns)
        files = max(MIN_ENTRIES, ENTRIES_PER_FILE * self.limits.max_files)
        with self._lock:
            if self._sent.get(rel) == seen:
                return False
            too_many = rel not in self._sent and len(self._sent) >= files
        most = min(self.limits.max_file_bytes, self.limits.bytes_per_minute)
        if st.st_size > most:
            self._notice(rel, f"{LIVE_DIR}/{_shown(rel)} (over {format_bytes(most)}: uploaded when the run ends)")
            return False
        if too_many:
            self._notice(":keys", f"{LIVE_DIR}/ had {files} different files uploaded: new ones wait for the end")
            return False
        if self.sent_bytes + st.st_size > self.limits.max_total_bytes:
            self._full = True
            total = format_bytes(self.limits.max_total_bytes)
            self._notice(":total", f"{LIVE_DIR}/ uploads stopped at {total} in all: the rest goes when the run ends")
            return False
        if not self._room(st.st_size):
            return False  # the next scans, once the minute allows it
        data = _read(fd, st.st_size)
        after = os.fstat(fd)
        whole = len(data) == st.st_size and (after.st_size, after.st_mtime_ns) == seen
        with self._lock:
            if self._stopping.is_set():  # the final upload may have begun: nothing more is written
                return False
            self._in_flight = rel
        self.sent_bytes += len(data)
        try:
            self.objects.put_bytes(self.prefix + rel, data)
        except (RunplaneError, OSError) as e:
            log.warning("live output %s of %s not uploaded (will retry): %s", rel, self.prefix, e)
            return False
        finally:
            with self._lock:
                self._in_flight = None
                self._lock.notify_all()
        with self._lock:
            if whole:  # else it changed while read: the next scan sends it again
                self._sent[rel] = seen
        self.uploads += 1
        return True

    def _room(self, size: int) -> bool:
        """Whether ``size`` more bytes fit in this minute's budget (counted when they do)."""
        now = self.clock()
        if now - self._window_start >= WINDOW_SECONDS:
            self._window_start, self._window_bytes = now, 0
        if self._window_bytes + size > self.limits.bytes_per_minute:
            return False
        self._window_bytes += size
        return True

    def _notice(self, key: str, text: str) -> None:
        """Say ``text`` once for ``key``: named among the first MAX_NOTICES (the fixed ``:`` keys
        always), counted after, up to MAX_COUNTED different keys."""
        fixed = key.startswith(":")
        if len(key) > SHOWN_CHARS:  # a long path is kept as its digest: distinct, and small
            key = hashlib.blake2b(key.encode(errors="surrogateescape"), digest_size=16).hexdigest()
        if key in self._noticed or (len(self._noticed) >= MAX_COUNTED and not fixed):
            return
        self._noticed.add(key)
        if fixed or len(self.notices) < MAX_NOTICES:
            self.notices.append(text)
            log.info("live outputs of %s: not uploaded while the run goes: %s", self.prefix, text)
            return
        self._unnamed += 1
        if self._unnamed == 1:
            log.info("live outputs of %s: more is passed over, counted but not named", self.prefix)


def _shown(rel: str) -> str:
    return rel if len(rel) <= SHOWN_CHARS else f"{rel[: SHOWN_CHARS - 3]}..."


def _read(fd: int, size: int) -> bytes:
    """The first ``size`` bytes of ``fd`` (fewer if it shrank meanwhile), never more."""
    parts: list[bytes] = []
    got = 0
    while got < size:
        part = os.pread(fd, min(size - got, 1 << 30), got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)
