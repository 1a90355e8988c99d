"""Outputs while the run goes: what a run writes under its output directory's ``live/`` is
uploaded as it changes, to the keys its final upload writes too, so a long run's plots and
metrics can be read before it ends.

A thread scans ``live/`` every ``interval`` seconds and uploads the files whose size or time of
change moved since their last upload. Bounded: at most ``max_files`` files are looked at, a
file over ``max_file_bytes`` is passed over (said once), and at most ``bytes_per_minute`` go up
a minute. Files are read as the final upload reads them (``trees.open_beneath``: never through
a symlink out of the tree; fifos, devices and sockets are passed over without being read). A
failed upload is tried again at the next scan and never fails the run. The final upload writes
every file again once the container has exited, after this thread stopped."""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runplane.domain.errors import RunplaneError
from runplane.domain.units import format_bytes
from runplane.ports import MAX_DELETE, ObjectStore
from worker_agent.settings import default
from worker_agent.trees import Refused, Unwalkable, open_beneath, scan

log = logging.getLogger(__name__)

LIVE_DIR = "live"
"""The directory of a run's output directory whose files are uploaded while it runs."""
WINDOW_SECONDS = 60.0
"""The span ``bytes_per_minute`` counts over."""
ENTRIES_PER_FILE, MIN_ENTRIES = 10, 1000
"""A scan reads at most this many entries of ``live/`` a file it may upload (and at least the latter)."""


@dataclass(frozen=True)
class LiveLimits:
    interval: float = default("live_interval")  # seconds between two scans
    max_files: int = default("live_max_files")  # files looked at in live/ (the first the walk meets)
    max_file_bytes: int = default("live_max_file_bytes")  # larger ones are uploaded only when the run ends
    bytes_per_minute: int = default("live_bytes_per_minute")  # uploaded a minute, the run's files together


class LiveOutputs:
    """The live uploads of one run: ``root`` is the run's ``live/`` directory on this host,
    ``prefix`` the key its files go under (``outputs_prefix(run, attempt) + "live/"``).
    ``scan_once`` is one pass (the thread's, or a test's); ``start`` and ``stop`` run passes on
    a thread of its own. ``notices`` says what was passed over, each thing once."""

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
        self._sent: dict[str, tuple[int, int]] = {}  # path -> (size, mtime_ns) last uploaded
        self._noticed: set[str] = set()
        self._window_start = clock()
        self._window_bytes = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop scanning, and wait (up to ``timeout``) for an upload under way to end: nothing
        of this thread writes once the final upload begins."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping.wait(self.limits.interval):
            try:
                self.scan_once()
            except Exception:  # never the run's end: the next scan tries again
                log.exception("live outputs of %s: scan failed", self.prefix)

    def scan_once(self) -> int:
        """One pass: upload what changed since its last upload, within the bounds. Returns how
        many files went up. Never raises for what the run wrote or the store answered."""
        files = self._files()
        uploaded = 0
        for rel in files:
            if self._stopping.is_set():
                break
            if self._upload(rel):
                uploaded += 1
        return uploaded

    def drop_removed(self) -> None:
        """Delete the uploaded copies of files no longer in ``live/`` (called once the container
        has exited, before the final upload): the run's outputs are then what it left, not also
        what it wrote there for a while and removed (a file written aside and renamed into
        place, say). A failure is logged: those copies stay."""
        if not self._sent:
            return
        there = set(self._files())
        gone = sorted(self.prefix + rel for rel in self._sent if rel not in there)
        try:
            for start in range(0, len(gone), MAX_DELETE):
                self.objects.delete(gone[start : start + MAX_DELETE])
        except RunplaneError as e:
            log.warning("live outputs of %s: removed files' copies not deleted: %s", self.prefix, e)

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
                rel = prefix + entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        continue
                    regular = entry.is_symlink() or entry.is_file(follow_symlinks=False)
                except OSError:  # gone meanwhile
                    continue
                if not regular:
                    self._notice(rel, f"{LIVE_DIR}/{rel} (not a regular file)")
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
            if str(e) == os.strerror(errno.ENOENT):  # removed since it was listed
                return False
            self._notice(rel, f"{LIVE_DIR}/{rel} ({e})")
            return False
        try:
            st = os.fstat(fd)
            seen = (st.st_size, st.st_mtime_ns)
            if self._sent.get(rel) == seen:
                return False
            most = min(self.limits.max_file_bytes, self.limits.bytes_per_minute)
            if st.st_size > most:
                self._notice(rel, f"{LIVE_DIR}/{rel} (over {format_bytes(most)}: uploaded when the run ends)")
                return False
            if not self._room(st.st_size):
                return False  # the next scans, once the minute allows it
            try:
                # /proc/self/fd/N is this very open file, whatever happens to the tree meanwhile
                self.objects.put_file(self.prefix + rel, Path(f"/proc/self/fd/{fd}"))
            except (RunplaneError, OSError) as e:
                log.warning("live output %s of %s not uploaded (will retry): %s", rel, self.prefix, e)
                return False
            self._sent[rel] = seen
            self.uploads += 1
            return True
        finally:
            os.close(fd)

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
        if key in self._noticed:
            return
        self._noticed.add(key)
        self.notices.append(text)
        log.info("live outputs of %s: not uploaded while the run goes: %s", self.prefix, text)
