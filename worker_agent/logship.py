"""Ship a container's output stream to object storage in offset-named chunks while it runs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

import docker.errors
import requests

from runplane.domain.errors import RunplaneError
from runplane.ports import ObjectStore
from runplane.services.logs import MAX_CHUNK, log_chunk_key
from worker_agent.masking import Masker, Patterns, masked_patterns

log = logging.getLogger(__name__)


class LogShipper:
    """Buffers one stream; ``flush`` uploads what is new as a chunk named by its start offset.

    ``write`` is called from the thread that follows the container; ``flush`` from the
    executor's loop, and from the follower when ``max_buffer`` bytes wait (which holds back the
    container's output meanwhile, so the buffer stays small). Flushes take turns; chunks are
    immutable, so readers never see a half-written log.
    """

    def __init__(
        self,
        objects: ObjectStore,
        run_id: str,
        attempt: int,
        stream: str,
        clock: Callable[[], float],
        flush_seconds: float = 1.0,
        max_buffer: int = 1024 * 1024,
    ) -> None:
        self.objects = objects
        self.run_id = run_id
        self.attempt = attempt
        self.stream = stream
        self.clock = clock
        self.flush_seconds = flush_seconds
        self.max_buffer = max_buffer
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._buffer = bytearray()
        self._flushed = 0
        self._last_flush = clock()
        self.tail = bytearray()  # last bytes, for failure messages

    def write(self, data: bytes) -> None:
        with self._lock:
            self._buffer += data
            self.tail = (self.tail + data)[-2048:]

    def pending(self) -> int:
        with self._lock:
            return len(self._buffer)

    def due(self) -> bool:
        pending = self.pending()
        return pending > 0 and (pending >= self.max_buffer or self.clock() - self._last_flush >= self.flush_seconds)

    def flush(self) -> None:
        """Upload the buffered bytes, in chunks of at most ``MAX_CHUNK`` (so that a reader finds
        each page's next chunk by its name). Raises BackendError; what was not uploaded stays
        buffered for a retry."""
        with self._flush_lock:
            with self._lock:
                waiting = len(self._buffer)
            while waiting > 0:
                with self._lock:
                    data = bytes(self._buffer[: min(waiting, MAX_CHUNK)])
                    offset = self._flushed
                self.objects.put_bytes(log_chunk_key(self.run_id, self.attempt, self.stream, offset), data)
                with self._lock:
                    del self._buffer[: len(data)]
                    self._flushed += len(data)
                    self._last_flush = self.clock()
                waiting -= len(data)


class RunLogs:
    """A run's stdout and stderr: read from the container's attached output stream as it comes
    (``follow``, on a thread of its own), kept up to ``max_log_size`` bytes in all, and shipped
    by one LogShipper per stream. ``received`` counts every byte the stream gave, those dropped
    past the limit too (``limits.log_over`` holds it against the limit). ``secrets``: values
    never shipped (each becomes ``MASK``), nor kept in the stderr tail a failure message quotes."""

    def __init__(
        self,
        objects: ObjectStore,
        run_id: str,
        attempt: int,
        clock: Callable[[], float],
        flush_seconds: float,
        max_log_size: int,
        secrets: Iterable[str] = (),
    ) -> None:
        self.run_id = run_id
        self.max_log_size = max_log_size
        self.received = 0
        self.kept = 0  # written by the follower thread only
        self.shippers = {s: LogShipper(objects, run_id, attempt, s, clock, flush_seconds) for s in ("stdout", "stderr")}
        self.maskers: dict[str, Masker] = {}
        self.mask(secrets)

    def mask(self, values: Iterable[str]) -> None:
        """Mask ``values`` (the run's secrets) in what is shipped from now on; none: nothing is
        masked, and reads go out as they come."""
        patterns = Patterns(masked_patterns(values))  # compiled once, for both streams
        maskers = {name: Masker(patterns) for name in self.shippers}
        self.maskers = {name: m for name, m in maskers.items() if m}

    def follow(self, stream: Any) -> None:
        """Ship stdout and stderr from the attached ``stream`` (demultiplexed: pairs of bytes or
        None) as they come, and read on to the end: the engine writes to this stream as the
        container writes, so a stream left unread would hold the container (and its kill) up."""
        try:
            for out, err in stream:
                for name, data in (("stdout", out), ("stderr", err)):
                    if data:
                        self.ship(name, data)
        except (docker.errors.APIError, requests.RequestException, OSError) as e:
            log.warning("run %s: the output stream ended early: %s", self.run_id, e)
        finally:
            stream.close()
            for name, masker in self.maskers.items():  # what each held back, masked
                self._keep(name, masker.end())

    def ship(self, stream: str, data: bytes) -> None:
        """Take in ``data``, at most up to the log limit, and drop the rest. A full buffer is
        uploaded here, which holds the container's output back meanwhile: the agent's memory stays
        bounded whatever a run prints. The run's secrets are masked first (``masking.Masker``)."""
        self.received += len(data)
        masker = self.maskers.get(stream)
        self._keep(stream, masker.feed(data) if masker is not None else data)

    def _keep(self, stream: str, data: bytes) -> None:
        room = self.max_log_size - self.kept
        if len(data) > room:
            data = data[: max(room, 0)]
        if not data:
            return
        self.kept += len(data)
        shipper = self.shippers[stream]
        shipper.write(data)
        if shipper.pending() >= shipper.max_buffer:
            self._flush(shipper)

    def flush(self, only_due: bool = False) -> None:
        """Upload what waits (with ``only_due``, only where it is due); a failed upload is logged
        and its bytes wait for the next flush."""
        for shipper in self.shippers.values():
            if not only_due or shipper.due():
                self._flush(shipper)

    def stderr_tail(self) -> bytes:
        return bytes(self.shippers["stderr"].tail)

    def _flush(self, shipper: LogShipper) -> None:
        try:
            shipper.flush()
        except RunplaneError as e:
            log.warning("run %s: log upload failed (will retry): %s", self.run_id, e)
