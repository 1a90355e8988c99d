"""The local stack on AWS terms: moto's server for DynamoDB/SQS/S3, API Gateway v2 events for the
API function, SQS batches for the dispatcher (as an event source mapping with partial batch
responses), scheduled events for dispatcher and reaper.

moto's DynamoDB makes a conditional write atomic against a racing one only through the lock its
process wraps around each request (moto_process.py), and its queries read the whole table; tables
on dynalite behave as DynamoDB's do. So a stack that starts its own moto puts its tables on a
dynalite of its own (dynalite.py) where dynalite is installed (else on moto, said in the log);
one given its tables' endpoint (``DevConfig(settings={"dynamodb_endpoint_url": URL})``, as the
benchmarks and the race tests do) uses that.

Sessions meet as on AWS: at a fake of the relay's WebSocket API (apigw_ws.py) on a loopback port of
its own, whose routes are the relay function of this process (functions/aws/relay.py), its
connections in the stack's relay table."""

from __future__ import annotations

import logging
import threading
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from functions.aws import api, dispatcher, reaper, relay
from runplane import bootstrap
from runplane.adapters.aws.provision import provision
from runplane.adapters.aws.sqs import events_queue_name
from runplane.api.gateway import http_event, response_parts
from runplane.bootstrap import Stack
from runplane.devstack.apigw_ws import ApiGatewayWebSocket
from runplane.devstack.cloud import Cloud, FrontRequest, FrontResponse
from runplane.devstack.dynalite import DynaliteProcess, dynalite_command
from runplane.devstack.lambda_shim import LambdaContext, scheduled_event, sqs_event
from runplane.devstack.moto_process import MotoProcess
from runplane.domain.errors import BackendError
from runplane.settings import StackSettings

log = logging.getLogger(__name__)


REGION = "us-east-1"
KEYS = ("testing", "testing")
"""The access key id and secret the local stack signs with: moto takes any."""


class AwsCloud(Cloud):
    services = "moto"

    def __init__(self, endpoint_url: str | None = None, tables_on_dynalite: bool = False) -> None:
        self.endpoint = endpoint_url or ""
        self._moto: MotoProcess | None = None
        self._tables_on_dynalite = tables_on_dynalite
        self._dynalite: DynaliteProcess | None = None
        self._tables = ""
        self._clients: dict[str, Any] = {}
        self._prefix = ""
        self._events: tuple[Any, str, str] | None = None
        self._relay: ApiGatewayWebSocket | None = None

    def start(self) -> dict[str, str]:
        if not self.endpoint:  # moto in a process of its own (moto_process.py)
            self._moto = MotoProcess()
            self.endpoint = self._moto.start()
            if self._tables_on_dynalite:
                self._start_dynalite()
        self._relay = ApiGatewayWebSocket(relay.lambda_handler)
        self._relay.start()
        key_id, secret = KEYS
        return {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": REGION}

    def _start_dynalite(self) -> None:
        command = dynalite_command()
        if command is None:
            log.warning("dynalite is not installed (scripts/start-dynalite.sh --install): the tables are on moto")
            return
        self._dynalite = DynaliteProcess(command)
        try:
            self._tables = self._dynalite.start()
        except BackendError as e:
            self._dynalite = None
            log.warning("%s: the tables are on moto", e)
            return
        self.services = "moto, tables on dynalite"

    def settings(self) -> dict[str, str]:
        tables = {"dynamodb_endpoint_url": self._tables} if self._tables else {}
        sessions = {"relay_url": self._relay.url} if self._relay is not None else {}
        return {"aws_endpoint_url": self.endpoint, "aws_region": REGION, **tables, **sessions}

    def build(self, settings: StackSettings) -> Stack:
        self._clients = bootstrap.aws_clients(settings, KEYS)
        self._prefix = settings.prefix
        return bootstrap.build_stack(settings, self._clients)

    def provision(self, stack: Stack) -> None:
        """Raises BackendError when the endpoint cannot be reached or refuses."""
        clients = self._clients
        try:
            provision(
                bootstrap.aws_names(stack.settings),
                [p.name for p in stack.pools.pools],
                clients["dynamodb"],
                clients["sqs"],
                clients["s3"],
                kms=clients["kms"],
            )
        except (BotoCoreError, ClientError) as e:
            raise BackendError(f"provision stack at {self.endpoint}: {e}") from e

    def http(self, request: FrontRequest) -> FrontResponse:
        event = http_event(
            request.method, request.path, request.query, request.headers, request.body, request.client_ip
        )
        # one thread per request, as Lambda runs one sandbox per concurrent request (the
        # resolver keeps each thread's request apart: runplane/api/resolver.py)
        result = api.lambda_handler(event, LambdaContext(function_name="runplane-api"))
        return FrontResponse(*response_parts(result))

    def poll_events(self, stop: threading.Event) -> None:
        """What an SQS event source mapping does: batches to the dispatcher, partial failures kept."""
        if self._events is None:
            sqs = self._clients["sqs"]
            url = sqs.get_queue_url(QueueName=events_queue_name(self._prefix))["QueueUrl"]
            arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            self._events = (sqs, url, arn)
        sqs, url, arn = self._events
        messages = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=30
        ).get("Messages", [])
        if not messages:
            return
        result = dispatcher.lambda_handler(sqs_event(messages, arn), LambdaContext("runplane-dispatcher"))
        failed = {f["itemIdentifier"] for f in result.get("batchItemFailures", [])}
        for m in messages:
            if m["MessageId"] not in failed:
                sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])

    def fire_schedule(self) -> None:
        for name in ("reaper", "dispatcher"):
            self.fire(name)

    @staticmethod
    def fire(name: str) -> None:
        """One scheduled invocation of the reaper or the dispatcher; a failure is logged."""
        handler = {"reaper": reaper.lambda_handler, "dispatcher": dispatcher.lambda_handler}[name]
        try:
            handler(scheduled_event(f"runplane-{name}"), LambdaContext(f"runplane-{name}"))
        except Exception:
            log.exception("scheduled %s failed", name)

    def stop(self) -> None:
        if self._relay is not None:  # first: its connections' $disconnect still reach the tables
            self._relay.stop()
            self._relay = None
        if self._moto is not None:
            self._moto.stop()
            self._moto = None
        if self._dynalite is not None:
            self._dynalite.stop()
            self._dynalite = None
