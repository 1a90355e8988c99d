"""Watch the cloud's notice that this machine is about to be taken away (spot/preemptible),
and treat it like SIGTERM with pass-down: stop runs, hand them back, exit.

- ec2:   instance metadata ``/latest/meta-data/spot/instance-action`` (IMDSv2 token, v1 fallback):
         404 normally, 200 with ``{"action": "terminate", ...}`` two minutes before.
- azure: scheduled events ``/metadata/scheduledevents`` (header ``Metadata: true``): an event of
         type Preempt or Terminate.
- an http(s) URL: any 200 answer is a notice.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable

log = logging.getLogger(__name__)
METADATA_URL = "http://169.254.169.254"


def _get(url: str, headers: dict[str, str], timeout: float = 2) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers)  # noqa: S310 - metadata endpoint or an operator's URL
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def ec2_notice(base: str) -> str | None:
    headers: dict[str, str] = {}
    try:
        req = urllib.request.Request(  # noqa: S310
            f"{base}/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
        )
        with urllib.request.urlopen(req, timeout=2) as resp:  # noqa: S310
            headers["X-aws-ec2-metadata-token"] = resp.read().decode()
    except (urllib.error.URLError, OSError):
        pass  # IMDSv1
    status, body = _get(f"{base}/latest/meta-data/spot/instance-action", headers)
    if status != 200:
        return None
    try:
        action = json.loads(body).get("action", "terminate")
    except ValueError:
        action = "terminate"
    return f"EC2 spot instance-action: {action}"


def azure_notice(base: str) -> str | None:
    status, body = _get(f"{base}/metadata/scheduledevents?api-version=2020-07-01", {"Metadata": "true"})
    if status != 200:
        return None
    try:
        events = json.loads(body).get("Events", [])
    except ValueError:
        return None
    kinds = sorted({e.get("EventType") for e in events if e.get("EventType") in ("Preempt", "Terminate")})
    return f"Azure scheduled event: {', '.join(kinds)}" if kinds else None


def url_notice(url: str) -> str | None:
    status, _ = _get(url, {})
    return f"preemption notice at {url}" if status == 200 else None


def make_probe(kind: str, metadata_url: str = METADATA_URL) -> Callable[[], str | None]:
    """A function that returns a notice, or None. Raises ValueError for an unknown kind."""
    if kind == "ec2":
        return lambda: ec2_notice(metadata_url)
    if kind == "azure":
        return lambda: azure_notice(metadata_url)
    if kind.startswith(("http://", "https://")):
        return lambda: url_notice(kind)
    raise ValueError(f"--preemption-watch must be ec2, azure or an http(s) URL, got {kind!r}")


class PreemptionWatcher:
    def __init__(self, probe: Callable[[], str | None], on_notice: Callable[[str], None], interval: float = 5) -> None:
        self.probe = probe
        self.on_notice = on_notice
        self.interval = interval
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="preemption", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                notice = self.probe()
            except (urllib.error.URLError, OSError) as e:
                log.debug("preemption probe failed: %s", e)
                notice = None
            if notice:
                log.warning("%s: handing runs back and exiting", notice)
                self.on_notice(notice)
                return
            self._stop.wait(self.interval)
