"""The settings of a stack's AWS resources, in one place.

``template.yaml`` declares them for a deployed stack, ``provision()`` creates them on moto,
LocalStack or a bare account, and ``localstack/init/ready.d/10-runplane.sh`` creates them on
LocalStack. ``tests/integration/test_template.py`` holds the template and the hook to the values
here, so the three cannot drift apart. Shapes are those of the S3 and SQS APIs (what boto3 sends).
"""

from __future__ import annotations

from typing import Any

# ---- SQS ----------------------------------------------------------------------------------------

MESSAGE_RETENTION_SECONDS = 14 * 24 * 3600
"""Every queue and dead-letter queue keeps messages 14 days, the SQS maximum."""
POOL_VISIBILITY_SECONDS = 60
"""A pool queue's default visibility timeout (agents also set their own on each receive)."""
EVENTS_VISIBILITY_SECONDS = 360
"""The dispatcher's event queue: six times the dispatcher's 60 s timeout, as Lambda advises for
SQS event sources (a shorter one would redeliver events still being handled)."""
MAX_RECEIVES = 5
"""Receives before SQS moves a message to the queue's dead-letter queue."""

# ---- DynamoDB -----------------------------------------------------------------------------------

WORKERS_TTL_ATTRIBUTE = "expires_at"
"""The workers table's TTL attribute: a worker that stops heartbeating expires on its own."""
RUNS_TTL_ATTRIBUTE = "ttl"
"""The runs table's TTL attribute (``runplane.domain.retention.ttl_at``): a backstop that deletes a
finished run's record some days after its retention's date, should the retention sweep not have."""
RELAY_TTL_ATTRIBUTE = "expires_at"
"""The relay's connections table's TTL attribute: records of a connection whose ``$disconnect`` never
came (API Gateway delivers it on a best-effort basis) go on their own."""
PITR_TABLES = ("runs_table", "tokens_table", "quotas_table", "secrets_table")
"""The tables (``AwsNames`` fields) with point-in-time recovery: the records that cannot be
rebuilt (runs, tokens, the quotas admins set and the use charged against them, secrets). Workers
and pool records are rewritten every few seconds and need none."""

# ---- KMS: the key of secrets --------------------------------------------------------------------

SECRETS_KEY_SPEC = "SYMMETRIC_DEFAULT"
SECRETS_KEY_USAGE = "ENCRYPT_DECRYPT"
SECRETS_KEY_ROTATION = True
SECRETS_KEY_DESCRIPTION = "runplane secrets: wraps the data key of each secret's value"


SECRETS_KEY_CONDITION: dict[str, Any] = {
    "StringLike": {"kms:EncryptionContext:runplane:scope": ["user:*", "group:*"]},
    "ForAllValues:StringEquals": {"kms:EncryptionContextKeys": ["runplane:scope", "runplane:name"]},
}
"""The condition of every IAM grant on the secrets key (template.yaml): a data key is made or
opened only for a secret's context (``runplane.domain.secrets.context``), never for a bare one."""


def secrets_key_policy(partition: str, account: str) -> dict[str, Any]:
    """The key policy of the secrets key: the account administers it, and no principal is named
    beside it, so who may use the key is decided by IAM policies alone (template.yaml: the API may
    only GenerateDataKey, the workers only Decrypt)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "AccountAdministers",
                "Effect": "Allow",
                "Principal": {"AWS": f"arn:{partition}:iam::{account}:root"},
                "Action": "kms:*",
                "Resource": "*",
            }
        ],
    }


# ---- S3: the data bucket ------------------------------------------------------------------------

SSE_ALGORITHM = "AES256"
BUCKET_ENCRYPTION: dict[str, Any] = {"Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": SSE_ALGORITHM}}]}
PUBLIC_ACCESS_BLOCK: dict[str, bool] = {
    "BlockPublicAcls": True,
    "IgnorePublicAcls": True,
    "BlockPublicPolicy": True,
    "RestrictPublicBuckets": True,
}
OBJECT_OWNERSHIP = "BucketOwnerEnforced"
"""ACLs off: the bucket owner owns every object."""
VERSIONING_STATUS = "Enabled"
"""Versioning keeps an overwritten or deleted log or output recoverable for a while..."""
NONCURRENT_VERSION_DAYS = 7
"""...for this many days; then the lifecycle rule expires the old version, so cost stays bounded
(the agent's own log, rewritten every few minutes, would otherwise pile up versions)."""
ABORT_INCOMPLETE_UPLOADS_DAYS = 7
NONCURRENT_UPLOAD_DAYS = 1
"""An upload in use is renewed by a copy onto itself (``S3ObjectStore.touch``), each leaving the
version before it noncurrent: those go after a day, not a week, so an upload is not kept several times over."""


def lifecycle_rules() -> list[dict[str, Any]]:
    """The bucket's lifecycle rules (``put_bucket_lifecycle_configuration``'s ``Rules``)."""
    return [
        {
            "ID": "abort-incomplete-uploads",
            "Status": "Enabled",
            "Filter": {"Prefix": ""},
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": ABORT_INCOMPLETE_UPLOADS_DAYS},
        },
        {
            "ID": "expire-noncurrent-versions",
            "Status": "Enabled",
            "Filter": {"Prefix": ""},
            "NoncurrentVersionExpiration": {"NoncurrentDays": NONCURRENT_VERSION_DAYS},
        },
        {
            "ID": "expire-noncurrent-uploads",
            "Status": "Enabled",
            "Filter": {"Prefix": "uploads/"},
            "NoncurrentVersionExpiration": {"NoncurrentDays": NONCURRENT_UPLOAD_DAYS},
        },
    ]


def partition(region: str) -> str:
    """The ARN partition of ``region``."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def tls_only_statement(bucket_arn: str) -> dict[str, Any]:
    """Deny every request to the bucket and its objects that does not come over TLS."""
    return {
        "Sid": "DenyInsecureTransport",
        "Effect": "Deny",
        "Principal": "*",
        "Action": "s3:*",
        "Resource": [bucket_arn, f"{bucket_arn}/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }


def bucket_policy(bucket: str, region: str) -> dict[str, Any]:
    """The data bucket's policy: TLS only."""
    arn = f"arn:{partition(region)}:s3:::{bucket}"
    return {"Version": "2012-10-17", "Statement": [tls_only_statement(arn)]}
