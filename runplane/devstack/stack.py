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

import contextlib
import errno
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from runplane import bootstrap, extras
from runplane.adapters.local.relay import FrontSessionRelay
from runplane.compute.local.compute import LocalCompute
from runplane.compute.registry import check_pool
from runplane.devstack.cloud import Cloud
from runplane.devstack.ending import STOP_REASON, end_runs
from runplane.devstack.front import FrontServer
from runplane.devstack.local import LocalCloud
from runplane.devstack.net import free_port
from runplane.devstack.relay import RelayHub
from runplane.devstack.state_dir import ADMIN_TOKEN_PATH, StateLock, check_stack_dir, empty, private_dir
from runplane.devstack.wsgi import ProductionFront
from runplane.domain.errors import RunplaneError
from runplane.domain.pools import dump_pools, load_pools
from runplane.domain.tenancy import SCOPES
from runplane.services.auth import hash_token, new_token, register_token
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
    cloud: str = "local"
    """Whose functions and stores: "local" (one SQLite database and a directory of objects in the
    stack's directory, kept across restarts), "aws" (moto) or "azure" (Azurite). An AWS endpoint or
    an Azure connection string implies its cloud."""
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
    """Where the stack's directory is: ``state_dir/<port>`` (``serve``: ``state_dir`` itself). It
    keeps the agents' records and work dirs, the admin token (unless ``token``) and, on the local
    cloud, the database and objects."""
    fresh: bool = False
    """Empty the stack's directory first: the stack starts with no runs, users or tokens."""
    serve: bool = False
    """``runplane serve``: ``state_dir`` used as is, a production front (cheroot, TLS); stopping
    leaves every run and the local agents running (they go on writing to the database), and a
    start finds them (LocalCompute reads their pid records) instead of launching others."""
    host: str = "127.0.0.1"
    """The address the front listens on."""
    tls_cert: Path | None = None
    """``serve``: the PEM certificate (chain) of HTTPS, with ``tls_key``."""
    tls_key: Path | None = None
    public_url: str | None = None
    """The URL the front is reached at, the start of the object URLs it signs; default from the
    host, port and scheme."""
    write_dev_file: bool = True
    settings: dict[str, Any] = field(default_factory=dict)
    """Other stack settings (``StackSettings`` fields), over the local stack's own, e.g.
    ``{"dynamodb_endpoint_url": URL}`` (tables on a DynamoDB of the caller's) or ``{"rehint_seconds": 10}``."""
    functions: bool = True
    """Run the dispatcher (on the events queue and the schedule) and the reaper here; False leaves
    them to processes of their own (``python -m runplane.devstack.functions_process``, AWS)."""


def _aws(config: DevConfig) -> Cloud:
    from runplane.devstack.aws import AwsCloud

    # a moto of its own gets a dynalite of its own for its tables, unless they are given elsewhere
    dynalite = not config.aws_endpoint_url and "dynamodb_endpoint_url" not in config.settings
    return AwsCloud(config.aws_endpoint_url, tables_on_dynalite=dynalite)


def _azure(config: DevConfig) -> Cloud:
    missing = extras.requirement("the azure local stack", ("azure",))
    if missing is not None:  # the azure extra is optional: its SDKs are imported only past this check
        raise ValueError(missing)
    from runplane.devstack.azure import AzureCloud

    return AzureCloud(config.azure_connection_string, config.prefix, config.schedule_seconds, stack_dir(config))


def _local(config: DevConfig) -> Cloud:
    return LocalCloud(stack_dir(config), config.public_url or "")  # the URL is set once the front is bound


CLOUDS: dict[str, Callable[[DevConfig], Cloud]] = {"local": _local, "aws": _aws, "azure": _azure}


def stack_dir(config: DevConfig) -> Path:
    """The directory of the stack ``config`` describes."""
    state_dir = config.state_dir.expanduser()
    return state_dir if config.serve else state_dir / str(config.port)


def _implied_cloud(config: DevConfig) -> DevConfig:
    """``config`` with the cloud its AWS endpoint or Azure connection string implies."""
    if config.cloud == "local" and config.aws_endpoint_url:
        return replace(config, cloud="aws")
    if config.cloud == "local" and config.azure_connection_string:
        return replace(config, cloud="azure")
    return config


class DevStack:
    """Start with ``start()``; ``stop()`` ends runs, agents and servers. Not re-entrant.

    ``start`` raises ValueError for a configuration it cannot serve (an unknown cloud, a missing
    SDK, Azurite that does not come up, stores that cannot be reached) and OSError when the port
    is taken.
    """

    def __init__(self, config: DevConfig) -> None:
        config = _implied_cloud(config)
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
        if (config.tls_cert is None) != (config.tls_key is None):
            raise ValueError("TLS needs both a certificate and its key")
        if config.tls_cert is not None and not config.serve:
            raise ValueError("TLS is served by `runplane serve`'s front")
        if config.serve and config.cloud != "local":
            raise ValueError("`runplane serve` keeps its stores on this machine: the local cloud")
        self.config = config
        self.token = config.token or ""
        """The administrator's token, once started ("" when a serving stack has one already)."""
        self.cloud: Cloud | None = None
        self._stack: bootstrap.Stack | None = None  # what the functions serve, once provisioned
        self._before: bootstrap.Stack | None = None  # the process's stack before this one's
        self.settings: StackSettings | None = None
        """The stack's settings, once started: what its functions in this process are built from."""
        self.environment: dict[str, str] = {}
        """Once started, the environment its other processes need besides this one's (agents started by
        hand, functions of their own): the stack's settings, the stores' credentials, Powertools'."""
        self._http: FrontServer | ProductionFront | None = None
        self._relay: RelayHub | None = None
        self._stop = threading.Event()
        self._stopped = False
        self._threads: list[threading.Thread] = []
        self._set_env: list[str] = []  # the variables of POWERTOOLS start set, which stop unsets
        self._lock: StateLock | None = None  # the stack's directory, held from start to stop
        self.scheme = "https" if config.tls_cert is not None else "http"
        self.api_url = f"{self.scheme}://{_client_host(config.host)}:{config.port}"
        self.public_url = config.public_url or ""
        self.endpoint = ""

    @property
    def services(self) -> str:
        return self.cloud.services if self.cloud is not None else ""

    @property
    def state_dir(self) -> Path:
        """This stack's own directory: its agents' records, logs and work dirs; its admin token; on
        the local cloud, its database and objects."""
        return stack_dir(self.config)

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
        if self.config.fresh:
            check_stack_dir(self.state_dir)  # a directory given by mistake gets no lock file either
        private_dir(self.state_dir)
        # before anything else: another stack on this directory (its port, too, may be this one) stops this one
        self._lock = lock = StateLock(self.state_dir)
        try:
            if self.config.fresh:
                empty(self.state_dir)
            self.cloud = cloud = CLOUDS[self.config.cloud](self.config)
            http = self._bind(cloud)  # a busy port, too, fails before anything starts
        except BaseException:
            lock.release()
            raise
        port = http.server_address[1]
        self.api_url = f"{self.scheme}://{_client_host(self.config.host)}:{port}"
        self.public_url = (self.config.public_url or _public_url(self.scheme, self.config.host, port)).rstrip("/")
        cloud.public_url = self.public_url
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
                if stack.sessions is not None and stack.relay is None:  # sessions meet at this front
                    hub = RelayHub(stack.sessions, stack.clock)
                    stack.relay = FrontSessionRelay(self.public_url, hub)
                    http.relay = self._relay = hub
                # its agents get this process's environment with the stack's in it
                stack.backends["local"] = LocalCompute(
                    self.settings.local_state_dir, env=self.settings.exported({**os.environ, **self.environment})
                )
                cloud.provision(stack)
                self.token = self._admin_token(stack)
                self._stack = stack
                self._before = bootstrap.use(stack)  # the functions of this process serve it
            except RunplaneError as e:  # stores named by the caller that cannot be reached or used
                raise ValueError(f"cannot use the {self.config.cloud} stores: {e}") from e
        except BaseException:
            http.server_close()
            cloud.stop()
            self._unset_env()
            lock.release()
            self.cloud = None  # nothing of this stack is left to stop
            raise
        self._http = http
        self._spawn(self._http.serve_forever, "http-front")
        if self.config.functions:
            self._spawn(self._poll_events, "dispatch-poller")
            self._spawn(self._schedule, "schedule")
        if self.config.write_dev_file and self.token:
            DEV_FILE.parent.mkdir(parents=True, exist_ok=True)
            DEV_FILE.unlink(missing_ok=True)  # made anew 0600: it holds an admin token
            fd = os.open(DEV_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as dev_file:
                dev_file.write(json.dumps(self._dev_facts()))

    def _dev_facts(self) -> dict[str, str]:
        """What DEV_FILE says of this stack: how a client on this machine reaches it (client/config.py)."""
        return {"api_url": self.api_url, "token": self.token}

    def _forget_dev_file(self) -> None:
        """Remove DEV_FILE if it still points at this stack (another ``runplane dev`` started since
        wrote its own: that one stays), so that clients no longer find a stack that stopped."""
        if not self.config.write_dev_file or not self.token:
            return
        try:
            if json.loads(DEV_FILE.read_text()) == self._dev_facts():
                DEV_FILE.unlink(missing_ok=True)
        except (OSError, ValueError) as e:  # gone already, unreadable or not JSON: not this stack's to remove
            log.debug("left %s as it is: %s", DEV_FILE, e)

    def _admin_token(self, stack: bootstrap.Stack) -> str:
        """The administrator's token (it can make tokens for others), registered if the stores do
        not know it: ``config.token``; else the one kept in the stack's directory (ADMIN_TOKEN_PATH, 0600),
        made anew when there is none or it was revoked. Serving, none is kept, and a token (given or
        made) is registered only in stores that hold no token yet (the first start): one the stores
        no longer know was revoked, and stays so; else "" (``runplane token create --direct`` makes
        another)."""
        tokens, token = stack.tokens, self.config.token
        kept = self.state_dir / ADMIN_TOKEN_PATH
        if self.config.serve:
            if token is not None and tokens.lookup(hash_token(token)) is not None:
                return token
            if tokens.list():
                if token is not None:
                    log.warning(
                        "the admin token given is not registered: this stack has tokens, and none of them is "
                        "this one (it was revoked); runplane token create --direct makes another"
                    )
                return ""
            token = token or new_token()
        elif token is None:
            with contextlib.suppress(OSError):
                token = kept.read_text().strip() or None
            if token is None or tokens.lookup(hash_token(token)) is None:
                token = new_token()
                kept.unlink(missing_ok=True)  # made anew 0600
                fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write(token)
        if tokens.lookup(hash_token(token)) is None:
            register_token(stack.tokens, token, self.config.user, scopes=list(SCOPES), now=stack.clock())
        return token

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

    def _bind(self, cloud: Cloud) -> FrontServer | ProductionFront:
        address = (self.config.host, self.config.port)
        try:
            if self.config.serve:
                return ProductionFront(address, cloud, self.config.tls_cert, self.config.tls_key)
            return FrontServer(address, cloud)
        except OSError as e:
            # cheroot's error (serving) names the bind's only in its text
            if e.errno != errno.EADDRINUSE and f"[Errno {errno.EADDRINUSE}]" not in str(e):
                raise
            how = "--listen ADDR:PORT" if self.config.serve else "--port N (make dev PORT=N)"
            raise ValueError(
                f"port {self.config.port} on {self.config.host} is already in use: choose another with {how}"
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
        self._forget_dev_file()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self._relay is not None:  # the sessions it holds end with it
            self._relay.stop()
        deadline = time.monotonic() + JOIN_SECONDS
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        try:
            if self._stack is not None and not self.config.serve:  # serving, runs and agents go on
                end_runs(self._stack, self.state_dir / "agents")
        finally:
            self.cloud.stop()
            self._unset_env()
            if self._lock is not None:
                self._lock.release()
            if self._stack is not None and (current := bootstrap.use(self._before)) is not self._stack:
                bootstrap.use(current)  # another stack was handed over since: it stays

    def _unset_env(self) -> None:
        """Take out of this process's environment what ``start`` put in (those of POWERTOOLS it set)."""
        for name in self._set_env:
            os.environ.pop(name, None)
        self._set_env.clear()


def _client_host(host: str) -> str:
    """The host a client on this machine reaches a front listening on ``host`` at."""
    if host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _public_url(scheme: str, host: str, port: int) -> str:
    """Where other machines reach a front on ``host``: this machine's name for a wildcard address."""
    name = socket.getfqdn() if host in ("", "0.0.0.0", "::") else host
    return f"{scheme}://{f'[{name}]' if ':' in name else name}:{port}"
