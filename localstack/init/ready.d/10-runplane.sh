#!/usr/bin/env bash
# LocalStack init hook: create runplane's tables, queues and bucket once LocalStack is ready.
#
# The same resources as template.yaml and runplane/adapters/aws/provision.py (keep the three in
# step): the runs table with its by_owner and by_queue_state indexes, the workers and tokens
# tables, a queue and a dead-letter queue per pool, the dispatcher's event queue, the bucket.
# Idempotent: what exists already is left as it is, so a restart with a persisted state is fine.
#
# Environment (all optional):
#   RUNPLANE_PREFIX      resource name prefix                      (default: runplane)
#   RUNPLANE_POOL_NAMES  comma-separated pool names                (default: default)
#   RUNPLANE_RUNS_TABLE, RUNPLANE_WORKERS_TABLE, RUNPLANE_TOKENS_TABLE, RUNPLANE_BUCKET
#                        override one name, as runplane's settings do (default: <prefix>-runs,
#                        <prefix>-workers, <prefix>-tokens, <prefix>-data)
set -euo pipefail

prefix=${RUNPLANE_PREFIX:-runplane}
pool_names=${RUNPLANE_POOL_NAMES:-default}
runs_table=${RUNPLANE_RUNS_TABLE:-$prefix-runs}
workers_table=${RUNPLANE_WORKERS_TABLE:-$prefix-workers}
tokens_table=${RUNPLANE_TOKENS_TABLE:-$prefix-tokens}
bucket=${RUNPLANE_BUCKET:-$prefix-data}
region=${AWS_DEFAULT_REGION:-us-east-1}
retention=1209600  # 14 days, the SQS maximum
visibility=60
max_receives=5

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

queue_url() { awslocal sqs get-queue-url --queue-name "$1" --query QueueUrl --output text; }

queue_with_dlq() {  # name: creates name-dlq, then name redriving to it after $max_receives receives
  local name=$1 dlq_arn redrive
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
    AttributeName=qs,AttributeType=S AttributeName=created_at,AttributeType=N \
  --global-secondary-indexes '[
    {"IndexName": "by_owner",
     "KeySchema": [{"AttributeName": "owner", "KeyType": "HASH"}, {"AttributeName": "created_at", "KeyType": "RANGE"}],
     "Projection": {"ProjectionType": "ALL"}},
    {"IndexName": "by_queue_state",
     "KeySchema": [{"AttributeName": "qs", "KeyType": "HASH"}, {"AttributeName": "created_at", "KeyType": "RANGE"}],
     "Projection": {"ProjectionType": "ALL"}}]'
create_table "$workers_table" \
  --key-schema AttributeName=id,KeyType=HASH \
  --attribute-definitions AttributeName=id,AttributeType=S
# Workers expire on their own when they stop sending heartbeats.
awslocal dynamodb update-time-to-live --table-name "$workers_table" \
  --time-to-live-specification Enabled=true,AttributeName=expires_at >/dev/null 2>&1 || true
create_table "$tokens_table" \
  --key-schema AttributeName=token_hash,KeyType=HASH \
  --attribute-definitions AttributeName=token_hash,AttributeType=S

# ---- SQS -----------------------------------------------------------------------------------
IFS=',' read -ra pools <<<"$pool_names"
for pool in "${pools[@]}"; do
  pool=${pool//[[:space:]]/}
  [ -n "$pool" ] || continue
  queue_with_dlq "$prefix-pool-$pool"
done
queue_with_dlq "$prefix-events"

# ---- S3 ------------------------------------------------------------------------------------
if [ "$region" = us-east-1 ]; then
  create "bucket $bucket" s3api create-bucket --bucket "$bucket"
else
  create "bucket $bucket" s3api create-bucket --bucket "$bucket" \
    --create-bucket-configuration "LocationConstraint=$region"
fi

log "ready: prefix $prefix, pools ${pool_names}, bucket $bucket"
