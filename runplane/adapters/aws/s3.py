"""S3 object store: logs, outputs, presigned URLs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

from runplane.adapters.aws.clients import error_code
from runplane.domain.errors import BackendError, NotFound
from runplane.ports import ObjectInfo

_TRANSFER = TransferConfig(multipart_threshold=16 * 1024**2, multipart_chunksize=16 * 1024**2, max_concurrency=4)


class S3ObjectStore:
    def __init__(self, bucket: str, client: Any) -> None:
        self.bucket = bucket
        self.client = client

    def put_bytes(self, key: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        except (ClientError, BotoCoreError) as e:
            raise BackendError(f"upload {key}: {e}") from e

    def put_file(self, key: str, path: Path) -> None:
        try:
            self.client.upload_file(str(path), self.bucket, key, Config=_TRANSFER)
        except (ClientError, BotoCoreError) as e:
            raise BackendError(f"upload {key}: {e}") from e

    def get_bytes(self, key: str) -> bytes:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except ClientError as e:
            if error_code(e) in ("NoSuchKey", "404"):
                raise NotFound(f"object {key} not found") from e
            raise BackendError(f"download {key}: {e}") from e
        except BotoCoreError as e:
            raise BackendError(f"download {key}: {e}") from e

    def download_file(self, key: str, path: Path) -> None:
        try:
            self.client.download_file(self.bucket, key, str(path), Config=_TRANSFER)
        except ClientError as e:
            if error_code(e) in ("NoSuchKey", "404"):
                raise NotFound(f"object {key} not found") from e
            raise BackendError(f"download {key}: {e}") from e
        except BotoCoreError as e:
            raise BackendError(f"download {key}: {e}") from e

    def list(self, prefix: str, start_after: str | None = None, limit: int | None = None) -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if start_after:
            kwargs["StartAfter"] = start_after
        if limit is not None:
            kwargs["PaginationConfig"] = {"MaxItems": limit, "PageSize": min(limit, 1000)}
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(**kwargs):
                out.extend(
                    ObjectInfo(o["Key"], int(o["Size"]), str(o.get("ETag", "")).strip('"'))
                    for o in page.get("Contents", [])
                )
        except (ClientError, BotoCoreError) as e:
            raise BackendError(f"list {prefix}: {e}") from e
        return sorted(out, key=lambda o: o.key)[:limit]

    def within(self, bucket: str) -> S3ObjectStore:
        return self if bucket == self.bucket else S3ObjectStore(bucket, self.client)

    def url(self, key: str, expires_seconds: int = 3600) -> str:
        return str(
            self.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=expires_seconds
            )
        )
