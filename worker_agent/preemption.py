"""Watch the cloud's notice that this machine is about to be taken away (spot/preemptible),
and treat it like SIGTERM with pass-down: stop runs, hand them back, exit.

- ec2:   instance metadata ``/latest/meta-data/spot/instance-action`` (IMDSv2 token, v1 fallback):
         404 normally, 200 with ``{"action": "terminate", ...}`` two minutes before.
- azure: scheduled events ``/metadata/scheduledevents`` (header ``Metadata: true``): an event of
         type Preempt or Terminate whose ``Resources`` name this VM. Events reach every VM of an
         availability set or scale-set placement group, so one naming another VM is not ours;
         this VM's name is read once from ``/metadata/instance/compute`` (``name``).
- an http(s) URL: any 200 answer is a notice.

A notice carries, when it says, the moment the machine goes (EC2's ``time``, Azure's ``NotBefore``):
a run handed back ends its grace and final sync before it (``stop_window``).
"""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

log = logging.getLogger(__name__)
METADATA_URL = "http://169.254.169.254"
AZURE_EVENTS = "/metadata/scheduledevents?api-version=2020-07-01"
AZURE_COMPUTE = "/metadata/instance/compute?api-version=2021-02-01"
# the event types that take the VM away: a Spot eviction, and a scale set deleting the VM
AZURE_LEAVING = ("Preempt", "Terminate")


@dataclass(frozen=True)
class Notice:
    """A preemption notice: what it says, and when the machine goes (seconds since the epoch), if it says."""

    text: str
    leaves_at: float | None = None


def _epoch(moment: datetime) -> float:
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


def ec2_time(value: object) -> float | None:
    """EC2's instance-action ``time`` (ISO 8601 UTC: ``2017-09-18T08:22:00Z``) in seconds since the
    epoch; None for anything else."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return _epoch(datetime.fromisoformat(value.strip().replace("Z", "+00:00")))
    except ValueError:
        return None


def azure_not_before(value: object) -> float | None:
    """Azure's scheduled event ``NotBefore`` (an HTTP date, RFC 1123: ``Mon, 19 Sep 2016 18:29:47 GMT``;
    empty when the event has none) in seconds since the epoch; None for anything else."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return _epoch(email.utils.parsedate_to_datetime(value))
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _get(url: str, headers: dict[str, str], timeout: float = 2) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers)  # noqa: S310 - metadata endpoint or an operator's URL
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def _json_object(body: bytes) -> dict[str, object]:
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def ec2_notice(base: str) -> Notice | None:
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
    notice = _json_object(body)  # {"action": "terminate" | "stop" | "hibernate", "time": "...Z"}
    when = f" at {notice['time']}" if notice.get("time") else ""
    text = f"EC2 spot instance-action: {notice.get('action') or 'terminate'}{when}"
    return Notice(text, ec2_time(notice.get("time")))


class AzureNotices:
    """The probe of Azure's scheduled events: a notice when a Preempt or Terminate event names
    this VM in its ``Resources`` (by its name in instance metadata, e.g. ``workers_3`` in a scale
    set: the names match exactly). The name is read at the first probe and kept; while it cannot
    be read, no event counts (the next probe asks again)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.vm_name: str | None = None

    def _vm_name(self) -> str | None:
        if self.vm_name is None:
            status, body = _get(self.base + AZURE_COMPUTE, {"Metadata": "true"})
            name = _json_object(body).get("name") if status == 200 else None
            if isinstance(name, str) and name:
                self.vm_name = name
            else:
                log.warning("cannot read this VM's name from instance metadata (HTTP %s)", status)
        return self.vm_name

    def __call__(self) -> Notice | None:
        name = self._vm_name()
        if name is None:
            return None
        status, body = _get(self.base + AZURE_EVENTS, {"Metadata": "true"})
        events = _json_object(body).get("Events") if status == 200 else None
        if not isinstance(events, list):
            return None
        ours = [
            e
            for e in events
            if isinstance(e, dict)
            and e.get("EventType") in AZURE_LEAVING
            and isinstance(e.get("Resources"), list)
            and name in e["Resources"]
        ]
        if not ours:
            return None
        kinds = sorted({str(e["EventType"]) for e in ours})
        moments = [t for t in (azure_not_before(e.get("NotBefore")) for e in ours) if t is not None]
        # the soonest of them: without a NotBefore an event may start at once, yet what it would be is unknown
        return Notice(f"Azure scheduled event: {', '.join(kinds)} for VM {name}", min(moments, default=None))


def url_notice(url: str) -> Notice | None:
    status, _ = _get(url, {})
    return Notice(f"preemption notice at {url}") if status == 200 else None


def make_probe(kind: str, metadata_url: str = METADATA_URL) -> Callable[[], Notice | None]:
    """A function that returns a notice, or None. Raises ValueError for an unknown kind."""
    if kind == "ec2":
        return lambda: ec2_notice(metadata_url)
    if kind == "azure":
        return AzureNotices(metadata_url)
    if kind.startswith(("http://", "https://")):
        return lambda: url_notice(kind)
    raise ValueError(f"--preemption-watch must be ec2, azure or an http(s) URL, got {kind!r}")


class PreemptionWatcher:
    def __init__(
        self, probe: Callable[[], Notice | None], on_notice: Callable[[Notice], None], interval: float = 5
    ) -> None:
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
            except (OSError, http.client.HTTPException) as e:  # URLError is an OSError
                log.debug("preemption probe failed: %s", e)
                notice = None
            if notice:
                log.warning("%s: handing runs back and exiting", notice.text)
                self.on_notice(notice)
                return
            self._stop.wait(self.interval)
