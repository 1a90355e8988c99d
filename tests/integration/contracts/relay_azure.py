"""The Azure relay as the session relay contract (relay_stacks.py) meets it: Web PubSub's stand-in
(runplane/devstack/webpubsub.py) with the hub's event handler at the function app's route
(functions/azure/relay.py's ``answer``, behind a loopback HTTP server), the relay's tickets checked
against a one-machine sessions store (what is under test is the relay, not the store)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import azure.functions as func

from functions.azure.relay import answer
from runplane import bootstrap
from runplane.adapters.azure.relay import HUB, TICKET_HEADER, WebPubSubAccess, WebPubSubSessionRelay, group
from runplane.devstack.webpubsub import MAX_MESSAGE, WebPubSubFake
from runplane.domain.sessions import BINARY
from runplane.settings import StackSettings
from tests.integration.contracts.relay_stacks import POOLS, RelayStack


class _Events(BaseHTTPRequestHandler):
    """The function app's event route: each request handed to the function as the host would."""

    protocol_version = "HTTP/1.1"
    relay: WebPubSubSessionRelay

    def _any(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        request = func.HttpRequest(
            method=self.command, url=f"http://127.0.0.1{self.path}", headers=dict(self.headers.items()), body=body
        )
        reply = answer(request, self.relay)
        self.send_response(reply.status_code)
        for name, value in reply.headers.items():
            if name.lower() != "content-length":
                self.send_header(name, value)
        content = reply.get_body()
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    do_POST = do_OPTIONS = _any

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def azure_relay(tmp_path: Path) -> Iterator[RelayStack]:
    settings = StackSettings(cloud="local", state_dir=str(tmp_path / "azure-relay"), pools=POOLS)
    stack = bootstrap.build_stack(settings)
    assert stack.sessions is not None
    now = [time.time()]
    fake = WebPubSubFake().start()
    relay = WebPubSubSessionRelay(WebPubSubAccess.parse(fake.connection_string), stack.sessions, clock=lambda: now[0])
    handler = type("Events", (_Events,), {"relay": relay})
    events = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    events.daemon_threads = True
    threading.Thread(target=events.serve_forever, daemon=True).start()
    fake.handle(HUB, f"http://127.0.0.1:{events.server_address[1]}/relay/events")

    def held(session_id: str) -> list[str]:
        return [side for side in ("client", "worker") if fake.connections(HUB, group(session_id, side))]

    try:
        yield RelayStack(
            "azure",
            relay,
            stack.sessions,
            now,
            relay.client_url,
            BINARY,
            relay.max_frame,
            held,
            filters_gone=False,
            other_kind_ends=False,
            ticket_header=TICKET_HEADER,
            largest_message=MAX_MESSAGE,
            extras={"fake": fake},
        )
    finally:
        fake.stop()
        events.shutdown()
        events.server_close()
