"""Create the AWS resources template.yaml declares, for moto, LocalStack or a bare account.

Idempotent: existing resources are left as they are; a resource this call creates gets the
settings of ``runplane.adapters.aws.resources`` (the values template.yaml declares too): queue
visibility timeouts, retention and redrive, the workers table's TTL, point-in-time recovery, the
bucket's encryption, public-access block, ownership, versioning, lifecycle and (over HTTPS)
TLS-only policy, and the secrets key's spec, rotation and key policy. ``template.yaml`` stays the
production path; this mirrors it for the embedded local stack and the tests. The tables may be on
a DynamoDB server of their own (dynalite), which implements neither TTL nor point-in-time
recovery: those two are left out there.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from runplane.adapters.aws import resources
from runplane.adapters.aws.clients import error_code
from runplane.adapters.aws.dynamodb import BY_OWNER, BY_POOL, BY_PURGE, BY_QUEUE_STATE, BY_RANK, PURGE_DUE, PURGE_QUEUE
from runplane.adapters.aws.relay import KEY as RELAY_KEY
from runplane.adapters.aws.resources import MAX_RECEIVES
from runplane.adapters.aws.secrets import NAME, SCOPE
from runplane.adapters.aws.sessions import RUN_ID, SLOT
from runplane.adapters.aws.sqs import dead_letter_queue_name, events_queue_name, pool_queue_name
from runplane.adapters.names import StackNames
from runplane.settings import StackSettings

__all__ = ["MAX_RECEIVES", "AwsNames", "provision"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AwsNames(StackNames):
    """Resource names of one stack on AWS: each left empty is ``<prefix>-<role>`` (the bucket's
    role: ``data``), as template.yaml names them; the secrets key, ``alias/<prefix>-secrets``."""

    bucket: str = ""
    secrets_key: str = ""
    """The KMS key of secrets: a key id, ARN, alias name or alias ARN."""
    relay_table: str = ""
    """The sessions relay's connections (``runplane.adapters.aws.relay``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.bucket:
            object.__setattr__(self, "bucket", self.derive("data"))
        if not self.relay_table:
            object.__setattr__(self, "relay_table", self.derive("relay"))
        if not self.secrets_key:
            object.__setattr__(self, "secrets_key", f"alias/{self.derive('secrets')}")

    def derive(self, role: str) -> str:
        return f"{self.prefix}-{role}"

    @classmethod
    def of(cls, settings: StackSettings) -> AwsNames:
        """The names ``settings`` give."""
        return cls.named(
            settings, bucket=settings.bucket, secrets_key=settings.secrets_key, relay_table=settings.relay_table
        )


def _create_table(
    ddb: Any, name: str, key: str, attrs: dict[str, str], indexes: list[dict[str, Any]], sort_key: str | None = None
) -> bool:
    """Create the table unless it exists; True when this call created it. A table that exists
    gets the indexes it lacks (one made by an earlier version)."""
    schema = [{"AttributeName": key, "KeyType": "HASH"}]
    if sort_key:
        schema.append({"AttributeName": sort_key, "KeyType": "RANGE"})
    kwargs: dict[str, Any] = {
        "TableName": name,
        "KeySchema": schema,
        "AttributeDefinitions": [{"AttributeName": a, "AttributeType": t} for a, t in attrs.items()],
        "BillingMode": "PAY_PER_REQUEST",
    }
    if indexes:
        kwargs["GlobalSecondaryIndexes"] = indexes
    try:
        created = ddb.create_table(**kwargs)
    except ClientError as e:
        if error_code(e) != "ResourceInUseException":
            raise
        _add_indexes(ddb, name, attrs, indexes)
        return False
    # moto and LocalStack answer ACTIVE at once; DynamoDB says CREATING for a few seconds.
    if created.get("TableDescription", {}).get("TableStatus") != "ACTIVE":
        ddb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    return True


def _add_indexes(ddb: Any, name: str, attrs: dict[str, str], indexes: list[dict[str, Any]]) -> None:
    """Add to the existing table ``name`` each of ``indexes`` it does not have, one at a time (as
    DynamoDB allows), waiting for each to be built. Items written before an index existed are in
    it once it is built: DynamoDB backfills a new index."""
    if not indexes:
        return
    table = ddb.describe_table(TableName=name)["Table"]
    have = {index["IndexName"] for index in table.get("GlobalSecondaryIndexes", [])}
    for index in indexes:
        if index["IndexName"] in have:
            continue
        keys = [k["AttributeName"] for k in index["KeySchema"]]
        log.warning("table %s has no index %s (made by an earlier version): adding it", name, index["IndexName"])
        ddb.update_table(
            TableName=name,
            AttributeDefinitions=[{"AttributeName": a, "AttributeType": attrs[a]} for a in keys],
            GlobalSecondaryIndexUpdates=[{"Create": index}],
        )
        for _ in range(300):
            described = ddb.describe_table(TableName=name)["Table"].get("GlobalSecondaryIndexes", [])
            status = next((i.get("IndexStatus") for i in described if i["IndexName"] == index["IndexName"]), None)
            if status in (None, "ACTIVE"):
                break
            time.sleep(2)


def _index(name: str, hash_key: str, range_key: str) -> dict[str, Any]:
    return {
        "IndexName": name,
        "KeySchema": [{"AttributeName": hash_key, "KeyType": "HASH"}, {"AttributeName": range_key, "KeyType": "RANGE"}],
        "Projection": {"ProjectionType": "ALL"},
    }


def _table_setting(call: Callable[..., Any], what: str, **kwargs: Any) -> None:
    """Apply a table setting that DynamoDB, moto and LocalStack all implement. A server that serves
    only DynamoDB's data plane (dynalite) answers UnknownOperationException: its tables work the
    same without the setting, so it is left out there, with a warning."""
    try:
        call(**kwargs)
    except ClientError as e:
        if error_code(e) != "UnknownOperationException":
            raise
        log.warning("%s: not applied, the DynamoDB endpoint does not implement it", what)


def _time_to_live(ddb: Any, table: str, attribute: str, created: bool) -> None:
    """TTL on ``attribute`` of ``table``, unless the table has it on already (a table made by an
    earlier version has none: it gets it here, once)."""
    if not created:
        try:
            described = ddb.describe_time_to_live(TableName=table).get("TimeToLiveDescription", {})
        except ClientError as e:
            if error_code(e) != "UnknownOperationException":
                raise
            log.warning("time to live on %s: not applied, the DynamoDB endpoint does not implement it", table)
            return
        if described.get("TimeToLiveStatus") in ("ENABLED", "ENABLING"):
            return
    _table_setting(
        ddb.update_time_to_live,
        f"time to live on {table}",
        TableName=table,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": attribute},
    )


def _tables(ddb: Any, names: AwsNames) -> None:
    created = {
        "runs_table": _create_table(
            ddb,
            names.runs_table,
            "id",
            {"id": "S", "owner": "S", "qs": "S", "created_at": "N", "rank": "S", PURGE_QUEUE: "S", PURGE_DUE: "N"},
            [
                _index(BY_OWNER, "owner", "created_at"),
                _index(BY_QUEUE_STATE, "qs", "created_at"),
                _index(BY_RANK, "qs", "rank"),
                _index(BY_PURGE, PURGE_QUEUE, PURGE_DUE),
            ],
        ),
        "workers_table": _create_table(
            ddb, names.workers_table, "id", {"id": "S", "pool": "S"}, [_index(BY_POOL, "pool", "id")]
        ),
        "tokens_table": _create_table(ddb, names.tokens_table, "token_hash", {"token_hash": "S"}, []),
        "pools_table": _create_table(ddb, names.pools_table, "pool", {"pool": "S"}, []),
        "quotas_table": _create_table(ddb, names.quotas_table, "id", {"id": "S"}, []),
        "secrets_table": _create_table(ddb, names.secrets_table, SCOPE, {SCOPE: "S", NAME: "S"}, [], sort_key=NAME),
        # made on a stack of an earlier release too, when provision() runs again for this one
        "sessions_table": _create_table(ddb, names.sessions_table, RUN_ID, {RUN_ID: "S", SLOT: "N"}, [], sort_key=SLOT),
    }
    relay_made = _create_table(ddb, names.relay_table, RELAY_KEY, {RELAY_KEY: "S"}, [])
    _time_to_live(ddb, names.relay_table, resources.RELAY_TTL_ATTRIBUTE, relay_made)
    # Only on creation for the workers table: DynamoDB refuses to enable TTL that is already
    # enabled. The runs table's TTL came with retention: a table made before it gets it now.
    if created["workers_table"]:
        _table_setting(
            ddb.update_time_to_live,
            f"time to live on {names.workers_table}",
            TableName=names.workers_table,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": resources.WORKERS_TTL_ATTRIBUTE},
        )
    _time_to_live(ddb, names.runs_table, resources.RUNS_TTL_ATTRIBUTE, created["runs_table"])
    for attr in resources.PITR_TABLES:
        if created[attr]:
            _table_setting(
                ddb.update_continuous_backups,
                f"point-in-time recovery on {getattr(names, attr)}",
                TableName=getattr(names, attr),
                PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True},
            )


def _queue_with_dlq(sqs: Any, name: str, visibility_seconds: int) -> None:
    retention = str(resources.MESSAGE_RETENTION_SECONDS)
    dlq_url = sqs.create_queue(
        QueueName=dead_letter_queue_name(name), Attributes={"MessageRetentionPeriod": retention}
    )["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    try:
        sqs.create_queue(
            QueueName=name,
            Attributes={
                "MessageRetentionPeriod": retention,
                "VisibilityTimeout": str(visibility_seconds),
                "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(MAX_RECEIVES)}),
            },
        )
    except ClientError as e:
        # SQS says so only when the queue exists with other attributes: left as it is.
        if error_code(e) != "QueueAlreadyExists":
            raise


def _bucket(s3: Any, bucket: str, region: str, tls_only: bool) -> None:
    try:
        if region == "us-east-1":
            s3.create_bucket(Bucket=bucket)
        else:
            s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})
    except ClientError as e:
        if error_code(e) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
        return
    # us-east-1 answers success for a bucket one owns already: there these are applied again,
    # which changes nothing (each call sets the whole configuration).
    s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration=resources.BUCKET_ENCRYPTION)
    s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration=resources.PUBLIC_ACCESS_BLOCK)
    s3.put_bucket_ownership_controls(
        Bucket=bucket, OwnershipControls={"Rules": [{"ObjectOwnership": resources.OBJECT_OWNERSHIP}]}
    )
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": resources.VERSIONING_STATUS})
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": resources.lifecycle_rules()})
    if tls_only:
        s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(resources.bucket_policy(bucket, region)))


def _queues(sqs: Any, prefix: str, pools: list[str]) -> None:
    for pool in pools:
        _queue_with_dlq(sqs, pool_queue_name(prefix, pool), resources.POOL_VISIBILITY_SECONDS)
    _queue_with_dlq(sqs, events_queue_name(prefix), resources.EVENTS_VISIBILITY_SECONDS)


def _secrets_key(kms: Any, alias: str) -> None:
    """The symmetric KMS key of secrets under ``alias``, unless the alias exists: key rotation on,
    the key policy of ``resources.secrets_key_policy`` (the account administers it; who may use it
    is the IAM policies' to say)."""
    try:
        kms.describe_key(KeyId=alias)
        return
    except ClientError as e:
        if error_code(e) != "NotFoundException":
            raise
    key = kms.create_key(
        Description=resources.SECRETS_KEY_DESCRIPTION,
        KeySpec=resources.SECRETS_KEY_SPEC,
        KeyUsage=resources.SECRETS_KEY_USAGE,
    )["KeyMetadata"]
    _, partition, _, _, account, _ = key["Arn"].split(":", 5)
    kms.put_key_policy(
        KeyId=key["KeyId"], PolicyName="default", Policy=json.dumps(resources.secrets_key_policy(partition, account))
    )
    kms.enable_key_rotation(KeyId=key["KeyId"])
    try:
        kms.create_alias(AliasName=alias, TargetKeyId=key["KeyId"])
    except ClientError as e:
        if error_code(e) != "AlreadyExistsException":
            raise
        # another provision() made it meanwhile: this key is not needed
        kms.schedule_key_deletion(KeyId=key["KeyId"], PendingWindowInDays=7)


def provision(
    names: AwsNames,
    pools: Iterable[str],
    ddb: Any,
    sqs: Any,
    s3: Any,
    region: str = "us-east-1",
    *,
    tls_only: bool | None = None,
    kms: Any = None,
) -> None:
    """Create tables, queues (with DLQs) and the bucket, each with the settings of ``resources``,
    and (given ``kms``, a KMS client) the key of secrets, when ``names.secrets_key`` is an alias
    that does not exist yet (a key named by its id or ARN is the operator's: left alone).

    ``tls_only``: give the bucket the policy that refuses requests made without TLS. By default
    only when ``s3`` talks to its endpoint over HTTPS: on a local stack served over plain HTTP
    (moto, LocalStack) that policy would refuse every request (moto even refuses them all
    whatever the transport, as it does not evaluate the policy's condition).
    """
    if tls_only is None:
        tls_only = str(s3.meta.endpoint_url).startswith("https://")
    _tables(ddb, names)
    _queues(sqs, names.prefix, list(pools))
    _bucket(s3, names.bucket, region, tls_only)
    if kms is not None and names.secrets_key.startswith("alias/"):
        _secrets_key(kms, names.secrets_key)
