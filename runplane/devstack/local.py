"""The local stack on one machine's terms: its stores in one SQLite database and a directory of
objects (runplane/adapters/local), signed object URLs answered by the front itself, the API
resolver called straight from the front with the API Gateway v2 event every front builds
(runplane/api/gateway.py), the events queue fed to the dispatcher with partial failures kept,
dispatcher and reaper on the schedule. Nothing is started
for the stores: they are files of the stack's directory, made by the stores themselves."""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from runplane import bootstrap
from runplane.adapters.local import object_urls
from runplane.adapters.local.db import DB_FILE, Database, state_path
from runplane.adapters.local.keyfile import KeyFileSealer
from runplane.adapters.local.object_urls import PATH_PREFIX
from runplane.adapters.local.queues import SqliteRunQueue
from runplane.api.gateway import http_event, response_parts
from runplane.api.http import app
from runplane.bootstrap import Stack
from runplane.devstack.cloud import Cloud, FrontRequest, FrontResponse
from runplane.devstack.lambda_shim import LambdaContext
from runplane.domain.errors import Misconfigured
from runplane.handlers import PoolDispatcher, run_reaper
from runplane.settings import StackSettings

__all__ = ["EVENTS_BATCH", "EVENTS_VISIBILITY", "LocalCloud"]

log = logging.getLogger(__name__)
EVENTS_BATCH = 10
"""Events handed to the dispatcher at once, as an SQS event source mapping's batch."""
EVENTS_VISIBILITY = 30
"""Seconds a received event stays invisible: one whose handling failed comes back after it."""


@dataclass(frozen=True)
class _Record:
    """What the dispatcher's record handler reads of a queue record."""

    body: str


class LocalCloud(Cloud):
    """``state_dir``: the stack's directory (database and objects); ``public_url``: where its front
    is reached, the start of the object URLs it signs."""

    services = "sqlite"

    def __init__(self, state_dir: Path, public_url: str) -> None:
        self.state_dir = state_path(state_dir)
        self.public_url = public_url
        self.endpoint = str(self.state_dir / DB_FILE)
        self._stack: Stack | None = None

    def start(self) -> dict[str, str]:
        return {}

    def settings(self) -> dict[str, str]:
        return {"state_dir": str(self.state_dir), "public_url": self.public_url}

    def build(self, settings: StackSettings) -> Stack:
        return bootstrap.build_stack(settings)

    def provision(self, stack: Stack) -> None:
        """Only the secrets key file to make (when missing): each store made its tables when built,
        and objects their directories when written."""
        if isinstance(stack.sealer, KeyFileSealer):
            stack.sealer.ready()
        self._stack = stack

    def _ports_stack(self) -> Stack:
        if self._stack is None:
            raise Misconfigured("the local stack is not provisioned")
        return self._stack

    def http(self, request: FrontRequest) -> FrontResponse:
        if request.path.startswith(PATH_PREFIX):  # a signed object URL: checked and served here
            answer = object_urls.serve(
                self.state_dir,
                self._ports_stack().tokens.secret,
                request.method,
                request.path,
                request.query,
                headers=request.headers,
                body=request.stream,
            )
            return FrontResponse(answer.status, answer.headers, answer.body, answer.file)
        event = http_event(
            request.method, request.path, request.query, request.headers, request.body, request.client_ip
        )
        # the resolver itself, not the Lambda handler around it (its Powertools logger and tracer
        # are the platform's): the same routes, auth and errors at a fraction of the cost
        result = app.resolve(event, LambdaContext(function_name="runplane-api"))
        return FrontResponse(*response_parts(result))

    def poll_events(self, stop: threading.Event) -> None:
        """What an event source mapping does: batches to the dispatcher; the events handled are
        deleted together once the batch is done (one write), one whose handling fails is not, and
        comes back after EVENTS_VISIBILITY (set aside after a few)."""
        stack = self._ports_stack()
        queue = stack.queue
        if not isinstance(queue, SqliteRunQueue):
            raise Misconfigured("the local stack's queue is not the SQLite queue")
        received = queue.receive_events(EVENTS_BATCH, 1.0, EVENTS_VISIBILITY)
        if not received:
            return
        handle = PoolDispatcher(stack.ports).record_handler()
        handled: list[str] = []
        for delivery in received:
            try:
                handle(_Record(delivery.body))
            except Exception:  # a partial failure: the others of the batch are done
                log.exception("dispatcher event failed; it is tried again: %.200s", delivery.body)
                continue
            handled.append(delivery.receipt)
        queue.delete_events(handled)

    def fire_schedule(self) -> None:
        ports = self._ports_stack().ports
        try:
            report = asdict(run_reaper(ports))
            if any(report.values()):
                log.info("reaped: %s", report)
        except Exception:
            log.exception("scheduled reaper failed")
        try:
            PoolDispatcher(ports).schedule()
        except Exception:
            log.exception("scheduled dispatcher failed")
        try:  # the write-ahead log back to nothing, when no reader is in the way: it never grows for good
            Database.at(self.state_dir).checkpoint()
        except Exception:
            log.exception("checkpoint of the database failed")

    def stop(self) -> None:
        self._stack = None
