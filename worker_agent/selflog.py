"""The agent's own log, kept in its work dir and copied to object storage, so it outlives the VM."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from runplane.domain.errors import RunplaneError
from runplane.ports import ObjectStore

log = logging.getLogger(__name__)


class LogUploader:
    """Copies ``path`` to ``<prefix>/<worker_id>/agent.log`` every ``interval`` seconds and at ``stop``."""

    def __init__(self, objects: ObjectStore, path: Path, prefix: str, worker_id: str, interval: float = 300) -> None:
        self.objects = objects
        self.path = path
        self.key = f"{prefix.strip('/')}/{worker_id}/agent.log"
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="log-upload", daemon=True)

    def attach(self) -> None:
        """Send every log record to the file too, and start the periodic copy."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(self.path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)
        self._thread.start()

    def upload(self) -> None:
        try:
            self.objects.put_file(self.key, self.path)
        except (RunplaneError, OSError) as e:
            log.warning("could not upload the agent log: %s", e)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.upload()

    def stop(self) -> None:
        self._stop.set()
        self.upload()
