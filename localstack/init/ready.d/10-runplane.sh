#!/usr/bin/env bash
# LocalStack init hook: create runplane's tables, queues and bucket once LocalStack is ready.
#
# The same resources as template.yaml and runplane/adapters/aws/provision.py, with the settings of
# runplane/adapters/aws/resources.py (tests/integration/test_template.py holds the three to those
# values): the runs table with its by_owner, by_queue_state, by_rank and by_purge indexes, the workers (by_pool),
# tokens, pools, quotas, secrets (scope, name), sessions (run_id, slot) and relay (id) tables, a queue and a dead-letter queue per pool, the
# dispatcher's event queue, the bucket, the KMS key of secrets and its alias; TTL on the workers, runs and relay tables,
# point-in-time recovery on the runs, tokens, quotas and secrets tables, the bucket's encryption,
# public-access block, ownership, versioning, lifecycle and TLS-only policy, and the key's rotation
# and key policy (the account administers it).
# Idempotent: what exists already is left as it is (the settings are applied again, which changes
# nothing), so a restart with a persisted state is fine.
#
# Environment (all optional):
#   RUNPLANE_PREFIX      resource name prefix                      (default: runplane)
#   RUNPLANE_POOL_NAMES  comma-separated pool names                (default: default)
#   RUNPLANE_RUNS_TABLE, RUNPLANE_WORKERS_TABLE, RUNPLANE_TOKENS_TABLE, RUNPLANE_POOLS_TABLE,
#   RUNPLANE_QUOTAS_TABLE, RUNPLANE_SECRETS_TABLE, RUNPLANE_SESSIONS_TABLE, RUNPLANE_RELAY_TABLE,
#   RUNPLANE_BUCKET      override one name, as runplane's settings do (default: <prefix>-runs,
#                        <prefix>-workers, <prefix>-tokens, <prefix>-pools, <prefix>-quotas,
#                        <prefix>-secrets, <prefix>-sessions, <prefix>-relay, <prefix>-data)
#   RUNPLANE_SECRETS_KEY the KMS key of secrets (default: alias/<prefix>-secrets, made here when
#                        missing; a key id or ARN is used as it is, nothing made)
set -euo pipefail

prefix=${RUNPLANE_PREFIX:-runplane}
pool_names=${RUNPLANE_POOL_NAMES:-default}
runs_table=${RUNPLANE_RUNS_TABLE:-$prefix-runs}
workers_table=${RUNPLANE_WORKERS_TABLE:-$prefix-workers}
tokens_table=${RUNPLANE_TOKENS_TABLE:-$prefix-tokens}
pools_table=${RUNPLANE_POOLS_TABLE:-$prefix-pools}
quotas_table=${RUNPLANE_QUOTAS_TABLE:-$prefix-quotas}
secrets_table=${RUNPLANE_SECRETS_TABLE:-$prefix-secrets}
sessions_table=${RUNPLANE_SESSIONS_TABLE:-$prefix-sessions}
relay_table=${RUNPLANE_RELAY_TABLE:-$prefix-relay}
secrets_key=${RUNPLANE_SECRETS_KEY:-alias/$prefix-secrets}
bucket=${RUNPLANE_BUCKET:-$prefix-data}
region=${AWS_DEFAULT_REGION:-us-east-1}

# The values of runplane/adapters/aws/resources.py (this hook runs where runplane is not
# installed, so they are repeated here; the tests compare them).
retention=1209600        # MESSAGE_RETENTION_SECONDS: 14 days, the SQS maximum
pool_visibility=60       # POOL_VISIBILITY_SECONDS
events_visibility=360    # EVENTS_VISIBILITY_SECONDS: six times the dispatcher's timeout
max_receives=5           # MAX_RECEIVES
ttl_attribute=expires_at # WORKERS_TTL_ATTRIBUTE
runs_ttl_attribute=ttl   # RUNS_TTL_ATTRIBUTE
relay_ttl_attribute=expires_at # RELAY_TTL_ATTRIBUTE
sse_algorithm=AES256     # SSE_ALGORITHM
object_ownership=BucketOwnerEnforced  # OBJECT_OWNERSHIP
noncurrent_days=7        # NONCURRENT_VERSION_DAYS
noncurrent_upload_days=1 # NONCURRENT_UPLOAD_DAYS
abort_days=7             # ABORT_INCOMPLETE_UPLOADS_DAYS
key_spec=SYMMETRIC_DEFAULT  # SECRETS_KEY_SPEC
key_usage=ENCRYPT_DECRYPT   # SECRETS_KEY_USAGE
key_description="runplane secrets: wraps the data key of each secret's value"  # SECRETS_KEY_DESCRIPTION

log() { echo "runplane-init: $*"; }

# Run an awslocal create command; "already exists" is success (SQS answers that only when the
# attributes differ; with the same ones create-queue simply succeeds), anything else fails the hook.
create() {
  local what=$1 out
  shift
  if out=$(awslocal "$@" 2>&1); then
    log "$what ok"
    return 0
  fi
  case $out in
    *ResourceInUseException* | *QueueAlreadyExists* | *BucketAlreadyOwnedByYou* | *BucketAlreadyExists* | *"already exists"*)
      log "$what exists, left as it is" ;;
    *)
      echo "$out" >&2
      log "could not create $what"
      return 1 ;;
  esac
}

create_table() {  # name, then the key arguments of create-table
  local name=$1
  shift
  create "table $name" dynamodb create-table --table-name "$name" --billing-mode PAY_PER_REQUEST "$@"
  awslocal dynamodb wait table-exists --table-name "$name"
}

# Apply a setting (an awslocal command); the answers listed after "--" mean it is in place.
apply() {
  local what=$1 out
  shift
  local args=() ok=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && shift && ok=("$@")
  if out=$(awslocal "${args[@]}" 2>&1); then
    log "$what ok"
    return 0
  fi
  for answer in "${ok[@]}"; do
    if [[ $out == *"$answer"* ]]; then
      log "$what already in place"
      return 0
    fi
  done
  echo "$out" >&2
  log "could not set $what"
  return 1
}

queue_url() { awslocal sqs get-queue-url --queue-name "$1" --query QueueUrl --output text; }

queue_with_dlq() {  # name, visibility: creates name-dlq, then name redriving to it after $max_receives receives
  local name=$1 visibility=$2 dlq_arn redrive
  create "queue $name-dlq" sqs create-queue --queue-name "$name-dlq" \
    --attributes "{\"MessageRetentionPeriod\":\"$retention\"}"
  dlq_arn=$(awslocal sqs get-queue-attributes --queue-url "$(queue_url "$name-dlq")" \
    --attribute-names QueueArn --query Attributes.QueueArn --output text)
  # RedrivePolicy is itself a JSON document, passed as a string value.
  redrive="{\\\"deadLetterTargetArn\\\":\\\"$dlq_arn\\\",\\\"maxReceiveCount\\\":\\\"$max_receives\\\"}"
  create "queue $name" sqs create-queue --queue-name "$name" --attributes \
    "{\"MessageRetentionPeriod\":\"$retention\",\"VisibilityTimeout\":\"$visibility\",\"RedrivePolicy\":\"$redrive\"}"
}

# ---- DynamoDB ------------------------------------------------------------------------------
create_table "$runs_table" \
  --key-schema AttributeName=id,KeyType=HASH \
  --attribute-definitions AttributeName=id,AttributeType=S AttributeName=owner,AttributeType=S \
    AttributeName=qs,AttributeType=S AttributeName=created_at,AttributeType=N AttributeName=rank,AttributeType=S \
    AttributeName=pq,AttributeType=S AttributeName=pd,AttributeType=N \
  --global-secondary-indexes '[
    {"IndexName": "by_owner",
     "KeySchema": [{"AttributeName": "owner", "KeyType": "HASH"}, {"AttributeName": "created_at", "KeyType": "RANGE"}],
     "Projection": {"ProjectionType": "ALL"}},
    {"IndexName": "by_queue_state",
     "KeySchema": [{"AttributeName": "qs", "KeyType": "HASH"}, {"AttributeName": "created_at", "KeyType": "RANGE"}],
     "Projection": {"ProjectionType": "ALL"}},
    {"IndexName": "by_rank",
     "KeySchema": [{"AttributeName": "qs", "KeyType": "HASH"}, {"AttributeName": "rank", "KeyType": "RANGE"}],
     "Projection": {"ProjectionType": "ALL"}},
    {"IndexName": "by_purge",
     "KeySchema": [{"AttributeName": "pq", "KeyType": "HASH"}, {"AttributeName": "pd", "KeyType": "RANGE"}],
     "Projection": {"ProjectionType": "ALL"}}]'
# A finished run's record goes some days after its retention's date, should the sweep not have taken it.
apply "TTL of $runs_table" dynamodb update-time-to-live --table-name "$runs_table" \
  --time-to-live-specification "Enabled=true,AttributeName=$runs_ttl_attribute" -- "already enabled"
create_table "$workers_table" \
  --key-schema AttributeName=id,KeyType=HASH \
  --attribute-definitions AttributeName=id,AttributeType=S AttributeName=pool,AttributeType=S \
  --global-secondary-indexes '[
    {"IndexName": "by_pool",
     "KeySchema": [{"AttributeName": "pool", "KeyType": "HASH"}, {"AttributeName": "id", "KeyType": "RANGE"}],
     "Projection": {"ProjectionType": "ALL"}}]'
# Workers expire on their own when they stop sending heartbeats.
apply "TTL of $workers_table" dynamodb update-time-to-live --table-name "$workers_table" \
  --time-to-live-specification "Enabled=true,AttributeName=$ttl_attribute" -- "already enabled"
create_table "$tokens_table" \
  --key-schema AttributeName=token_hash,KeyType=HASH \
  --attribute-definitions AttributeName=token_hash,AttributeType=S
create_table "$pools_table" \
  --key-schema AttributeName=pool,KeyType=HASH \
  --attribute-definitions AttributeName=pool,AttributeType=S
create_table "$quotas_table" \
  --key-schema AttributeName=id,KeyType=HASH \
  --attribute-definitions AttributeName=id,AttributeType=S
create_table "$secrets_table" \
  --key-schema AttributeName=scope,KeyType=HASH AttributeName=name,KeyType=RANGE \
  --attribute-definitions AttributeName=scope,AttributeType=S AttributeName=name,AttributeType=S
create_table "$sessions_table" \
  --key-schema AttributeName=run_id,KeyType=HASH AttributeName=slot,KeyType=RANGE \
  --attribute-definitions AttributeName=run_id,AttributeType=S AttributeName=slot,AttributeType=N
# The relay's connections: what a $disconnect that never came leaves behind expires on its own.
create_table "$relay_table" \
  --key-schema AttributeName=id,KeyType=HASH \
  --attribute-definitions AttributeName=id,AttributeType=S
apply "TTL of $relay_table" dynamodb update-time-to-live --table-name "$relay_table" \
  --time-to-live-specification "Enabled=true,AttributeName=$relay_ttl_attribute" -- "already enabled"
# The records that cannot be rebuilt (PITR_TABLES).
for table in "$runs_table" "$tokens_table" "$quotas_table" "$secrets_table"; do
  apply "point-in-time recovery of $table" dynamodb update-continuous-backups --table-name "$table" \
    --point-in-time-recovery-specification PointInTimeRecoveryEnabled=true
done

# ---- SQS -----------------------------------------------------------------------------------
IFS=',' read -ra pools <<<"$pool_names"
for pool in "${pools[@]}"; do
  pool=${pool//[[:space:]]/}
  [ -n "$pool" ] || continue
  queue_with_dlq "$prefix-pool-$pool" "$pool_visibility"
done
queue_with_dlq "$prefix-events" "$events_visibility"

# ---- S3 ------------------------------------------------------------------------------------
if [ "$region" = us-east-1 ]; then
  create "bucket $bucket" s3api create-bucket --bucket "$bucket"
else
  create "bucket $bucket" s3api create-bucket --bucket "$bucket" \
    --create-bucket-configuration "LocationConstraint=$region"
fi
case $region in
  cn-*) partition=aws-cn ;;
  us-gov-*) partition=aws-us-gov ;;
  *) partition=aws ;;
esac
bucket_arn="arn:$partition:s3:::$bucket"
apply "encryption of $bucket" s3api put-bucket-encryption --bucket "$bucket" \
  --server-side-encryption-configuration \
  "{\"Rules\":[{\"ApplyServerSideEncryptionByDefault\":{\"SSEAlgorithm\":\"$sse_algorithm\"}}]}"
apply "public access block of $bucket" s3api put-public-access-block --bucket "$bucket" \
  --public-access-block-configuration \
  BlockPublicAcls=true,IgnorePublicAcls=true,BlockPublicPolicy=true,RestrictPublicBuckets=true
apply "ownership of $bucket" s3api put-bucket-ownership-controls --bucket "$bucket" \
  --ownership-controls "{\"Rules\":[{\"ObjectOwnership\":\"$object_ownership\"}]}"
apply "versioning of $bucket" s3api put-bucket-versioning --bucket "$bucket" \
  --versioning-configuration Status=Enabled
apply "lifecycle of $bucket" s3api put-bucket-lifecycle-configuration --bucket "$bucket" \
  --lifecycle-configuration "{\"Rules\":[
    {\"ID\":\"abort-incomplete-uploads\",\"Status\":\"Enabled\",\"Filter\":{\"Prefix\":\"\"},
     \"AbortIncompleteMultipartUpload\":{\"DaysAfterInitiation\":$abort_days}},
    {\"ID\":\"expire-noncurrent-versions\",\"Status\":\"Enabled\",\"Filter\":{\"Prefix\":\"\"},
     \"NoncurrentVersionExpiration\":{\"NoncurrentDays\":$noncurrent_days}},
    {\"ID\":\"expire-noncurrent-uploads\",\"Status\":\"Enabled\",\"Filter\":{\"Prefix\":\"uploads/\"},
     \"NoncurrentVersionExpiration\":{\"NoncurrentDays\":$noncurrent_upload_days}}]}"
# Only TLS. LocalStack enforces bucket policies only with ENFORCE_IAM=1; then reach it over
# https (https://localhost.localstack.cloud:4566), since the policy refuses plain HTTP.
apply "TLS-only policy of $bucket" s3api put-bucket-policy --bucket "$bucket" --policy "{
  \"Version\":\"2012-10-17\",\"Statement\":[{\"Sid\":\"DenyInsecureTransport\",\"Effect\":\"Deny\",
  \"Principal\":\"*\",\"Action\":\"s3:*\",\"Resource\":[\"$bucket_arn\",\"$bucket_arn/*\"],
  \"Condition\":{\"Bool\":{\"aws:SecureTransport\":\"false\"}}}]}"

# ---- KMS: the key of secrets -----------------------------------------------------------------
# Made once, under its alias; the key policy names the account alone (secrets_key_policy).
if [[ $secrets_key == alias/* ]] && ! awslocal kms describe-key --key-id "$secrets_key" >/dev/null 2>&1; then
  key_arn=$(awslocal kms create-key --description "$key_description" --key-spec "$key_spec" \
    --key-usage "$key_usage" --query KeyMetadata.Arn --output text)
  account=$(cut -d: -f5 <<<"$key_arn")
  key_partition=$(cut -d: -f2 <<<"$key_arn")
  awslocal kms put-key-policy --key-id "$key_arn" --policy-name default --policy "{
    \"Version\":\"2012-10-17\",\"Statement\":[{\"Sid\":\"AccountAdministers\",\"Effect\":\"Allow\",
    \"Principal\":{\"AWS\":\"arn:$key_partition:iam::$account:root\"},\"Action\":\"kms:*\",\"Resource\":\"*\"}]}"
  awslocal kms enable-key-rotation --key-id "$key_arn"
  create "key $secrets_key" kms create-alias --alias-name "$secrets_key" --target-key-id "$key_arn"
fi

log "ready: prefix $prefix, pools ${pool_names}, bucket $bucket"
