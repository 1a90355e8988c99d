"""Create the AWS resources template.yaml declares, for moto, LocalStack or a bare account.

Idempotent: existing resources are left as they are. ``template.yaml`` stays the production
path; this mirrors it for the embedded local stack and the tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from runplane.adapters.aws.clients import error_code
from runplane.adapters.aws.dynamodb import BY_OWNER, BY_QUEUE_STATE
from runplane.adapters.aws.sqs import events_queue_name, pool_queue_name

MAX_RECEIVES = 5


@dataclass(frozen=True)
class AwsNames:
    prefix: str = "runplane"
    runs_table: str = ""
    workers_table: str = ""
    tokens_table: str = ""
    bucket: str = ""
    pools_table: str = ""

    def __post_init__(self) -> None:
        for attr, suffix in (
            ("runs_table", "runs"),
            ("workers_table", "workers"),
            ("tokens_table", "tokens"),
            ("bucket", "data"),
            ("pools_table", "pools"),
        ):
            if not getattr(self, attr):
                object.__setattr__(self, attr, f"{self.prefix}-{suffix}")


def _create_table(ddb: Any, name: str, key: str, attrs: dict[str, str], indexes: list[dict[str, Any]]) -> None:
    kwargs: dict[str, Any] = {
        "TableName": name,
        "KeySchema": [{"AttributeName": key, "KeyType": "HASH"}],
        "AttributeDefinitions": [{"AttributeName": a, "AttributeType": t} for a, t in attrs.items()],
        "BillingMode": "PAY_PER_REQUEST",
    }
    if indexes:
        kwargs["GlobalSecondaryIndexes"] = indexes
    try:
        ddb.create_table(**kwargs)
    except ClientError as e:
        if error_code(e) != "ResourceInUseException":
            raise
        return
    ddb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})


def _index(name: str, hash_key: str, range_key: str) -> dict[str, Any]:
    return {
        "IndexName": name,
        "KeySchema": [{"AttributeName": hash_key, "KeyType": "HASH"}, {"AttributeName": range_key, "KeyType": "RANGE"}],
        "Projection": {"ProjectionType": "ALL"},
    }


def _queue_with_dlq(sqs: Any, name: str) -> None:
    dlq_url = sqs.create_queue(QueueName=f"{name}-dlq", Attributes={"MessageRetentionPeriod": "1209600"})["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sqs.create_queue(
        QueueName=name,
        Attributes={
            "MessageRetentionPeriod": "1209600",
            "VisibilityTimeout": "60",
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(MAX_RECEIVES)}),
        },
    )


def provision(names: AwsNames, pools: Iterable[str], ddb: Any, sqs: Any, s3: Any, region: str = "us-east-1") -> None:
    """Create tables, queues (with DLQs) and the bucket."""
    _create_table(
        ddb,
        names.runs_table,
        "id",
        {"id": "S", "owner": "S", "qs": "S", "created_at": "N"},
        [_index(BY_OWNER, "owner", "created_at"), _index(BY_QUEUE_STATE, "qs", "created_at")],
    )
    _create_table(ddb, names.workers_table, "id", {"id": "S"}, [])
    _create_table(ddb, names.tokens_table, "token_hash", {"token_hash": "S"}, [])
    _create_table(ddb, names.pools_table, "pool", {"pool": "S"}, [])
    for pool in pools:
        _queue_with_dlq(sqs, pool_queue_name(names.prefix, pool))
    _queue_with_dlq(sqs, events_queue_name(names.prefix))
    try:
        if region == "us-east-1":
            s3.create_bucket(Bucket=names.bucket)
        else:
            s3.create_bucket(Bucket=names.bucket, CreateBucketConfiguration={"LocationConstraint": region})
    except ClientError as e:
        if error_code(e) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
