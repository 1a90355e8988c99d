"""S3 object store: logs, outputs, presigned URLs."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

from runplane.adapters.aws.clients import error_code
from runplane.domain.errors import BackendError, NotFound, PayloadTooLarge
from runplane.domain.uploads import PUT_URL_SECONDS
from runplane.ports import MAX_DELETE, ObjectInfo

log = logging.getLogger(__name__)

_TRANSFER = TransferConfig(multipart_threshold=16 * 1024**2, multipart_chunksize=16 * 1024**2, max_concurrency=4)


def _failed(e: Exception, what: str, key: str) -> BackendError:
    """Our error for what S3 (or botocore) answered: its code, never its words, which stay in our
    log (a failure's message reaches users, as a run's input or output that could not move)."""
    cause: BaseException | None = e
    while cause is not None and not isinstance(cause, ClientError):  # the transfer manager wraps them
        cause = cause.__cause__ or cause.__context__
    code = (error_code(cause) if cause is not None else "") or e.__class__.__name__
    log.warning("%s %s: S3 answered %s: %s", what, key, code, e)
    return BackendError(f"{what} {key}: {code}")


class _TooLarge(Exception):
    """A download past its ``max_bytes``, raised in the transfer's progress callback."""


class S3ObjectStore:
    def __init__(self, bucket: str, client: Any) -> None:
        self.bucket = bucket
        self.client = client

    def put_bytes(self, key: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        except (ClientError, BotoCoreError) as e:
            raise _failed(e, "upload", key) from e

    def put_file(self, key: str, path: Path) -> None:
        try:
            self.client.upload_file(str(path), self.bucket, key, Config=_TRANSFER)
        except (ClientError, BotoCoreError, S3UploadFailedError) as e:  # the transfer manager wraps errors
            raise _failed(e, "upload", key) from e

    def get_bytes(self, key: str) -> bytes:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except ClientError as e:
            if error_code(e) in ("NoSuchKey", "404"):
                raise NotFound(f"object {key} not found") from e
            raise _failed(e, "download", key) from e
        except BotoCoreError as e:
            raise _failed(e, "download", key) from e

    def download_file(self, key: str, path: Path, max_bytes: int | None = None) -> None:
        received = 0

        def count(n: int) -> None:  # called as parts arrive: raising stops the transfer
            nonlocal received
            received += n
            if max_bytes is not None and received > max_bytes:
                raise _TooLarge

        try:
            self.client.download_file(self.bucket, key, str(path), Config=_TRANSFER, Callback=count)
        except _TooLarge:
            path.unlink(missing_ok=True)
            raise PayloadTooLarge(f"object {key} holds more than {max_bytes} bytes") from None
        except ClientError as e:
            if error_code(e) in ("NoSuchKey", "404"):
                raise NotFound(f"object {key} not found") from e
            raise _failed(e, "download", key) from e
        except BotoCoreError as e:
            raise _failed(e, "download", key) from e

    def list_page(self, prefix: str, cursor: str | None, limit: int) -> tuple[list[ObjectInfo], str | None]:
        # the cursor is the last key of the previous page: S3 starts after it, inside the prefix
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": limit}
        if cursor:
            kwargs["StartAfter"] = cursor
        try:
            resp = self.client.list_objects_v2(**kwargs)
        except (ClientError, BotoCoreError) as e:
            raise _failed(e, "list", prefix) from e
        found = [_info(o) for o in resp.get("Contents", [])]
        return found, found[-1].key if found and resp.get("IsTruncated") else None

    def list(self, prefix: str) -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                out.extend(_info(o) for o in page.get("Contents", []))
        except (ClientError, BotoCoreError) as e:
            raise _failed(e, "list", prefix) from e
        return sorted(out, key=lambda o: o.key)

    def within(self, bucket: str) -> S3ObjectStore:
        return self if bucket == self.bucket else S3ObjectStore(bucket, self.client)

    def url(self, key: str, expires_seconds: int = 3600) -> str:
        """A presigned GET whose answer is a download (``Content-Disposition: attachment``): an
        output a run wrote as HTML is saved, never shown as a page from the bucket's origin."""
        params = {"Bucket": self.bucket, "Key": key, "ResponseContentDisposition": "attachment"}
        return str(self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=expires_seconds))

    def head(self, key: str) -> ObjectInfo | None:
        try:
            found = self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            if error_code(e) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise _failed(e, "head", key) from e
        except BotoCoreError as e:
            raise _failed(e, "head", key) from e
        return ObjectInfo(
            key, int(found["ContentLength"]), str(found.get("ETag", "")).strip('"'), _epoch(found.get("LastModified"))
        )

    def delete(self, keys: Sequence[str]) -> None:
        """One DeleteObjects (quiet: S3 answers only the keys it could not delete). In the versioned
        bucket each becomes a delete marker; the lifecycle rule expires the old version later."""
        if not keys:
            return
        if len(keys) > MAX_DELETE:
            raise ValueError(f"at most {MAX_DELETE} keys a call")
        objects = [{"Key": key} for key in keys]
        try:
            resp = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})
        except (ClientError, BotoCoreError) as e:
            raise _failed(e, "delete", keys[0]) from e
        if errors := resp.get("Errors"):
            log.warning("delete: S3 kept %d objects: %s", len(errors), errors[:5])
            raise BackendError(f"delete {errors[0].get('Key', '')}: {errors[0].get('Code', 'failed')}")

    def touch(self, key: str) -> None:
        """Copy the object onto itself, its content type and metadata kept: S3 gives it a new
        last-modified time, which the bucket's lifecycle rule counts from. One CopyObject copies up
        to 5 GiB, as much as the one presigned PUT an upload is sent with holds."""
        try:
            found = self.client.head_object(Bucket=self.bucket, Key=key)
            self.client.copy_object(
                Bucket=self.bucket,
                Key=key,
                CopySource={"Bucket": self.bucket, "Key": key},
                MetadataDirective="REPLACE",
                Metadata=found.get("Metadata", {}),
                ContentType=found.get("ContentType", "binary/octet-stream"),
            )
        except ClientError as e:
            if error_code(e) in ("NoSuchKey", "404", "NotFound"):
                raise NotFound(f"object {key} not found") from e
            raise _failed(e, "touch", key) from e
        except BotoCoreError as e:
            raise _failed(e, "touch", key) from e

    def put_url(
        self, key: str, size: int, md5: str, expires_seconds: int = PUT_URL_SECONDS
    ) -> tuple[str, dict[str, str]]:
        """A presigned PUT whose signature covers ``Content-MD5`` and ``Content-Length``: S3 refuses
        a request declaring others (403), and a body whose MD5 is not the declared one (BadDigest)."""
        headers = {"Content-MD5": md5, "Content-Length": str(size), "Content-Type": "application/gzip"}
        params = {"Bucket": self.bucket, "Key": key, "ContentMD5": md5, "ContentLength": size}
        params["ContentType"] = headers["Content-Type"]
        return str(self.client.generate_presigned_url("put_object", Params=params, ExpiresIn=expires_seconds)), headers


def _info(obj: dict[str, Any]) -> ObjectInfo:
    return ObjectInfo(
        obj["Key"], int(obj["Size"]), str(obj.get("ETag", "")).strip('"'), _epoch(obj.get("LastModified"))
    )


def _epoch(when: object) -> float | None:
    """An object's LastModified (botocore parses it into a datetime) in seconds since the epoch."""
    return when.timestamp() if isinstance(when, datetime) else None
