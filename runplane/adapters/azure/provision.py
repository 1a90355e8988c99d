"""Create the Azure Storage resources of a stack (tables, queues with poison queues, a container),
on Azurite or a real account. Idempotent: existing resources are left as they are.
``deprovision`` removes them again (tests, throwaway stacks).

What ``runplane.adapters.aws.resources`` sets on AWS, where it applies here: the container is
private (no anonymous access; infra/azure/azuredeploy.json also turns public blob access off for
the account); a message's time to live and visibility are set per message by the queue adapter,
and its poison queue stands for the dead-letter queue. The rest belongs to the storage account
and is the deployment template's: encryption at rest is always on, HTTPS only and TLS 1.2
(``supportsHttpsTrafficOnly``, ``minimumTlsVersion``), no shared keys. Table storage has no TTL
(stale workers are skipped and removed by the registry) and no point-in-time recovery.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError

from runplane.adapters.azure.clients import AzureClients
from runplane.adapters.azure.errors import error_code
from runplane.adapters.azure.queues import events_queue_name, poison_queue_name, pool_queue_name, queue_name
from runplane.adapters.names import StackNames
from runplane.domain.errors import BackendError, InvalidRequest
from runplane.settings import StackSettings

_TABLE = re.compile(r"^[A-Za-z][A-Za-z0-9]{2,62}$")
_CONTAINER = re.compile(r"^(?=.{3,63}$)[a-z0-9]+(-[a-z0-9]+)*$")


def table_name(raw: str) -> str:
    """``raw`` under the table naming rules: 3-63 letters and digits, starting with a letter."""
    name = re.sub(r"[^A-Za-z0-9]", "", raw)
    if not name[:1].isalpha():
        name = f"t{name}"
    if len(name) > 63 or len(name) < 3:
        name = f"{name[:54]}{hashlib.sha256(raw.encode()).hexdigest()[:8]}"
    return name


@dataclass(frozen=True)
class AzureNames(StackNames):
    """Resource names of one stack on Azure. Left empty, each is derived from ``prefix``; given, it
    must already follow Azure's naming rules (InvalidRequest says which)."""

    container: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.container:
            object.__setattr__(self, "container", queue_name(f"{self.prefix}-data"))
        elif not _CONTAINER.match(self.container):
            raise InvalidRequest(
                f"container name {self.container!r}: use 3-63 lowercase letters, digits and single hyphens"
            )

    @classmethod
    def of(cls, settings: StackSettings) -> AzureNames:
        """The names ``settings`` give."""
        return cls.named(settings, container=settings.bucket)

    def derive(self, role: str) -> str:
        return table_name(f"{self.prefix}{role}")

    def check_table(self, name: str) -> str:
        if not _TABLE.match(name):
            raise InvalidRequest(f"table name {name!r}: use 3-63 letters and digits, starting with a letter")
        return name

    def queues(self, pools: Iterable[str]) -> list[str]:
        """Every queue of the stack: each pool's and the events queue, each with its poison queue."""
        names = [pool_queue_name(self.prefix, pool) for pool in pools] + [events_queue_name(self.prefix)]
        return [q for name in names for q in (name, poison_queue_name(name))]


def provision(names: AzureNames, pools: Iterable[str], clients: AzureClients) -> None:
    """Create tables, queues (with poison queues) and the container. Raises BackendError."""
    try:
        for table in names.tables:
            clients.tables.create_table_if_not_exists(table)
        for queue in names.queues(pools):
            with contextlib.suppress(ResourceExistsError):
                clients.queues.create_queue(queue)
        with contextlib.suppress(ResourceExistsError):
            clients.blobs.create_container(names.container, public_access=None)  # private
    except AzureError as e:
        raise BackendError(f"provision stack {names.prefix}: {error_code(e) or e.message}") from e


def deprovision(names: AzureNames, pools: Iterable[str], clients: AzureClients) -> None:
    """Delete what ``provision`` created, with everything in it. Quiet about what is gone."""
    try:
        for table in names.tables:
            clients.tables.delete_table(table)  # quiet when missing
        for queue in names.queues(pools):
            with contextlib.suppress(ResourceNotFoundError):
                clients.queues.delete_queue(queue)
        with contextlib.suppress(ResourceNotFoundError):
            clients.blobs.delete_container(names.container)
    except AzureError as e:
        raise BackendError(f"deprovision stack {names.prefix}: {error_code(e) or e.message}") from e
