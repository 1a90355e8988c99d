"""Storage service clients from a connection string (Azurite, an account key) or from an account
name and the managed identity (DefaultAzureCredential). Azure SDK clients are thread-safe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from azure.data.tables import TableServiceClient
from azure.storage.blob import BlobServiceClient
from azure.storage.blob import ExponentialRetry as BlobRetry
from azure.storage.queue import ExponentialRetry as QueueRetry
from azure.storage.queue import QueueServiceClient

from runplane.domain.errors import InvalidRequest
from runplane.settings import parse_connection_string

# Large files go up in 8 MiB blocks, several at a time (BlobObjectStore.put_file).
BLOCK_SIZE = 8 * 1024**2
SINGLE_PUT_SIZE = 16 * 1024**2
_TIMEOUTS: dict[str, Any] = {"connection_timeout": 5, "read_timeout": 30}


def _retry(kind: type[Any]) -> Any:
    # The storage SDKs wait 15 s before their first retry by default: too long for a control plane.
    return kind(initial_backoff=1, increment_base=2, retry_total=3)


@dataclass(frozen=True)
class AzureClients:
    """The three storage clients of one account."""

    tables: TableServiceClient
    queues: QueueServiceClient
    blobs: BlobServiceClient
    account_key: str | None = None
    """The shared key when the connection string has one (SAS URLs are signed with it);
    None with a managed identity (SAS URLs are signed with a user delegation key)."""


def connect(connection_string: str | None = None, account: str | None = None, credential: Any = None) -> AzureClients:
    """Clients from a connection string, else for ``account`` with ``credential`` (default:
    DefaultAzureCredential). Raises InvalidRequest when neither is given or the string is bad."""
    if connection_string:
        parts = parse_connection_string(connection_string)
        name = parts.get("AccountName", "")
        if not name:
            raise InvalidRequest("the Azure storage connection string has no AccountName")
        try:
            return AzureClients(
                tables=TableServiceClient.from_connection_string(connection_string, retry_total=3, **_TIMEOUTS),
                queues=QueueServiceClient.from_connection_string(
                    connection_string, retry_policy=_retry(QueueRetry), **_TIMEOUTS
                ),
                blobs=BlobServiceClient.from_connection_string(
                    connection_string,
                    retry_policy=_retry(BlobRetry),
                    max_block_size=BLOCK_SIZE,
                    max_single_put_size=SINGLE_PUT_SIZE,
                    **_TIMEOUTS,
                ),
                account_key=parts.get("AccountKey") or None,
            )
        except ValueError as e:
            raise InvalidRequest(f"the Azure storage connection string is not valid: {e}") from e
    if not account:
        raise InvalidRequest(
            "an Azure stack needs RUNPLANE_AZURE_STORAGE_CONNECTION_STRING or RUNPLANE_AZURE_STORAGE_ACCOUNT"
        )
    if credential is None:
        from azure.identity import DefaultAzureCredential  # heavy (MSAL): only managed identities need it

        credential = DefaultAzureCredential()
    return AzureClients(
        tables=TableServiceClient(
            f"https://{account}.table.core.windows.net", credential=credential, retry_total=3, **_TIMEOUTS
        ),
        queues=QueueServiceClient(
            f"https://{account}.queue.core.windows.net",
            credential=credential,
            retry_policy=_retry(QueueRetry),
            **_TIMEOUTS,
        ),
        blobs=BlobServiceClient(
            f"https://{account}.blob.core.windows.net",
            credential=credential,
            retry_policy=_retry(BlobRetry),
            max_block_size=BLOCK_SIZE,
            max_single_put_size=SINGLE_PUT_SIZE,
            **_TIMEOUTS,
        ),
    )
