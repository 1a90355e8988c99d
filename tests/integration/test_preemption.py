"""The preemption probes against fakes of the metadata services' wire protocols, served on
127.0.0.1: EC2's instance metadata (IMDSv2, tokens required), Azure's instance metadata and
scheduled events, and an operator's notice URL."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from worker_agent.preemption import Notice, PreemptionWatcher, make_probe

TOKEN_TTL = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN = "X-aws-ec2-metadata-token"
SPOT_TIME = 1505722920.0  # the spot instance-action's time, 2017-09-18T08:22:00Z
NOT_BEFORE = 1474309787.0  # the events' NotBefore, Mon, 19 Sep 2016 18:29:47 GMT


@dataclass
class Metadata:
    """What the fake metadata service answers, and the requests it saw."""

    spot_action: dict[str, str] | None = None  # EC2: the spot instance-action document, once given
    vm_name: str = "workers_3"  # Azure: the VM's name in a scale set ("<scale set>_<instance id>")
    events: list[dict[str, Any]] = field(default_factory=list)  # Azure: scheduled events
    incarnation: int = 1
    notice_status: int = 404  # the operator's notice URL
    tokens: set[str] = field(default_factory=set)
    seen: list[tuple[str, str, int]] = field(default_factory=list)  # (method, path, status answered)

    def paths(self, path: str) -> list[int]:
        return [status for _, p, status in self.seen if p == path]


def azure_event(event_type: str, *resources: str, status: str = "Scheduled") -> dict[str, Any]:
    """One event as Azure's scheduled events (api-version 2020-07-01) write it."""
    return {
        "EventId": f"602d9444-d2cd-49c7-8624-8643e71712{len(resources):02d}",
        "EventType": event_type,
        "ResourceType": "VirtualMachine",
        "Resources": list(resources),
        "EventStatus": status,
        "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
        "Description": "Virtual machine is being preempted.",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


class MetadataHandler(http.server.BaseHTTPRequestHandler):
    """EC2 and Azure instance metadata and a notice URL, answering from ``state``."""

    state: Metadata

    def _answer(self, status: int, body: bytes = b"", kind: str = "application/json") -> None:
        self.state.seen.append((self.command, urllib.parse.urlsplit(self.path).path, status))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:
        if self.path != "/latest/api/token":
            self._answer(404)
        elif not (self.headers.get(TOKEN_TTL) or "").isdigit() or not 1 <= int(self.headers[TOKEN_TTL]) <= 21600:
            self._answer(400)  # IMDSv2: the TTL header is required, 1 to 21600 seconds
        else:
            token = f"AQAEA{len(self.state.tokens):04d}token=="
            self.state.tokens.add(token)
            self._answer(200, token.encode(), "text/plain")

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        if url.path.startswith("/latest/"):
            self._ec2(url.path)
        elif url.path.startswith("/metadata/"):
            self._azure(url.path, urllib.parse.parse_qs(url.query))
        elif url.path == "/notice":
            self._answer(self.state.notice_status, b"{}")
        else:
            self._answer(404)

    def _ec2(self, path: str) -> None:
        if self.headers.get(TOKEN) not in self.state.tokens:
            self._answer(401)  # IMDSv2 required: no (valid) token, no answer
        elif path != "/latest/meta-data/spot/instance-action" or self.state.spot_action is None:
            self._answer(404)
        else:
            self._answer(200, json.dumps(self.state.spot_action).encode())

    def _azure(self, path: str, query: dict[str, list[str]]) -> None:
        if self.headers.get("Metadata") != "true" or "api-version" not in query:
            self._answer(400)  # Azure IMDS: "Bad Request" without the header or a version
        elif path == "/metadata/instance/compute":
            compute = {
                "azEnvironment": "AzurePublicCloud",
                "location": "westeurope",
                "name": self.state.vm_name,
                "osProfile": {"computerName": "workers000003"},  # the host name, not the VM's name
                "vmScaleSetName": "workers",
                "vmSize": "Standard_NC6s_v3",
            }
            self._answer(200, json.dumps(compute).encode())
        elif path == "/metadata/scheduledevents":
            doc = {"DocumentIncarnation": self.state.incarnation, "Events": self.state.events}
            self._answer(200, json.dumps(doc).encode())
        else:
            self._answer(404)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def metadata() -> Iterator[tuple[Metadata, str]]:
    state = Metadata()
    handler = type("Handler", (MetadataHandler,), {"state": state})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


# -- EC2 --------------------------------------------------------------------------------------


def test_ec2_without_a_notice_says_none(metadata):
    state, url = metadata
    assert make_probe("ec2", url)() is None
    # the 404 of a token-bearing request, not a refused one
    assert state.paths("/latest/meta-data/spot/instance-action") == [404]


def test_ec2_notice_is_read_with_an_imdsv2_token(metadata):
    state, url = metadata
    state.spot_action = {"action": "terminate", "time": "2017-09-18T08:22:00Z"}
    assert make_probe("ec2", url)() == Notice("EC2 spot instance-action: terminate at 2017-09-18T08:22:00Z", SPOT_TIME)
    assert state.paths("/latest/api/token") == [200]
    assert state.paths("/latest/meta-data/spot/instance-action") == [200]


def test_ec2_stop_action_is_a_notice_too(metadata):
    state, url = metadata
    state.spot_action = {"action": "stop", "time": "2017-09-18T08:22:00Z"}
    assert make_probe("ec2", url)() == Notice("EC2 spot instance-action: stop at 2017-09-18T08:22:00Z", SPOT_TIME)


def test_ec2_request_without_a_token_is_refused(metadata):
    """The fake is faithful to IMDSv2-required: the notice is out of reach without a token."""
    state, url = metadata
    state.spot_action = {"action": "terminate", "time": "2017-09-18T08:22:00Z"}
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{url}/latest/meta-data/spot/instance-action", timeout=5)
    assert refused.value.code == 401


# -- Azure ------------------------------------------------------------------------------------


def test_azure_without_events_says_none(metadata):
    state, url = metadata
    assert make_probe("azure", url)() is None
    assert state.paths("/metadata/scheduledevents") == [200]


def test_azure_preempt_of_this_vm_is_a_notice(metadata):
    state, url = metadata
    state.events = [azure_event("Preempt", "workers_3")]
    assert make_probe("azure", url)() == Notice("Azure scheduled event: Preempt for VM workers_3", NOT_BEFORE)


def test_azure_notice_goes_at_the_soonest_not_before_of_this_vms_events(metadata):
    state, url = metadata
    unknown, later, soonest, other = (
        azure_event("Preempt", "workers_3"),
        azure_event("Terminate", "workers_3"),
        azure_event("Terminate", "workers_3"),  # NotBefore: NOT_BEFORE
        azure_event("Preempt", "workers_7"),
    )
    unknown["NotBefore"] = ""  # Azure leaves it empty once an event has started
    later["NotBefore"] = "Mon, 19 Sep 2016 18:31:47 GMT"
    other["NotBefore"] = "Mon, 19 Sep 2016 18:20:00 GMT"  # another VM's: not ours
    state.events = [unknown, later, soonest, other]
    both = "Azure scheduled event: Preempt, Terminate for VM workers_3"
    assert make_probe("azure", url)() == Notice(both, NOT_BEFORE)
    state.events = [unknown, later]
    assert make_probe("azure", url)() == Notice(both, NOT_BEFORE + 120)
    state.events = [unknown]
    assert make_probe("azure", url)() == Notice("Azure scheduled event: Preempt for VM workers_3")


def test_azure_terminate_naming_this_vm_among_others_is_a_notice(metadata):
    state, url = metadata
    state.events = [azure_event("Terminate", "workers_1", "workers_3", status="Started")]
    assert make_probe("azure", url)() == Notice("Azure scheduled event: Terminate for VM workers_3", NOT_BEFORE)


@pytest.mark.parametrize("event_type", ["Preempt", "Terminate"])
def test_azure_event_for_another_vm_of_the_scale_set_is_not_ours(metadata, event_type):
    """Scheduled events reach every VM of a scale-set placement group: another VM's eviction
    must not stop this worker."""
    state, url = metadata
    state.events = [azure_event(event_type, "workers_7"), azure_event("Freeze", "workers_3")]
    probe = make_probe("azure", url)
    assert probe() is None
    assert state.paths("/metadata/scheduledevents") == [200]


def test_azure_names_match_exactly(metadata):
    state, url = metadata
    state.events = [azure_event("Preempt", "workers_33", "_workers_3", "WORKERS_3", "workers")]
    assert make_probe("azure", url)() is None


def test_azure_vm_name_is_read_once(metadata):
    state, url = metadata
    probe = make_probe("azure", url)
    assert [probe(), probe()] == [None, None]
    state.events = [azure_event("Preempt", "workers_3")]
    assert probe() == Notice("Azure scheduled event: Preempt for VM workers_3", NOT_BEFORE)
    assert state.paths("/metadata/instance/compute") == [200]
    assert state.paths("/metadata/scheduledevents") == [200, 200, 200]


def test_azure_events_do_not_count_while_the_vm_name_is_unknown(metadata):
    state, url = metadata
    state.events = [azure_event("Preempt", "workers_3")]
    probe = make_probe("azure", url + "/nowhere")  # instance metadata answers 404 there
    assert probe() is None
    assert state.paths("/nowhere/metadata/instance/compute") == [404]


# -- an operator's URL ------------------------------------------------------------------------


def test_url_answering_404_is_no_notice(metadata):
    state, url = metadata
    assert make_probe(f"{url}/notice")() is None
    assert state.paths("/notice") == [404]


def test_url_answering_200_is_a_notice(metadata):
    state, url = metadata
    state.notice_status = 200
    assert make_probe(f"{url}/notice")() == Notice(f"preemption notice at {url}/notice")


# -- the watcher ------------------------------------------------------------------------------


def _watch(probe: Callable[[], Notice | None]) -> tuple[PreemptionWatcher, list[Notice], threading.Event]:
    notices: list[Notice] = []
    noticed = threading.Event()

    def on_notice(notice: Notice) -> None:
        notices.append(notice)
        noticed.set()

    watcher = PreemptionWatcher(probe, on_notice, interval=0.01)
    watcher.start()
    return watcher, notices, noticed


def test_watcher_calls_back_once_when_the_notice_comes(metadata):
    state, url = metadata
    probe = make_probe(f"{url}/notice")
    calls = []

    def counted() -> Notice | None:
        calls.append(1)
        if len(calls) == 3:
            state.notice_status = 200
        return probe()

    watcher, notices, noticed = _watch(counted)
    assert noticed.wait(30)
    watcher.thread.join(30)
    assert not watcher.thread.is_alive()  # it ends after the notice
    assert notices == [Notice(f"preemption notice at {url}/notice")]
    assert state.paths("/notice") == [404, 404, 200]


def test_watcher_outlives_a_metadata_service_that_cannot_be_reached(metadata):
    state, url = metadata
    state.notice_status = 200
    with socket.socket() as closed:  # a port nobody listens on once this is closed
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}/notice"
    answers = iter([make_probe(nowhere), make_probe(f"{url}/notice")])

    def probe() -> Notice | None:
        return next(answers)()  # the first raises (connection refused), the second answers

    watcher, notices, noticed = _watch(probe)
    assert noticed.wait(30)
    assert notices == [Notice(f"preemption notice at {url}/notice")]
    watcher.stop()
