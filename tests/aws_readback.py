"""What a provisioned AWS stack's resources say about themselves, read back from the services
(moto here), in one shape that does not depend on the stack's prefix: so two stacks, or a stack
and the template, can be compared with ``==``."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from runplane.adapters.aws.provision import AwsNames
from runplane.adapters.aws.sqs import events_queue_name, pool_queue_name

TABLE_FIELDS = ("runs_table", "workers_table", "tokens_table", "pools_table")


def table_shape(props: dict[str, Any]) -> dict[str, Any]:
    """The parts of a table definition (the template's properties, or what DescribeTable says)
    that the code depends on, order-insensitive where AWS is."""
    return {
        "KeySchema": props["KeySchema"],
        "AttributeDefinitions": sorted(props["AttributeDefinitions"], key=lambda a: a["AttributeName"]),
        "GlobalSecondaryIndexes": sorted(
            (
                {k: i[k] for k in ("IndexName", "KeySchema", "Projection")}
                for i in props.get("GlobalSecondaryIndexes", [])
            ),
            key=lambda i: i["IndexName"],
        ),
        "BillingMode": props.get("BillingMode") or props.get("BillingModeSummary", {}).get("BillingMode"),
    }


def _table(ddb: Any, name: str) -> dict[str, Any]:
    table = ddb.describe_table(TableName=name)["Table"]
    ttl = ddb.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
    pitr = ddb.describe_continuous_backups(TableName=name)["ContinuousBackupsDescription"]
    shape = table_shape(table)
    return {
        "KeySchema": shape["KeySchema"],
        "AttributeDefinitions": shape["AttributeDefinitions"],
        "GlobalSecondaryIndexes": shape["GlobalSecondaryIndexes"],
        "TimeToLive": (ttl["TimeToLiveStatus"], ttl.get("AttributeName")),
        "PointInTimeRecovery": pitr["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"],
    }


def _queue(sqs: Any, name: str) -> dict[str, Any]:
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    redrive = json.loads(attrs.get("RedrivePolicy", "{}"))
    dlq = redrive.get("deadLetterTargetArn", "").rsplit(":", 1)[-1]
    return {
        "MessageRetentionPeriod": int(attrs["MessageRetentionPeriod"]),
        "VisibilityTimeout": int(attrs["VisibilityTimeout"]),
        "maxReceiveCount": int(redrive["maxReceiveCount"]) if redrive else None,
        "redrives to its own -dlq": dlq == f"{name}-dlq" if redrive else None,
    }


def _bucket(s3: Any, bucket: str) -> dict[str, Any]:
    encryption = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]
    rules = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    try:
        policy = json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"].replace(bucket, "BUCKET"))
    except s3.exceptions.ClientError as e:
        if e.response["Error"]["Code"] != "NoSuchBucketPolicy":
            raise
        policy = None
    return {
        "encryption": [r["ApplyServerSideEncryptionByDefault"] for r in encryption["Rules"]],
        "public_access_block": s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"],
        "ownership": s3.get_bucket_ownership_controls(Bucket=bucket)["OwnershipControls"]["Rules"],
        "versioning": s3.get_bucket_versioning(Bucket=bucket).get("Status"),
        "lifecycle": sorted(rules, key=lambda r: r["ID"]),
        "policy": policy,
    }


def read_stack(names: AwsNames, pools: Iterable[str], ddb: Any, sqs: Any, s3: Any) -> dict[str, Any]:
    """Tables (keys, indexes, TTL, PITR), queues (retention, visibility, redrive) by role, and
    the bucket's settings, with the bucket's name in its policy replaced by ``BUCKET`` (None:
    no policy)."""
    queues: dict[str, Any] = {}
    for role, name in [(f"pool {p}", pool_queue_name(names.prefix, p)) for p in pools] + [
        ("events", events_queue_name(names.prefix))
    ]:
        queues[role] = _queue(sqs, name)
        queues[f"{role} dlq"] = _queue(sqs, f"{name}-dlq")
    return {
        "tables": {field: _table(ddb, getattr(names, field)) for field in TABLE_FIELDS},
        "queues": queues,
        "bucket": _bucket(s3, names.bucket),
    }
