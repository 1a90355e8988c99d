"""The whole topology on one machine: moto's server for DynamoDB/SQS/S3, an HTTP front that
feeds API Gateway v2 events to the API handler, a poller that feeds SQS batches to the
dispatcher handler, a schedule for dispatcher and reaper, and local agents on real Docker.

Handlers run unchanged: they read RUNPLANE_* settings from the environment like in Lambda.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from functions.aws import api, dispatcher, reaper
from runplane import bootstrap
from runplane.adapters.aws.provision import provision
from runplane.adapters.aws.sqs import events_queue_name
from runplane.devstack.lambda_shim import LambdaContext, http_event, scheduled_event, sqs_event
from runplane.domain.models import Principal
from runplane.domain.pools import dump_pools, load_pools
from runplane.services.auth import new_token, register_token

log = logging.getLogger(__name__)
MAX_REQUEST = 10 * 1024 * 1024
DEV_FILE = Path("~/.runplane/dev.json").expanduser()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class DevConfig:
    port: int = 8080
    token: str | None = None
    user: str = "dev"
    workers: int | None = None
    pools_file: str | None = None
    aws_endpoint_url: str | None = None
    prefix: str = "runplane"
    schedule_seconds: float = 5.0
    agent_args: str = ""
    state_dir: Path = field(default_factory=lambda: Path("~/.runplane/dev").expanduser())
    write_dev_file: bool = True


class _Front(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out at once, not after a delayed ACK
    server_version = "runplane-dev"

    def _handle(self) -> None:
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_REQUEST:
            self._reply(
                413,
                {"content-type": "application/json"},
                json.dumps({"error": {"code": "payload_too_large", "message": "request body too large"}}),
            )
            return
        body = self.rfile.read(length) if length else b""
        event = http_event(self.command, path, query, dict(self.headers.items()), body, self.client_address[0])
        result = api.lambda_handler(event, LambdaContext(function_name="runplane-api"))
        headers = {k.lower(): v for k, v in (result.get("headers") or {}).items()}
        for key, values in (result.get("multiValueHeaders") or {}).items():
            headers[key.lower()] = ", ".join(values)
        self._reply(int(result["statusCode"]), headers, result.get("body") or "")

    def _reply(self, status: int, headers: dict[str, str], body: str) -> None:
        data = body.encode()
        self.send_response(status)
        for key, value in headers.items():
            if key not in ("content-length", "connection"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()  # buffered; the flush below sends headers and body together
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.client_address[0], *args)


class DevStack:
    """Start with ``start()``; ``stop()`` ends agents and servers. Not re-entrant."""

    def __init__(self, config: DevConfig) -> None:
        self.config = config
        self.token = config.token or new_token()
        self._moto: Any = None
        self._http: ThreadingHTTPServer | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.api_url = f"http://127.0.0.1:{config.port}"

    def _pools_text(self) -> str:
        pools = load_pools(self.config.pools_file or bootstrap.default_pools_text())
        if self.config.pools_file is None:  # the built-in pool takes this machine's shape
            for pool in pools.pools:
                pool.cpus = float(os.cpu_count() or 1)
                pool.memory = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.8)
        if self.config.workers is not None:
            for pool in pools.pools:
                if pool.backend == "local":
                    pool.max_workers = self.config.workers
                    pool.min_workers = min(pool.min_workers, self.config.workers)
        return dump_pools(pools)

    def _environment(self, endpoint: str) -> dict[str, str]:
        state = self.config.state_dir / str(self.config.port)
        return {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "RUNPLANE_AWS_ENDPOINT_URL": endpoint,
            "RUNPLANE_AWS_REGION": "us-east-1",
            "RUNPLANE_PREFIX": self.config.prefix,
            "RUNPLANE_POOLS": self._pools_text(),
            "RUNPLANE_LOCAL_STATE_DIR": str(state / "workers"),
            "RUNPLANE_AGENT_WORK_DIR": str(state / "agents"),
            "RUNPLANE_AGENT_ARGS": self.config.agent_args,
            "RUNPLANE_WORKER_STALE_SECONDS": "30",
            "RUNPLANE_REHINT_SECONDS": "60",
            "POWERTOOLS_METRICS_DISABLED": "true",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_METRICS_NAMESPACE": "runplane",
            "POWERTOOLS_LOG_LEVEL": "WARNING",
        }

    def start(self) -> None:
        endpoint = self.config.aws_endpoint_url
        if endpoint is None:
            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.ERROR)
            moto_port = free_port()
            self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=moto_port, verbose=False)
            self._moto.start()
            endpoint = f"http://127.0.0.1:{moto_port}"
        self.endpoint = endpoint
        os.environ.update(self._environment(endpoint))
        bootstrap.stack.cache_clear()
        stack = bootstrap.stack()
        clients = bootstrap.aws_clients(stack.settings)
        provision(
            bootstrap.aws_names(stack.settings),
            [p.name for p in stack.pools.pools],
            clients["dynamodb"],
            clients["sqs"],
            clients["s3"],
        )
        register_token(stack.tokens, self.token, Principal(user=self.config.user))
        self._http = ThreadingHTTPServer(("127.0.0.1", self.config.port), _Front)
        self._http.daemon_threads = True
        self.api_url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._spawn(self._http.serve_forever, "http-front")
        self._spawn(self._poll_events, "dispatch-poller")
        self._spawn(self._schedule, "schedule")
        if self.config.write_dev_file:
            DEV_FILE.parent.mkdir(parents=True, exist_ok=True)
            DEV_FILE.write_text(json.dumps({"api_url": self.api_url, "token": self.token}))
            DEV_FILE.chmod(0o600)

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _poll_events(self) -> None:
        """What an SQS event source mapping does: batches to the dispatcher, partial failures kept."""
        stack = bootstrap.stack()
        sqs = bootstrap.aws_clients(stack.settings)["sqs"]
        url = sqs.get_queue_url(QueueName=events_queue_name(stack.settings.prefix))["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        while not self._stop.is_set():
            try:
                messages = sqs.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=30
                ).get("Messages", [])
                if not messages:
                    continue
                result = dispatcher.lambda_handler(sqs_event(messages, arn), LambdaContext("runplane-dispatcher"))
                failed = {f["itemIdentifier"] for f in result.get("batchItemFailures", [])}
                for m in messages:
                    if m["MessageId"] not in failed:
                        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            except Exception:
                if not self._stop.is_set():
                    log.exception("dispatcher poll failed")
                    self._stop.wait(1)

    def _schedule(self) -> None:
        while not self._stop.wait(self.config.schedule_seconds):
            for handler, name in ((reaper.lambda_handler, "reaper"), (dispatcher.lambda_handler, "dispatcher")):
                try:
                    handler(scheduled_event(f"runplane-{name}"), LambdaContext(f"runplane-{name}"))
                except Exception:
                    log.exception("scheduled %s failed", name)

    def stop(self) -> None:
        self._stop.set()
        stack = bootstrap.stack()
        for pool in stack.pools.pools:
            if pool.backend == "local":
                backend = stack.backend(pool)
                for job in backend.list(pool):
                    backend.cancel(pool, job.id)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._moto is not None:
            self._moto.stop()
