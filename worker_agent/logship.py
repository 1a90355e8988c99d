"""Ship a container's output stream to object storage in offset-named chunks while it runs."""

from __future__ import annotations

import threading
from collections.abc import Callable

from runplane.ports import ObjectStore
from runplane.services.logs import log_chunk_key


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
        """Upload the buffered bytes. Raises BackendError; the bytes stay buffered for a retry."""
        with self._flush_lock:
            with self._lock:
                if not self._buffer:
                    return
                data = bytes(self._buffer)
                offset = self._flushed
            self.objects.put_bytes(log_chunk_key(self.run_id, self.attempt, self.stream, offset), data)
            with self._lock:
                del self._buffer[: len(data)]
                self._flushed += len(data)
                self._last_flush = self.clock()
