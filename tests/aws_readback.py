"""What a provisioned AWS stack's resources say about themselves, read back from the services
(moto here), in one shape that does not depend on the stack's prefix (``read_stack``), and what
template.yaml declares in that same shape (``template_stack``): so two stacks, or a stack and the
template, can be compared with ``==``."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from runplane.adapters.aws.provision import AwsNames
from runplane.adapters.aws.sqs import events_queue_name, pool_queue_name
from runplane.adapters.names import TABLES
from tests.cfn_template import as_list, defaults, expanded_resources

TABLE_FIELDS = (*TABLES, "relay_table")
"""Every table of a stack (``runplane.adapters.names.TABLES``, and on AWS the relay's connections)."""
# What SQS gives a queue created without these attributes.
SQS_DEFAULT_RETENTION_SECONDS = 345600
SQS_DEFAULT_VISIBILITY_SECONDS = 30


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


def _key(kms: Any, names: AwsNames) -> dict[str, Any]:
    """The secrets key behind ``names.secrets_key``: its spec, usage, rotation, its alias (the
    prefix as ``PREFIX``), and its key policy with the account id replaced by ``ACCOUNT``."""
    key = kms.describe_key(KeyId=names.secrets_key)["KeyMetadata"]
    account = key["Arn"].split(":")[4]
    policy = kms.get_key_policy(KeyId=key["KeyId"], PolicyName="default")["Policy"]
    return {
        "KeySpec": key["KeySpec"],
        "KeyUsage": key["KeyUsage"],
        "KeyRotation": kms.get_key_rotation_status(KeyId=key["KeyId"])["KeyRotationEnabled"],
        "Alias": names.secrets_key.replace(names.prefix, "PREFIX", 1),
        "KeyPolicy": json.loads(policy.replace(f":{account}:", ":ACCOUNT:")),
    }


def read_stack(names: AwsNames, pools: Iterable[str], ddb: Any, sqs: Any, s3: Any, kms: Any = None) -> dict[str, Any]:
    """Tables (keys, indexes, TTL, PITR), queues (retention, visibility, redrive) by role, and
    the bucket's settings, with the bucket's name in its policy replaced by ``BUCKET`` (None:
    no policy); given ``kms``, the secrets key too (``key``)."""
    found = {
        "tables": {field: _table(ddb, getattr(names, field)) for field in TABLE_FIELDS},
        "queues": {role: _queue(sqs, name) for role, name in _queue_roles(names.prefix, pools)},
        "bucket": _bucket(s3, names.bucket),
    }
    if kms is not None:
        found["key"] = _key(kms, names)
    return found


# ---- the same shape, from template.yaml ---------------------------------------------------------


def _queue_roles(prefix: str, pools: Iterable[str]) -> list[tuple[str, str]]:
    """(role, queue name) of every queue of a stack, dead-letter queues included."""
    out = []
    for role, name in [(f"pool {p}", pool_queue_name(prefix, p)) for p in pools] + [
        ("events", events_queue_name(prefix))
    ]:
        out += [(role, name), (f"{role} dlq", f"{name}-dlq")]
    return out


def _declared_queue(props: dict[str, Any], dlq_id: str | None) -> dict[str, Any]:
    redrive = props.get("RedrivePolicy")
    return {
        "MessageRetentionPeriod": int(props.get("MessageRetentionPeriod", SQS_DEFAULT_RETENTION_SECONDS)),
        "VisibilityTimeout": int(props.get("VisibilityTimeout", SQS_DEFAULT_VISIBILITY_SECONDS)),
        "maxReceiveCount": int(redrive["maxReceiveCount"]) if redrive else None,
        "redrives to its own -dlq": (
            redrive["deadLetterTargetArn"] == {"Fn::GetAtt": [dlq_id, "Arn"]} if redrive else None
        ),
    }


def _declared_table(props: dict[str, Any]) -> dict[str, Any]:
    shape = table_shape(props)
    ttl = props.get("TimeToLiveSpecification", {})
    pitr = props.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled")
    return {
        "KeySchema": shape["KeySchema"],
        "AttributeDefinitions": shape["AttributeDefinitions"],
        "GlobalSecondaryIndexes": shape["GlobalSecondaryIndexes"],
        "TimeToLive": ("ENABLED", ttl["AttributeName"]) if ttl.get("Enabled") else ("DISABLED", None),
        "PointInTimeRecovery": "ENABLED" if pitr else "DISABLED",
    }


def _bucket_arn_as_read(value: Any, bucket_id: str) -> Any:
    """A policy's ``Resource`` entry with the bucket's ARN as read_stack() writes it (us-east-1)."""
    arn = "arn:aws:s3:::BUCKET"
    if value == {"Fn::GetAtt": [bucket_id, "Arn"]}:
        return arn
    if isinstance(value, dict) and isinstance(value.get("Fn::Sub"), str):
        return value["Fn::Sub"].replace(f"${{{bucket_id}.Arn}}", arn)
    return value


def _declared_bucket(declared: dict[str, Any]) -> dict[str, Any]:
    (bucket_id,) = [i for i, r in declared.items() if r["Type"] == "AWS::S3::Bucket"]
    props = declared[bucket_id]["Properties"]
    lifecycle = []
    for rule in props["LifecycleConfiguration"]["Rules"]:
        if "Fn::If" in rule:  # a rule of a parameter (UploadRetentionDays) whose default makes none
            continue
        api_rule = {"ID": rule["Id"], "Status": rule["Status"], "Filter": {"Prefix": rule.get("Prefix", "")}}
        lifecycle.append(api_rule | {k: v for k, v in rule.items() if k not in ("Id", "Status", "Prefix")})
    documents = [
        r["Properties"]["PolicyDocument"]
        for r in declared.values()
        if r["Type"] == "AWS::S3::BucketPolicy" and r["Properties"]["Bucket"] == {"Ref": bucket_id}
    ]
    policy = None
    if documents:
        (document,) = documents
        statements = [
            s | {"Resource": [_bucket_arn_as_read(r, bucket_id) for r in as_list(s["Resource"])]}
            for s in document["Statement"]
        ]
        policy = document | {"Statement": statements}
    return {
        "encryption": [
            c["ServerSideEncryptionByDefault"] for c in props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        ],
        "public_access_block": props["PublicAccessBlockConfiguration"],
        "ownership": props["OwnershipControls"]["Rules"],
        "versioning": props["VersioningConfiguration"]["Status"],
        "lifecycle": sorted(lifecycle, key=lambda r: r["ID"]),
        "policy": policy,
    }


def template_stack(template: dict[str, Any], pools: list[str]) -> dict[str, Any]:
    """What read_stack() should find on a stack deployed from ``template`` with ``pools``, in
    read_stack()'s shape: the template's own attributes, SQS's defaults where it gives none. Each
    resource is found by the name the template gives it (a KeyError: the template lacks it)."""
    declared = expanded_resources(template, pools)
    names = AwsNames(prefix=defaults(template)["Prefix"])
    by_name = {
        r["Properties"].get("TableName") or r["Properties"].get("QueueName"): (i, r["Properties"])
        for i, r in declared.items()
        if r["Type"] in ("AWS::DynamoDB::Table", "AWS::SQS::Queue")
    }
    queues = {}
    for role, name in _queue_roles(names.prefix, pools):
        dlq = by_name.get(f"{name}-dlq")
        queues[role] = _declared_queue(by_name[name][1], dlq[0] if dlq else None)
    return {
        "tables": {field: _declared_table(by_name[getattr(names, field)][1]) for field in TABLE_FIELDS},
        "queues": queues,
        "bucket": _declared_bucket(declared),
        "key": _declared_key(declared, names.prefix),
    }


def _declared_key(declared: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The secrets key as read_stack() reads it back: the key's properties, its alias (the prefix
    as ``PREFIX``), its policy with the template's partition and account as read_stack() writes them."""
    (key_id,) = [i for i, r in declared.items() if r["Type"] == "AWS::KMS::Key"]
    (alias,) = [r["Properties"] for r in declared.values() if r["Type"] == "AWS::KMS::Alias"]
    assert alias["TargetKeyId"] == {"Ref": key_id}
    props = declared[key_id]["Properties"]
    policy = json.loads(
        json.dumps(props["KeyPolicy"]).replace(
            '{"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:root"}', '"arn:aws:iam::ACCOUNT:root"'
        )
    )
    return {
        "KeySpec": props["KeySpec"],
        "KeyUsage": props["KeyUsage"],
        "KeyRotation": props["EnableKeyRotation"],
        "Alias": alias["AliasName"].replace(prefix, "PREFIX", 1),
        "KeyPolicy": policy,
    }
