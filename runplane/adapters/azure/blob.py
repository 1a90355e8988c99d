"""Blob storage object store: block blobs in one container, SAS URLs."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from azure.core.exceptions import AzureError, HttpResponseError
from azure.storage.blob import BlobSasPermissions, BlobServiceClient, UserDelegationKey, generate_blob_sas

from runplane.adapters.azure.errors import error_code
from runplane.domain.errors import BackendError, BadRequest, NotFound, PayloadTooLarge
from runplane.domain.uploads import PUT_URL_SECONDS
from runplane.ports import MAX_DELETE, ObjectInfo

log = logging.getLogger(__name__)

CONCURRENCY = 4
DELEGATION_KEY_SECONDS = 7 * 24 * 3600
"""A user delegation key lives at most seven days, and a SAS signed with it no longer."""
MAX_SAS_SECONDS = DELEGATION_KEY_SECONDS - 600
DELETE_THREADS = 8


class BlobObjectStore:
    """Objects as block blobs of ``container``. Large files go up and down in blocks, several at
    a time (the block size is the client's ``max_block_size``).

    ``url`` signs a read-only SAS with ``account_key`` when there is one (a connection string
    with a key, Azurite's included), else with a user delegation key that the client's identity
    obtains (it needs a role that grants ``generateUserDelegationKey``, such as Storage Blob Data
    Reader); the key is kept and renewed before it expires.
    """

    def __init__(
        self,
        container: str,
        client: BlobServiceClient,
        account_key: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.container = container
        self.client = client
        self.account_key = account_key
        self.clock = clock
        self._delegation: UserDelegationKey | None = None
        self._delegation_expires = 0.0
        self._lock = threading.Lock()

    def _fail(self, e: AzureError, what: str, key: str) -> Exception:
        code = error_code(e)
        if code == "BlobNotFound":
            return NotFound(f"object {key} not found")
        if code == "ContainerNotFound":
            return BackendError(f"{what} {key}: container {self.container} does not exist")
        # what Blob storage said stays in our log: a failure's message reaches users (a run's end)
        log.warning("%s %s: Blob storage answered %s: %s", what, key, code or e.__class__.__name__, e.message)
        return BackendError(f"{what} {key}: {code or e.__class__.__name__}")

    def put_bytes(self, key: str, data: bytes) -> None:
        try:
            self.client.get_blob_client(self.container, key).upload_blob(data, overwrite=True)
        except AzureError as e:
            raise self._fail(e, "upload", key) from e

    def put_file(self, key: str, path: Path) -> None:
        try:
            with path.open("rb") as f:
                self.client.get_blob_client(self.container, key).upload_blob(
                    f, length=path.stat().st_size, overwrite=True, max_concurrency=CONCURRENCY
                )
        except AzureError as e:
            raise self._fail(e, "upload", key) from e

    def get_bytes(self, key: str) -> bytes:
        try:
            return self.client.get_blob_client(self.container, key).download_blob().readall()
        except AzureError as e:
            raise self._fail(e, "download", key) from e

    def download_file(self, key: str, path: Path, max_bytes: int | None = None) -> None:
        # Into a file beside the target, renamed when complete: a failed download leaves nothing.
        part = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
        try:
            download = self.client.get_blob_client(self.container, key).download_blob(max_concurrency=CONCURRENCY)
            # the first answer gives the blob's size; the rest is read of that same version (etag)
            if max_bytes is not None and download.size > max_bytes:
                raise PayloadTooLarge(f"object {key} holds {download.size} bytes, more than {max_bytes}")
            with part.open("wb") as f:
                download.readinto(f)
            part.replace(path)
        except AzureError as e:
            raise self._fail(e, "download", key) from e
        finally:
            part.unlink(missing_ok=True)

    def list_page(self, prefix: str, cursor: str | None, limit: int) -> tuple[list[ObjectInfo], str | None]:
        # the cursor is the service's continuation marker: one request per page, wherever it is
        container = self.client.get_container_client(self.container)
        try:
            pages: Any = container.list_blobs(name_starts_with=prefix, results_per_page=limit).by_page(
                continuation_token=cursor or None
            )
            found = [_info(b) for b in next(pages, [])]
        except HttpResponseError as e:
            if cursor and e.status_code == 400:
                raise BadRequest("cursor is not valid; pass the next_cursor of a previous page") from e
            raise self._fail(e, "list", prefix) from e
        except AzureError as e:
            raise self._fail(e, "list", prefix) from e
        return found, pages.continuation_token or None

    def list(self, prefix: str) -> list[ObjectInfo]:
        try:
            blobs = self.client.get_container_client(self.container).list_blobs(name_starts_with=prefix)
            out = [_info(b) for b in blobs]
        except AzureError as e:
            raise self._fail(e, "list", prefix) from e
        return sorted(out, key=lambda o: o.key)

    def within(self, bucket: str) -> BlobObjectStore:
        if bucket == self.container:
            return self
        return BlobObjectStore(bucket, self.client, self.account_key, self.clock)

    def head(self, key: str) -> ObjectInfo | None:
        try:
            found = self.client.get_blob_client(self.container, key).get_blob_properties()
        except AzureError as e:
            failure = self._fail(e, "head", key)
            if isinstance(failure, NotFound):
                return None
            raise failure from e
        return _info(found, key)

    def delete(self, keys: Sequence[str]) -> None:
        """Each blob deleted (with its snapshots) by a request of its own, several at a time (a
        batch request is not served by every Blob storage endpoint, Azurite's among them)."""
        if len(keys) > MAX_DELETE:
            raise ValueError(f"delete takes at most {MAX_DELETE} keys, not {len(keys)}")
        with ThreadPoolExecutor(min(DELETE_THREADS, max(1, len(keys))), thread_name_prefix="blob-delete") as pool:
            for _ in pool.map(self._delete_one, keys):
                pass

    def _delete_one(self, key: str) -> None:
        try:
            self.client.get_blob_client(self.container, key).delete_blob(delete_snapshots="include")
        except AzureError as e:
            failure = self._fail(e, "delete", key)
            if not isinstance(failure, NotFound):
                raise failure from e

    def touch(self, key: str) -> None:
        """Its metadata written back as it is: Blob storage renews Last-Modified (what a lifecycle
        rule's ``daysAfterModificationGreaterThan`` counts from) and the ETag; the bytes stay."""
        blob = self.client.get_blob_client(self.container, key)
        try:
            blob.set_blob_metadata(blob.get_blob_properties().metadata or {})
        except AzureError as e:
            raise self._fail(e, "touch", key) from e

    def put_url(
        self, key: str, size: int, md5: str, expires_seconds: int = PUT_URL_SECONDS
    ) -> tuple[str, dict[str, str]]:
        """A SAS that creates the blob, never overwrites one (``c`` alone); Blob storage refuses a
        body whose MD5 is not the ``Content-MD5`` sent (Md5Mismatch), or of another length than
        ``Content-Length``. A SAS cannot bind the headers: the API checks the object's size when a
        run names it, and the agent its SHA-256 when it fetches it."""
        headers = {
            "Content-MD5": md5,
            "Content-Length": str(size),
            "Content-Type": "application/gzip",
            "x-ms-blob-type": "BlockBlob",
        }
        return self._signed(key, expires_seconds, BlobSasPermissions(create=True), None), headers

    def url(self, key: str, expires_seconds: int = 3600) -> str:
        """A read SAS whose answer is a download (``Content-Disposition: attachment``), as on AWS."""
        return self._signed(key, expires_seconds, BlobSasPermissions(read=True), "attachment")

    def _signed(self, key: str, expires_seconds: int, permission: BlobSasPermissions, disposition: str | None) -> str:
        now = self.clock()
        expiry = datetime.fromtimestamp(now + max(1, min(MAX_SAS_SECONDS, expires_seconds)), UTC)
        blob = self.client.get_blob_client(self.container, key)
        if self.account_key:
            sas = generate_blob_sas(
                self.client.account_name or "",
                self.container,
                key,
                account_key=self.account_key,
                permission=permission,
                expiry=expiry,
                content_disposition=disposition,
            )
        else:
            sas = generate_blob_sas(
                self.client.account_name or "",
                self.container,
                key,
                user_delegation_key=self._delegation_key(now, expiry),
                permission=permission,
                expiry=expiry,
                content_disposition=disposition,
            )
        return f"{blob.url}?{sas}"

    def _delegation_key(self, now: float, expiry: datetime) -> UserDelegationKey:
        """A user delegation key valid until ``expiry`` at least: the kept one, or a new one
        valid for seven days."""
        with self._lock:
            if self._delegation is None or self._delegation_expires < expiry.timestamp():
                start = datetime.fromtimestamp(now - 300, UTC)  # some slack for clock skew
                until = datetime.fromtimestamp(now + DELEGATION_KEY_SECONDS, UTC)
                try:
                    self._delegation = self.client.get_user_delegation_key(start, until)
                except AzureError as e:
                    raise BackendError(f"cannot sign a URL: no user delegation key: {error_code(e) or e}") from e
                self._delegation_expires = until.timestamp()
            return self._delegation


def _info(blob: Any, key: str | None = None) -> ObjectInfo:
    """What a listing's or a head's blob properties say of the blob."""
    modified = blob.last_modified.timestamp() if blob.last_modified is not None else None
    return ObjectInfo(key or blob.name, int(blob.size), str(blob.etag or "").strip('"'), modified)
