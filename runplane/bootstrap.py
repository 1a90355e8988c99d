"""The one composition root: settings -> adapters -> the wired stack.

Cloud SDKs are imported only here and only when a stack is built, so importing a handler
module stays cheap (Lambda cold starts) and a missing SDK only switches its cloud off.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from pydantic import ValidationError

from runplane.backend import ComputeBackend
from runplane.compute.options import agent_args_for
from runplane.compute.registry import build_backend, check_pool
from runplane.domain.errors import InvalidRequest, Misconfigured
from runplane.domain.pools import Pool, PoolConfig, load_pools
from runplane.ports import (
    Clock,
    ObjectStore,
    PoolStateStore,
    Ports,
    QuotaStore,
    RunQueue,
    RunStore,
    SecretOpener,
    SecretSealer,
    SecretStore,
    SessionRelay,
    SessionStore,
    SweepStore,
    TokenStore,
    WorkerRegistry,
)
from runplane.services.auth import CachedTokens
from runplane.services.authority import Owners
from runplane.services.inputs import InputPolicy
from runplane.settings import StackSettings

log = logging.getLogger(__name__)


def default_pools_text() -> str:
    return resources.files("runplane.devstack").joinpath("pools.yaml").read_text()


@dataclass
class Stack:
    settings: StackSettings
    pools: PoolConfig
    store: RunStore
    queue: RunQueue
    objects: ObjectStore
    workers: WorkerRegistry
    tokens: TokenStore
    pool_states: PoolStateStore
    quotas: QuotaStore
    sweeps: SweepStore
    data_bucket: str
    """The bucket (Azure: container) of logs and outputs: never a run's input."""
    clock: Clock = time.time
    backends: dict[str, ComputeBackend] = field(default_factory=dict)
    sleep: Callable[[float], None] = time.sleep
    """How a service that waits lets time pass (``Ports.sleep``): on one machine, a pause that ends
    at a commit."""
    secrets: SecretStore | None = None
    """The secrets store: sealed values only (``domain/secrets.py``)."""
    sealer: SecretSealer | None = None
    """How the API seals a secret's value (it cannot open one)."""
    opener: SecretOpener | None = None
    """How the agent opens the secrets of a run it holds (the API's credentials cannot)."""
    sessions: SessionStore | None = None
    """Sessions into live runs (``domain/sessions.py``): the API asks, the agent takes and ends them."""
    relay: SessionRelay | None = None
    """Where a session's two sides meet: on one machine, the front of the process that serves the API
    (``runplane dev``, ``runplane serve``), set when it starts; None where the stack has none."""

    def backend(self, pool: Pool) -> ComputeBackend:
        if pool.backend not in self.backends:
            self.backends[pool.backend] = build_backend(pool.backend, self.settings)
        return self.backends[pool.backend]

    def agent_args(self, pool: Pool) -> list[str]:
        return agent_args_for(pool, self.settings.agent_args)

    @functools.cached_property
    def ports(self) -> Ports:
        """What every service takes, built once (``make_ports``)."""
        return make_ports(self)


def make_ports(
    stack: Stack, clock: Clock | None = None, backend: Callable[[Pool], ComputeBackend] | None = None
) -> Ports:
    """The ports of ``stack``'s stores, its pools and settings, read by ``clock`` (default: the
    stack's) and launching through ``backend`` (default: the stack's backends). Tests give a clock
    they move and a backend of their own."""
    clock = clock or stack.clock
    return Ports(
        store=stack.store,
        sweeps=stack.sweeps,
        queue=stack.queue,
        workers=stack.workers,
        tokens=stack.tokens,
        pool_states=stack.pool_states,
        quotas=stack.quotas,
        objects=stack.objects,
        pools=stack.pools,
        settings=stack.settings,
        clock=clock,
        owners=Owners(stack.tokens, clock),
        inputs=InputPolicy(stack.settings.input_bucket_allowlist(), stack.data_bucket),
        backend=backend or stack.backend,
        agent_args=stack.agent_args,
        sleep=stack.sleep,
        secrets=stack.secrets,
        sealer=stack.sealer,
        sessions=stack.sessions,
        relay=stack.relay,
    )


def aws_clients(settings: StackSettings, keys: tuple[str, str] | None = None) -> dict[str, Any]:
    """The storage clients of an AWS stack. ``keys``: an access key id and its secret (for an
    endpoint that takes any, such as the local stack's moto); None: boto3's credential chain."""
    from runplane.adapters.aws.clients import AwsConfig, LazyClient, make_client, new_session

    key_id, secret = keys or (None, None)
    config = AwsConfig(
        region=settings.aws_region,
        endpoint_url=settings.aws_endpoint_url,
        dynamodb_endpoint_url=settings.dynamodb_endpoint_url,
        access_key_id=key_id,
        secret_access_key=secret,
    )
    # One session for the clients, made here in one thread: each session loads its own copy of
    # botocore's data (~7 MB). The clients themselves are safe to share between threads. KMS is
    # made on first use (only a secret's seal or open needs it), once, under the LazyClient's
    # lock: no other client is made from the session by then.
    session = new_session(config)
    clients = {
        "dynamodb": make_client("dynamodb", config, session),
        "sqs": make_client("sqs", config, session, read_timeout=30),
        "s3": make_client("s3", config, session),
        "kms": LazyClient(lambda: make_client("kms", config, session)),
    }
    if settings.relay_url:  # the relay's @connections API, made on first use with a session of its own
        from runplane.adapters.aws.relay import manage_url

        manage = dataclasses.replace(config, endpoint_url=manage_url(settings.relay_url))
        clients["relay"] = LazyClient(lambda: make_client("apigatewaymanagementapi", manage))
    return clients


def _aws_relay(settings: StackSettings, clients: dict[str, Any], table: str) -> SessionRelay | None:
    """The relay of an AWS stack whose settings name one (``relay_url``), else None."""
    if not settings.relay_url:
        return None
    from runplane.adapters.aws.relay import AwsSessionRelay, GatewayConnections, RelayConnections

    relay = clients.get("relay") or aws_clients(settings)["relay"]
    connections, gateway = RelayConnections(table, clients["dynamodb"]), GatewayConnections(relay)
    return AwsSessionRelay(settings.relay_url, connections, gateway, message_rate=settings.relay_message_rate)


def aws_names(settings: StackSettings) -> Any:
    from runplane.adapters.aws.provision import AwsNames

    return AwsNames.of(settings)


def azure_clients(settings: StackSettings) -> Any:
    """The storage clients of an Azure stack (``AzureClients``). Raises InvalidRequest when the
    settings name no account or the Azure SDKs are not installed."""
    try:
        from runplane.adapters.azure.clients import connect
    except ImportError as e:
        raise InvalidRequest("cloud 'azure' needs the Azure SDKs: pip install 'runplane[azure]'") from e
    return connect(settings.azure_storage_connection_string, settings.azure_storage_account)


def azure_names(settings: StackSettings) -> Any:
    from runplane.adapters.azure.provision import AzureNames

    return AzureNames.of(settings)


def _azure_stack(settings: StackSettings, pools: PoolConfig, clients: Any) -> Stack:
    clients = clients or azure_clients(settings)
    from runplane.adapters.azure.blob import BlobObjectStore
    from runplane.adapters.azure.pools import TablePoolStateStore
    from runplane.adapters.azure.queues import StorageQueueRunQueue
    from runplane.adapters.azure.quotas import TableQuotaStore
    from runplane.adapters.azure.runs import TableRunStore
    from runplane.adapters.azure.secrets import TableSecretStore
    from runplane.adapters.azure.sessions import TableSessionStore
    from runplane.adapters.azure.sweeps import TableSweepStore
    from runplane.adapters.azure.tokens import TableTokenStore
    from runplane.adapters.azure.workers import TableWorkerRegistry

    names = azure_names(settings)
    tables = clients.tables
    sealer, opener = _azure_secret_keys(settings)
    sessions = TableSessionStore(tables.get_table_client(names.sessions_table))
    return _stack(
        settings,
        pools,
        store=TableRunStore(tables.get_table_client(names.runs_table)),
        sweeps=TableSweepStore(tables.get_table_client(names.runs_table)),
        queue=StorageQueueRunQueue(names.prefix, clients.queues),
        objects=BlobObjectStore(names.container, clients.blobs, clients.account_key),
        workers=TableWorkerRegistry(tables.get_table_client(names.workers_table)),
        tokens=TableTokenStore(tables.get_table_client(names.tokens_table)),
        pool_states=TablePoolStateStore(tables.get_table_client(names.pools_table)),
        quotas=TableQuotaStore(tables.get_table_client(names.quotas_table)),
        data_bucket=names.container,
        secrets=TableSecretStore(tables.get_table_client(names.secrets_table)),
        sealer=sealer,
        opener=opener,
        sessions=sessions,
        relay=_azure_relay(settings, sessions),
    )


def _azure_relay(settings: StackSettings, sessions: SessionStore) -> SessionRelay | None:
    """The relay of an Azure stack whose settings name a Web PubSub resource, else None."""
    if not settings.webpubsub_connection_string:
        return None
    from runplane.adapters.azure.relay import WebPubSubAccess, WebPubSubSessionRelay

    access = WebPubSubAccess.parse(settings.webpubsub_connection_string)
    return WebPubSubSessionRelay(access, sessions, settings.webpubsub_hub)


def _azure_secret_keys(settings: StackSettings) -> tuple[SecretSealer | None, SecretOpener | None]:
    """An Azure stack's secrets key: a Key Vault key URL (the API wraps, the workers unwrap), or
    ``file:PATH`` (a key file: one machine, ``runplane dev --cloud azure``); none: no secrets."""
    key = settings.secrets_key.strip()
    if key.startswith("file:"):
        from runplane.adapters.local.keyfile import KeyFileOpener, KeyFileSealer, key_file_path

        path = key_file_path(key, settings.state_dir)
        return KeyFileSealer(path), KeyFileOpener(path)
    if key:
        from runplane.adapters.azure.keyvault import key_vault_keys

        return key_vault_keys(key)
    return None, None


def _local_stack(settings: StackSettings, pools: PoolConfig) -> Stack:
    """The stores of a stack on one machine: one SQLite database and a directory of objects under
    ``settings.state_dir`` (runplane/adapters/local)."""
    from runplane.adapters.local.db import Database
    from runplane.adapters.local.files import FileObjectStore
    from runplane.adapters.local.keyfile import KeyFileOpener, KeyFileSealer, key_file_path
    from runplane.adapters.local.pause import CommitPause
    from runplane.adapters.local.pools import SqlitePoolStateStore
    from runplane.adapters.local.queues import SqliteRunQueue
    from runplane.adapters.local.quotas import SqliteQuotaStore
    from runplane.adapters.local.runs import SqliteRunStore
    from runplane.adapters.local.secrets import SqliteSecretStore
    from runplane.adapters.local.sessions import SqliteSessionStore
    from runplane.adapters.local.sweeps import SqliteSweepStore
    from runplane.adapters.local.tokens import SqliteTokenStore
    from runplane.adapters.local.workers import SqliteWorkerRegistry

    db = Database.at(settings.state_dir)
    tokens = SqliteTokenStore(db)
    bucket = settings.bucket or f"{settings.prefix}-data"
    key_file = key_file_path(settings.secrets_key, db.root)
    return _stack(
        settings,
        pools,
        store=SqliteRunStore(db),
        sweeps=SqliteSweepStore(db),
        queue=SqliteRunQueue(db, pools=[pool.name for pool in pools.pools]),
        objects=FileObjectStore(db.root, bucket, tokens.secret, settings.public_url),
        workers=SqliteWorkerRegistry(db),
        tokens=tokens,
        pool_states=SqlitePoolStateStore(db),
        quotas=SqliteQuotaStore(db),
        data_bucket=bucket,
        sleep=CommitPause(db),
        secrets=SqliteSecretStore(db),
        sealer=KeyFileSealer(key_file),
        opener=KeyFileOpener(key_file),
        sessions=SqliteSessionStore(db),
    )


def _stack(settings: StackSettings, pools: PoolConfig, tokens: TokenStore, **stores: Any) -> Stack:
    """What both clouds share: the pools and the token cache around the adapters."""
    return Stack(settings=settings, pools=pools, tokens=CachedTokens(tokens), **stores)


def pools_of(settings: StackSettings) -> PoolConfig:
    """The pools ``settings`` name, each checked by its backend. Raises Misconfigured with the one
    line that names the pool and the field, before any client is built."""
    try:
        return load_pools(settings.pools or default_pools_text(), check=check_pool)
    except ValueError as e:
        raise Misconfigured(str(e)) from None


def build_stack(settings: StackSettings | None = None, clients: Any = None) -> Stack:
    """The stack for ``settings.cloud``. ``clients``: what ``aws_clients`` or ``azure_clients``
    returns for these settings (to share them); built here when None. Raises Misconfigured for a
    bad pool or a bad setting of the environment's (one line naming its variable), before it builds anything."""
    if settings is None:
        try:
            settings = StackSettings.from_env()
        except ValidationError as e:
            raise Misconfigured(StackSettings.problem(e)) from None
    pools = pools_of(settings)
    if settings.cloud == "azure":
        return _azure_stack(settings, pools, clients)
    if settings.cloud == "local":
        return _local_stack(settings, pools)
    from runplane.adapters.aws.pools import DynamoPoolStateStore
    from runplane.adapters.aws.quotas import DynamoQuotaStore
    from runplane.adapters.aws.runs import DynamoRunStore
    from runplane.adapters.aws.s3 import S3ObjectStore
    from runplane.adapters.aws.secrets import DynamoSecretStore, KmsOpener, KmsSealer
    from runplane.adapters.aws.sessions import DynamoSessionStore
    from runplane.adapters.aws.sqs import SqsRunQueue
    from runplane.adapters.aws.sweeps import DynamoSweepStore
    from runplane.adapters.aws.tokens import DynamoTokenStore
    from runplane.adapters.aws.workers import DynamoWorkerRegistry

    clients = clients or aws_clients(settings)
    names = aws_names(settings)
    return _stack(
        settings,
        pools,
        store=DynamoRunStore(names.runs_table, clients["dynamodb"]),
        sweeps=DynamoSweepStore(names.runs_table, clients["dynamodb"]),
        queue=SqsRunQueue(names.prefix, clients["sqs"]),
        objects=S3ObjectStore(names.bucket, clients["s3"]),
        workers=DynamoWorkerRegistry(names.workers_table, clients["dynamodb"]),
        tokens=DynamoTokenStore(names.tokens_table, clients["dynamodb"]),
        pool_states=DynamoPoolStateStore(names.pools_table, clients["dynamodb"]),
        quotas=DynamoQuotaStore(names.quotas_table, clients["dynamodb"]),
        data_bucket=names.bucket,
        secrets=DynamoSecretStore(names.secrets_table, clients["dynamodb"]),
        sealer=KmsSealer(names.secrets_key, clients["kms"]),
        opener=KmsOpener(names.secrets_key, clients["kms"]),
        sessions=DynamoSessionStore(names.sessions_table, clients["dynamodb"]),
        relay=_aws_relay(settings, clients, names.relay_table),
    )


_handed: list[Stack] = []  # the stack ``use`` handed to this process, if any


def use(handed: Stack | None) -> Stack | None:
    """Hand ``handed`` to this process: ``stack()`` returns it from now on, in place of one built
    from the environment (``runplane dev`` hands over the stack it built from its own settings; a
    test, one of its own). None: back to the environment's. Returns the stack handed before."""
    before = _handed[0] if _handed else None
    _handed[:] = [handed] if handed is not None else []
    return before


def stack() -> Stack:
    """The process-wide stack: the one handed over with ``use``, else the one the environment's
    settings make, built on first use (warm Lambda invocations reuse its clients). Raises
    Misconfigured, on every call, when those settings name a bad pool (logged once)."""
    if _handed:
        return _handed[0]
    built = _from_environment()
    if isinstance(built, Misconfigured):
        raise Misconfigured(built.message)  # a new one each time: a kept one would gather tracebacks
    return built


@functools.cache
def _from_environment() -> Stack | Misconfigured:
    """The environment's stack, or why it cannot be built (kept: settings do not change while a
    process runs, so it is not tried again at each request)."""
    try:
        return build_stack()
    except Misconfigured as e:
        log.error("%s", e.message)
        return e
