"""The whole topology on one machine, on either cloud's terms: the cloud's stores (moto's server
for DynamoDB/SQS/S3, or Azurite for Table/Queue/Blob), an HTTP front that hands requests to the
cloud's API function (API Gateway v2 events to the Lambda handler, or ``func.HttpRequest``s to
the Azure HTTP function), a poller that feeds the events queue to the dispatcher function as the
platform's trigger would, a schedule for dispatcher and reaper, and local agents on real Docker.

Functions run unchanged: they serve the process's stack (``bootstrap.stack()``), which ``start``
builds from the local stack's settings and hands over (``bootstrap.use``), never through this
process's environment; so one process holds one stack (see ``process.py`` for a second). Its other
processes (agents, functions of their own) get the settings in their environment
(``DevStack.environment``), as in Lambda or an Azure Functions worker.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from runplane import bootstrap, extras
from runplane.compute.local.compute import LocalCompute
from runplane.compute.registry import check_pool
from runplane.devstack.cloud import Cloud
from runplane.devstack.ending import STOP_REASON, end_runs
from runplane.devstack.front import FrontServer
from runplane.devstack.net import free_port
from runplane.domain.errors import RunplaneError
from runplane.domain.pools import dump_pools, load_pools
from runplane.domain.tenancy import SCOPES
from runplane.services.auth import new_token, register_token
from runplane.settings import StackSettings

__all__ = ["DEV_FILE", "STOP_REASON", "DevConfig", "DevStack", "free_port"]

log = logging.getLogger(__name__)
DEV_FILE = Path("~/.runplane/dev.json").expanduser()
# How long each step of stop() may take, about ten seconds in all: the front, the poller and the
# schedule finish what they are doing; agents stop their killed runs' containers and record the
# end (they look for kills every second); agents whose runs have ended exit by themselves (one in
# a long poll takes seconds: it is killed instead); a killed agent's process goes.
JOIN_SECONDS = 2.0
POWERTOOLS = {
    "POWERTOOLS_METRICS_DISABLED": "true",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_METRICS_NAMESPACE": "runplane",
    "POWERTOOLS_LOG_LEVEL": "WARNING",
}
"""Powertools' switches for the stack's functions: no metric documents, no tracing, warnings and up.
Powertools reads them from the environment alone, so ``start`` sets those this process has not
set (the one change it makes to its environment, which ``stop`` takes back); its other processes
get them in ``environment``."""


@dataclass
class DevConfig:
    port: int = 8080
    token: str | None = None
    user: str = "dev"
    workers: int | None = None
    pools_file: str | None = None
    cloud: str = "aws"
    """Whose functions and stores: "aws" (moto) or "azure" (Azurite)."""
    aws_endpoint_url: str | None = None
    """AWS: an endpoint serving DynamoDB/SQS/S3 (moto, LocalStack); none starts moto (a process of its own)."""
    azure_connection_string: str | None = None
    """Azure: a storage connection string; none starts Azurite (runplane/devstack/azurite.py)."""
    prefix: str = "runplane"
    schedule_seconds: float = 5.0
    agent_args: str = ""
    input_buckets: str = ""
    """Buckets runs may read inputs from (RUNPLANE_INPUT_BUCKETS; see StackSettings)."""
    state_dir: Path = field(default_factory=lambda: Path("~/.runplane/dev").expanduser())
    write_dev_file: bool = True
    settings: dict[str, Any] = field(default_factory=dict)
    """Other stack settings (``StackSettings`` fields), over the local stack's own, e.g.
    ``{"dynamodb_endpoint_url": URL}`` (tables on a DynamoDB of the caller's) or ``{"rehint_seconds": 10}``."""
    functions: bool = True
    """Run the dispatcher (on the events queue and the schedule) and the reaper here; False leaves
    them to processes of their own (``python -m runplane.devstack.functions_process``, AWS)."""


def _aws(config: DevConfig) -> Cloud:
    from runplane.devstack.aws import AwsCloud

    return AwsCloud(config.aws_endpoint_url)


def _azure(config: DevConfig) -> Cloud:
    missing = extras.requirement("the azure local stack", ("azure",))
    if missing is not None:  # the azure extra is optional: its SDKs are imported only past this check
        raise ValueError(missing)
    from runplane.devstack.azure import AzureCloud

    return AzureCloud(config.azure_connection_string, config.prefix, config.schedule_seconds)


CLOUDS: dict[str, Callable[[DevConfig], Cloud]] = {"aws": _aws, "azure": _azure}


class DevStack:
    """Start with ``start()``; ``stop()`` ends runs, agents and servers. Not re-entrant.

    ``start`` raises ValueError for a configuration it cannot serve (an unknown cloud, a missing
    SDK, Azurite that does not come up, stores that cannot be reached) and OSError when the port
    is taken.
    """

    def __init__(self, config: DevConfig) -> None:
        if config.cloud not in CLOUDS:
            raise ValueError(f"unknown cloud {config.cloud!r}; choose one of {', '.join(CLOUDS)}")
        if config.aws_endpoint_url and config.cloud != "aws":
            raise ValueError("an AWS endpoint is for the aws cloud")
        if config.azure_connection_string and config.cloud != "azure":
            raise ValueError("an Azure storage connection string is for the azure cloud")
        if config.aws_endpoint_url:
            url = urlsplit(config.aws_endpoint_url)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError(
                    f"the AWS endpoint {config.aws_endpoint_url[:200]!r} is not an http:// or https:// URL"
                )
        self.config = config
        self.token = config.token or new_token()
        self.cloud: Cloud | None = None
        self._stack: bootstrap.Stack | None = None  # what the functions serve, once provisioned
        self._before: bootstrap.Stack | None = None  # the process's stack before this one's
        self.settings: StackSettings | None = None
        """The stack's settings, once started: what its functions in this process are built from."""
        self.environment: dict[str, str] = {}
        """Once started, the environment its other processes need besides this one's (agents started by
        hand, functions of their own): the stack's settings, the stores' credentials, Powertools'."""
        self._http: FrontServer | None = None
        self._stop = threading.Event()
        self._stopped = False
        self._threads: list[threading.Thread] = []
        self._set_env: list[str] = []  # the variables of POWERTOOLS start set, which stop unsets
        self.api_url = f"http://127.0.0.1:{config.port}"
        self.endpoint = ""

    @property
    def services(self) -> str:
        return self.cloud.services if self.cloud is not None else ""

    @property
    def state_dir(self) -> Path:
        """This stack's own directory: its agents' records, logs and work dirs."""
        return self.config.state_dir / str(self.config.port)

    def _pools_text(self) -> str:
        pools = load_pools(self.config.pools_file or bootstrap.default_pools_text(), check=check_pool)
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

    def _settings(self) -> dict[str, Any]:
        """The stack's settings (``StackSettings`` fields) but where its stores are."""
        return {
            "cloud": self.config.cloud,
            "prefix": self.config.prefix,
            "pools": self._pools_text(),
            "local_state_dir": str(self.state_dir / "workers"),
            "agent_args": self.config.agent_args,
            "input_buckets": self.config.input_buckets,
            "worker_stale_seconds": 30,
            "rehint_seconds": 60,
            **self.config.settings,
        }

    def start(self) -> None:
        values = self._settings()  # reads the pools file first: a bad one fails before anything starts
        self.cloud = cloud = CLOUDS[self.config.cloud](self.config)
        http = self._bind(cloud)  # a busy port, too, fails before anything starts
        try:
            try:
                environment = cloud.start()
                self.endpoint = cloud.endpoint
                self.settings = StackSettings(**{**values, **cloud.settings()})
                self.environment = {
                    **self.settings.environment(),
                    **environment,
                    "RUNPLANE_AGENT_WORK_DIR": str(self.state_dir / "agents"),
                    **POWERTOOLS,
                }
                for name, value in POWERTOOLS.items():
                    if name not in os.environ:
                        os.environ[name] = value
                        self._set_env.append(name)
                stack = cloud.build(self.settings)
                # its agents get this process's environment with the stack's in it
                stack.backends["local"] = LocalCompute(
                    self.settings.local_state_dir, env=self.settings.exported({**os.environ, **self.environment})
                )
                cloud.provision(stack)
                # the token `runplane dev` prints is an administrator's: it can make tokens for others
                register_token(stack.tokens, self.token, self.config.user, scopes=list(SCOPES), now=stack.clock())
                self._stack = stack
                self._before = bootstrap.use(stack)  # the functions of this process serve it
            except RunplaneError as e:  # stores named by the caller that cannot be reached or used
                raise ValueError(f"cannot use the {self.config.cloud} stores: {e}") from e
        except BaseException:
            http.server_close()
            cloud.stop()
            self._unset_env()
            self.cloud = None  # nothing of this stack is left to stop
            raise
        self._http = http
        self.api_url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._spawn(self._http.serve_forever, "http-front")
        if self.config.functions:
            self._spawn(self._poll_events, "dispatch-poller")
            self._spawn(self._schedule, "schedule")
        if self.config.write_dev_file:
            DEV_FILE.parent.mkdir(parents=True, exist_ok=True)
            DEV_FILE.unlink(missing_ok=True)  # made anew 0600: it holds an admin token
            fd = os.open(DEV_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as dev_file:
                dev_file.write(json.dumps({"api_url": self.api_url, "token": self.token}))

    def _spawn(self, target: Callable[[], object], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _poll_events(self) -> None:
        assert self.cloud is not None
        while not self._stop.is_set():
            try:
                self.cloud.poll_events(self._stop)
            except Exception:  # the poller outlives a failed round, as the platform's trigger does
                if not self._stop.is_set():
                    log.exception("dispatcher poll failed")
                    self._stop.wait(1)

    def _schedule(self) -> None:
        assert self.cloud is not None
        while not self._stop.wait(self.config.schedule_seconds):
            self.cloud.fire_schedule()

    def _bind(self, cloud: Cloud) -> FrontServer:
        try:
            return FrontServer(("127.0.0.1", self.config.port), cloud)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            raise ValueError(
                f"port {self.config.port} on 127.0.0.1 is already in use: choose another with --port N "
                "(make dev PORT=N)"
            ) from None

    def stop(self) -> None:
        """Stop the stack and leave nothing of it behind, in about ten seconds at most.

        In order: no request is served and no worker starts any more; every unfinished run is
        killed, its failure message saying that the local stack stopped (STOP_REASON) -- queued
        runs at once, active ones by their agents, which stop their containers and record it;
        the local agents are told to stop (SIGTERM) and killed (SIGKILL) when they are not gone
        once their runs have ended, and what killed ones leave (their runs' containers, their
        work dirs' mounts, their worker records) is cleared here; a run still unfinished then is
        recorded killed here, no agent of it being left to write; last the stores' services
        stop. Idempotent. Failures on the way are logged and the rest still goes.
        """
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        if self.cloud is None:
            return
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        deadline = time.monotonic() + JOIN_SECONDS
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        try:
            if self._stack is not None:
                end_runs(self._stack, self.state_dir / "agents")
        finally:
            self.cloud.stop()
            self._unset_env()
            if self._stack is not None and (current := bootstrap.use(self._before)) is not self._stack:
                bootstrap.use(current)  # another stack was handed over since: it stays

    def _unset_env(self) -> None:
        """Take out of this process's environment what ``start`` put in (those of POWERTOOLS it set)."""
        for name in self._set_env:
            os.environ.pop(name, None)
        self._set_env.clear()
