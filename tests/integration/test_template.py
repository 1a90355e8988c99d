"""template.yaml and the LocalStack hook: the AWS tools accept them, and they agree with the code.

The code is the reference: ``provision()`` (what the local stack creates, read back from the moto
server it created it on), the queue-name helpers, ``StackSettings`` (what the functions read) and
the Lambda entrypoints.
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from runplane.adapters.aws import resources
from runplane.adapters.aws.dynamodb import BY_OWNER, BY_PURGE, BY_QUEUE_STATE, BY_RANK, PURGE_DUE, PURGE_QUEUE
from runplane.adapters.aws.provision import AwsNames, provision
from runplane.adapters.aws.resources import MAX_RECEIVES
from runplane.adapters.aws.sqs import events_queue_name, pool_queue_name
from runplane.adapters.aws.workers import DynamoWorkerRegistry
from runplane.compute.aws_batch.compute import job_definition_request
from runplane.domain.pools import Pool
from runplane.domain.secrets import context, group_scope, user_scope
from runplane.domain.workers import Worker
from runplane.settings import StackSettings
from tests.aws_readback import TABLE_FIELDS, read_stack, table_shape, template_stack
from tests.cfn_template import (
    ROOT,
    TEMPLATE,
    as_list,
    defaults,
    expanded_resources,
    function_statements,
    functions,
    load_template,
)
from tests.forkserver import HERE as FORKSERVER
from tests.forkserver import ForkServer

HOOK = ROOT / "localstack" / "init" / "ready.d" / "10-runplane.sh"
SAM_VENV = ROOT / ".venv-sam"
SAM = SAM_VENV / "bin" / "sam"
# Pool names with a character a logical id cannot hold, to exercise the &{Pool} expansion.
POOLS = ["default", "gpu-a100"]
TOOL_ENV = {**os.environ, "SAM_CLI_TELEMETRY": "0", "AWS_DEFAULT_REGION": "us-east-1"}


# ---- reading the template -------------------------------------------------------------------


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


# ---- what provision() creates, read back from the moto server --------------------------------


@dataclass(frozen=True)
class Provisioned:
    """A stack provision() made on the moto server, its clients, and read_stack() of it."""

    names: AwsNames
    ddb: Any
    sqs: Any
    s3: Any
    kms: Any
    found: dict[str, Any]


@pytest.fixture(scope="module")
def provisioned(moto_endpoint: str) -> Provisioned:
    names = AwsNames(prefix=f"tpl{uuid.uuid4().hex[:8]}")
    session = boto3.session.Session(aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1")
    ddb, sqs, s3, kms = (session.client(s, endpoint_url=moto_endpoint) for s in ("dynamodb", "sqs", "s3", "kms"))
    provision(names, POOLS, ddb, sqs, s3, tls_only=True, kms=kms)  # the template's bucket has the policy
    return Provisioned(names, ddb, sqs, s3, kms, read_stack(names, POOLS, ddb, sqs, s3, kms))


# ---- the AWS tools --------------------------------------------------------------------------


def run_tool(args: list[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, env=TOOL_ENV, capture_output=True, text=True, timeout=timeout, check=False)


def ensure_sam_venv() -> None:
    """A clean machine gets the SAM venv here (about a minute, once), or waits for the install
    scripts/run-tests.sh started beside the tests (the script takes a lock; done, it only checks)."""
    done = run_tool(["bash", str(ROOT / "scripts" / "setup-sam.sh")], timeout=600)
    assert done.returncode == 0, f"scripts/setup-sam.sh failed:\n{done.stdout}\n{done.stderr}"
    assert SAM.exists()


def cfn_lint() -> Path:
    for candidate in (Path(sys.executable).parent / "cfn-lint", ROOT / ".venv" / "bin" / "cfn-lint"):
        if candidate.exists():
            return candidate
    ensure_sam_venv()
    return SAM_VENV / "bin" / "cfn-lint"


def test_cfn_lint_accepts_template() -> None:
    """What `sam validate --lint` runs: cfn-lint, on the template."""
    done = run_tool([str(cfn_lint()), str(TEMPLATE)])
    assert done.returncode == 0, done.stdout + done.stderr


def test_cfn_lint_accepts_several_pools_with_symbols(tmp_path: Path) -> None:
    """Fn::ForEach must give valid logical ids (and references) for a pool name like gpu-a100."""
    text, count = re.subn(
        r"(  PoolNames:\n(?:    .*\n)*?    Default: ).*\n",
        rf'\g<1>"{",".join(POOLS)}"\n',
        TEMPLATE.read_text(),
    )
    assert count == 1, "could not find the PoolNames default"
    copy_path = tmp_path / "template.yaml"
    copy_path.write_text(text)
    done = run_tool([str(cfn_lint()), str(copy_path)])
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.sam
@pytest.mark.timeout(900)
def test_sam_validate() -> None:
    """The SAM transform itself, on the template with Fn::ForEach expanded locally. (With --lint,
    `sam validate` would run cfn-lint on the template, as test_cfn_lint_accepts_template does.)"""
    ensure_sam_venv()
    done = run_tool([str(SAM), "validate", "--template-file", str(TEMPLATE), "--language-extensions"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "is a valid SAM Template" in done.stdout + done.stderr


# ---- the template agrees with what provision() creates ---------------------------------------


def _prefixed(names: list[str], prefix: str) -> set[str]:
    return {n for n in names if n.startswith(f"{prefix}-")}


def test_template_and_provision_create_the_same_resources(template: dict[str, Any], provisioned: Provisioned) -> None:
    """Every table, queue and bucket with the stack's prefix on the moto server is one the
    template declares (with that prefix), and the other way round."""
    names = provisioned.names
    declared = expanded_resources(template, POOLS, prefix=names.prefix)

    def declared_names(kind: str, attribute: str) -> list[Any]:
        return [r["Properties"][attribute] for r in declared.values() if r["Type"] == kind]

    tables = [t for page in provisioned.ddb.get_paginator("list_tables").paginate() for t in page["TableNames"]]
    assert _prefixed(tables, names.prefix) == set(declared_names("AWS::DynamoDB::Table", "TableName"))
    assert _prefixed(tables, names.prefix) == {getattr(names, field) for field in TABLE_FIELDS}
    urls = provisioned.sqs.list_queues(QueueNamePrefix=names.prefix).get("QueueUrls", [])
    queues = _prefixed([url.rsplit("/", 1)[1] for url in urls], names.prefix)
    assert queues == set(declared_names("AWS::SQS::Queue", "QueueName"))
    assert len(queues) == 2 * (len(POOLS) + 1)
    buckets = _prefixed([b["Name"] for b in provisioned.s3.list_buckets()["Buckets"]], names.prefix)
    assert buckets == {names.bucket}
    # The deployed bucket's name also carries the account id, which only a deployment knows.
    assert declared_names("AWS::S3::Bucket", "BucketName") == [{"Fn::Sub": f"{names.bucket}-${{AWS::AccountId}}"}]


def test_template_names_are_those_of_the_code(template: dict[str, Any]) -> None:
    """With its default prefix, the template names tables and queues as AwsNames and the
    queue-name helpers do."""
    declared = expanded_resources(template, POOLS)
    names = AwsNames(prefix=defaults(template)["Prefix"])
    assert {field: declared[logical_id]["Properties"]["TableName"] for logical_id, field in TABLES.items()} == {
        field: getattr(names, field) for field in TABLES.values()
    }
    queue_names = {r["Properties"]["QueueName"] for r in declared.values() if r["Type"] == "AWS::SQS::Queue"}
    wanted = {pool_queue_name(names.prefix, pool) for pool in POOLS} | {events_queue_name(names.prefix)}
    assert queue_names == wanted | {f"{name}-dlq" for name in wanted}


# logical id -> AwsNames field
TABLES = {
    "RunsTable": "runs_table",
    "WorkersTable": "workers_table",
    "TokensTable": "tokens_table",
    "PoolsTable": "pools_table",
    "QuotasTable": "quotas_table",
    "SecretsTable": "secrets_table",
    "SessionsTable": "sessions_table",
    "RelayTable": "relay_table",
}


def test_tables_match_provision(template: dict[str, Any], provisioned: Provisioned) -> None:
    """Keys, attribute types, indexes, billing, TTL and point-in-time recovery of each table:
    what the template declares is what DescribeTable and friends say of the tables provision()
    made."""
    declared = expanded_resources(template, POOLS)
    assert set(TABLES.values()) == set(TABLE_FIELDS)
    for logical_id, field in TABLES.items():
        described = provisioned.ddb.describe_table(TableName=getattr(provisioned.names, field))["Table"]
        assert table_shape(declared[logical_id]["Properties"]) == table_shape(described), logical_id
    assert template_stack(template, POOLS)["tables"] == provisioned.found["tables"]
    runs = provisioned.found["tables"]["runs_table"]
    assert {i["IndexName"] for i in runs["GlobalSecondaryIndexes"]} == {BY_OWNER, BY_QUEUE_STATE, BY_RANK, BY_PURGE}
    (purge,) = [i for i in runs["GlobalSecondaryIndexes"] if i["IndexName"] == BY_PURGE]
    assert [k["AttributeName"] for k in purge["KeySchema"]] == [PURGE_QUEUE, PURGE_DUE]


def test_table_settings_are_those_of_resources(provisioned: Provisioned) -> None:
    """TTL and point-in-time recovery on the tables provision() made (which the template declares
    alike, above) are exactly those of runplane/adapters/aws/resources.py."""
    tables = provisioned.found["tables"]
    assert {field: t["TimeToLive"] for field, t in tables.items() if t["TimeToLive"][0] != "DISABLED"} == {
        "workers_table": ("ENABLED", resources.WORKERS_TTL_ATTRIBUTE),
        "runs_table": ("ENABLED", resources.RUNS_TTL_ATTRIBUTE),
        "relay_table": ("ENABLED", resources.RELAY_TTL_ATTRIBUTE),
    }
    assert {field for field, t in tables.items() if t["PointInTimeRecovery"] == "ENABLED"} == set(resources.PITR_TABLES)


def test_secrets_key_matches_provision(template: dict[str, Any], provisioned: Provisioned) -> None:
    """Spec, usage, rotation, alias and key policy of the secrets key: the template's, those of
    the key provision() made on the moto server, and those of resources.py; every IAM grant on
    it carries resources.SECRETS_KEY_CONDITION, which the context of every secret meets."""
    found = provisioned.found["key"]
    assert template_stack(template, POOLS)["key"] == found
    assert (found["KeySpec"], found["KeyUsage"], found["KeyRotation"]) == (
        resources.SECRETS_KEY_SPEC,
        resources.SECRETS_KEY_USAGE,
        resources.SECRETS_KEY_ROTATION,
    )
    assert found["KeyPolicy"] == resources.secrets_key_policy("aws", "ACCOUNT")
    assert found["Alias"] == "alias/PREFIX-secrets"
    grants = [
        s
        for name in [*functions(template), "WorkerPolicy"]
        for s in (
            function_statements(template, name)
            if name != "WorkerPolicy"
            else template["Resources"]["WorkerPolicy"]["Properties"]["PolicyDocument"]["Statement"]
        )
        if "SecretsKey" in json.dumps(s.get("Resource"))
    ]
    assert len(grants) == 2
    assert all(s["Condition"] == resources.SECRETS_KEY_CONDITION for s in grants)
    ctx = context(user_scope("alice"), "wandb")
    (keys,) = resources.SECRETS_KEY_CONDITION["ForAllValues:StringEquals"].values()
    assert set(ctx) <= set(keys)
    for scope in (user_scope("alice"), group_scope("vision")):
        (patterns,) = resources.SECRETS_KEY_CONDITION["StringLike"].values()
        assert any(fnmatch.fnmatchcase(scope, p) for p in patterns)


def test_workers_ttl_is_the_attribute_the_registry_writes(template: dict[str, Any], provisioned: Provisioned) -> None:
    ttl = template["Resources"]["WorkersTable"]["Properties"]["TimeToLiveSpecification"]
    assert ttl["Enabled"] is True
    table = provisioned.names.workers_table
    worker = Worker(id=f"w-{uuid.uuid4().hex[:6]}", pool="default", started_at=1.0, heartbeat_at=1.0)
    DynamoWorkerRegistry(table, provisioned.ddb).put(worker)
    item = provisioned.ddb.get_item(TableName=table, Key={"id": {"S": worker.id}})["Item"]
    assert ttl["AttributeName"] in item
    assert int(item[ttl["AttributeName"]]["N"]) > 0


def test_queues_match_provision(template: dict[str, Any], provisioned: Provisioned) -> None:
    """Retention, visibility timeout and redrive (to the queue's own dead-letter queue) of every
    queue: the template's, and those of the queues on the moto server."""
    found = provisioned.found["queues"]
    assert template_stack(template, POOLS)["queues"] == found
    assert len(found) == 2 * (len(POOLS) + 1)
    for role, queue in found.items():
        assert queue["MessageRetentionPeriod"] == resources.MESSAGE_RETENTION_SECONDS, role
        dead_letter = role.endswith(" dlq")
        assert queue["maxReceiveCount"] == (None if dead_letter else MAX_RECEIVES), role
        assert queue["redrives to its own -dlq"] is (None if dead_letter else True), role
    visibility = {f"pool {pool}": resources.POOL_VISIBILITY_SECONDS for pool in POOLS}
    visibility["events"] = resources.EVENTS_VISIBILITY_SECONDS
    assert {role: found[role]["VisibilityTimeout"] for role in visibility} == visibility


def test_events_visibility_covers_six_dispatcher_timeouts(template: dict[str, Any]) -> None:
    timeout = functions(template)["DispatcherFunction"]["Properties"]["Timeout"]
    assert 6 * timeout <= resources.EVENTS_VISIBILITY_SECONDS


def test_bucket_settings_are_those_of_resources(template: dict[str, Any], provisioned: Provisioned) -> None:
    """Encryption, public-access block, ownership, versioning, lifecycle and TLS-only policy: the
    template's, those of the bucket on the moto server, and those of resources.py."""
    found = provisioned.found["bucket"]
    assert template_stack(template, POOLS)["bucket"] == found
    assert {"Rules": [{"ApplyServerSideEncryptionByDefault": e} for e in found["encryption"]]} == (
        resources.BUCKET_ENCRYPTION
    )
    assert found["public_access_block"] == resources.PUBLIC_ACCESS_BLOCK
    assert found["ownership"] == [{"ObjectOwnership": resources.OBJECT_OWNERSHIP}]
    assert found["versioning"] == resources.VERSIONING_STATUS
    assert found["lifecycle"] == sorted(resources.lifecycle_rules(), key=lambda r: r["ID"])
    assert found["policy"] == resources.bucket_policy("BUCKET", "us-east-1")


def test_bucket_policy_is_the_tls_only_policy_of_resources(template: dict[str, Any]) -> None:
    declared = template["Resources"]["DataBucketPolicy"]["Properties"]
    assert declared["Bucket"] == {"Ref": "DataBucket"}
    arn = {"Fn::GetAtt": ["DataBucket", "Arn"]}
    (statement,) = declared["PolicyDocument"]["Statement"]
    expected = resources.tls_only_statement("BUCKET")
    expected["Resource"] = [arn, {"Fn::Sub": "${DataBucket.Arn}/*"}]
    assert statement == expected


def test_job_definitions_and_queues_are_those_the_dispatcher_may_use(template: dict[str, Any]) -> None:
    """The Batch ARNs of the dispatcher's policy cover what the aws-batch backend names."""
    params = defaults(template)
    pool = Pool(
        name="gpu-a100",
        backend="aws-batch",
        cpus=4,
        memory="8g",
        default_image="x",
        options={"job_queue": f"{params['Prefix']}-gpu"},
    )
    definition = job_definition_request(pool, {"RUNPLANE_PREFIX": params["Prefix"]})["jobDefinitionName"]
    found = function_statements(template, "DispatcherFunction")
    (submit,) = [s for s in found if "batch:SubmitJob" in as_list(s.get("Action", []))]
    arns = [a["Fn::Sub"].replace("${Prefix}", params["Prefix"]) for a in as_list(submit["Resource"])]
    kinds = {arn.split(":")[-1].split("/")[0]: arn.split(":")[-1].split("/", 1)[1] for arn in arns}
    assert fnmatch.fnmatchcase(f"{definition}:1", kinds["job-definition"])
    assert fnmatch.fnmatchcase(pool.options["job_queue"], kinds["job-queue"])


def test_handlers_exist(template: dict[str, Any]) -> None:
    code_uri = ROOT / template["Globals"]["Function"]["CodeUri"]
    for logical_id, function in functions(template).items():
        props = function["Properties"]
        module, _, attribute = props["Handler"].rpartition(".")
        path = code_uri / f"{module}.py"
        assert path.is_file(), f"{logical_id}: {path} does not exist"
        tree = ast.parse(path.read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == attribute for n in tree.body), (
            f"{logical_id}: {path} defines no {attribute}"
        )
        assert callable(getattr(importlib.import_module(module.replace("/", ".")), attribute))


def _environment_names(template: dict[str, Any]) -> set[str]:
    names = set(template["Globals"]["Function"]["Environment"]["Variables"])
    for function in functions(template).values():
        names |= set(function["Properties"].get("Environment", {}).get("Variables", {}))
    return names


def test_environment_matches_settings(template: dict[str, Any]) -> None:
    prefix = "RUNPLANE_"
    fields = set(StackSettings.model_fields)
    runplane_vars = {n for n in _environment_names(template) if n.startswith(prefix)}
    unknown = {n for n in runplane_vars if n[len(prefix) :].lower() not in fields}
    assert not unknown, f"the template sets variables StackSettings does not read: {sorted(unknown)}"
    needed = {"prefix", "runs_table", "workers_table", "tokens_table", "pools_table", "quotas_table", "bucket", "pools"}
    needed |= {"secrets_table", "secrets_key", "sessions_table", "relay_table", "relay_url"}
    assert {prefix + f.upper() for f in needed} <= set(template["Globals"]["Function"]["Environment"]["Variables"])
    # And the settings really read them: every variable lands in its field.
    environ = {name: f"from-{name.lower()}" for name in runplane_vars}
    environ["RUNPLANE_RETENTION"] = '{"outputs": "30d"}'  # read as it is set, once it reads as a retention
    environ["RUNPLANE_UPLOAD_RETENTION_DAYS"] = "14"  # a number of days
    environ["RUNPLANE_RELAY_URL"] = "wss://from-runplane-relay-url/v1"  # a WebSocket URL
    environ["RUNPLANE_RELAY_MESSAGE_RATE"] = "120"  # a number of messages
    settings = StackSettings.from_env(environ)
    for name, value in environ.items():
        assert str(getattr(settings, name[len(prefix) :].lower())) == value, name


def test_functions_get_the_names_of_the_resources(template: dict[str, Any]) -> None:
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["RUNPLANE_RUNS_TABLE"] == {"Ref": "RunsTable"}
    assert variables["RUNPLANE_WORKERS_TABLE"] == {"Ref": "WorkersTable"}
    assert variables["RUNPLANE_TOKENS_TABLE"] == {"Ref": "TokensTable"}
    assert variables["RUNPLANE_POOLS_TABLE"] == {"Ref": "PoolsTable"}
    assert variables["RUNPLANE_QUOTAS_TABLE"] == {"Ref": "QuotasTable"}
    assert variables["RUNPLANE_SECRETS_TABLE"] == {"Ref": "SecretsTable"}
    assert variables["RUNPLANE_SECRETS_KEY"] == {"Fn::GetAtt": ["SecretsKey", "Arn"]}
    assert variables["RUNPLANE_SESSIONS_TABLE"] == {"Ref": "SessionsTable"}
    assert variables["RUNPLANE_RELAY_TABLE"] == {"Ref": "RelayTable"}
    assert variables["RUNPLANE_RELAY_URL"] == {
        "Fn::Sub": "wss://${RelayApi}.execute-api.${AWS::Region}.${AWS::URLSuffix}/v1"
    }
    assert variables["RUNPLANE_BUCKET"] == {"Ref": "DataBucket"}
    assert variables["RUNPLANE_PREFIX"] == {"Ref": "Prefix"}
    assert variables["RUNPLANE_POOLS"] == {"Ref": "PoolsJson"}


def test_retention_reaches_the_functions_and_uploads_expire_by_a_lifecycle_rule(template: dict[str, Any]) -> None:
    """RUNPLANE_RETENTION is the Retention parameter (empty by default: everything kept), and the
    bucket expires what is under uploads/ after UploadRetentionDays only when that is set (by
    default no rule: nothing expires that did not before)."""
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["RUNPLANE_RETENTION"] == {"Ref": "Retention"}
    # the functions expire uploads as the bucket does, so a submit renews the uploads it names
    assert variables["RUNPLANE_UPLOAD_RETENTION_DAYS"] == {"Ref": "UploadRetentionDays"}
    days = template["Parameters"]["UploadRetentionDays"]
    bounds = StackSettings.model_json_schema()["properties"]["upload_retention_days"]
    # a deploy takes no value the functions would refuse
    assert (days["MinValue"], days["MaxValue"]) == (bounds["minimum"], bounds["maximum"])
    assert defaults(template)["Retention"] == ""
    assert StackSettings(retention=defaults(template)["Retention"]).kept().sets_any is False
    assert str(defaults(template)["UploadRetentionDays"]) == "0"
    assert template["Conditions"]["HasUploadRetention"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "UploadRetentionDays"}, 0]}]
    }
    rules = template["Resources"]["DataBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]
    (conditional,) = [r["Fn::If"] for r in rules if "Fn::If" in r]
    condition, rule, otherwise = conditional
    assert (condition, otherwise) == ("HasUploadRetention", {"Ref": "AWS::NoValue"})
    assert rule == {
        "Id": "expire-unused-uploads",
        "Status": "Enabled",
        "Prefix": "uploads/",
        "ExpirationInDays": {"Ref": "UploadRetentionDays"},
    }
    # each renewal (a copy onto itself) leaves a noncurrent version: under uploads/ those go after a day
    (noncurrent,) = [r for r in rules if r.get("Prefix") == "uploads/" and "NoncurrentVersionExpiration" in r]
    assert noncurrent["NoncurrentVersionExpiration"] == {"NoncurrentDays": 1}


def _grants(statements: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
    return [s for s in statements if s["Effect"] == "Allow" and action in as_list(s["Action"])]


def _listed_prefixes(statements: list[dict[str, Any]]) -> set[str]:
    return {p for s in _grants(statements, "s3:ListBucket") for p in as_list(s["Condition"]["StringLike"]["s3:prefix"])}


def test_the_reaper_may_sweep_and_a_missing_upload_reads_as_missing(template: dict[str, Any]) -> None:
    """The reaper runs the retention sweep: it reads the by_purge index, deletes a run's record and
    its objects, and lists and deletes uploads. The API (which looks an upload up) may list under
    uploads/: S3 answers a missing key 404 only to a caller that may list it, else 403, which would
    read as a refusal, not as "not there". The workers may not (listing would show whose uploads
    there are): the agent reads S3's 403 for a missing upload as gone."""
    reaper = function_statements(template, "ReaperFunction")
    assert any(s["Resource"] == {"Fn::GetAtt": ["RunsTable", "Arn"]} for s in _grants(reaper, "dynamodb:DeleteItem"))
    assert any("/index/" in json.dumps(s["Resource"]) for s in _grants(reaper, "dynamodb:Query"))
    deletable = {r["Fn::Sub"] for s in _grants(reaper, "s3:DeleteObject") for r in as_list(s["Resource"])}
    assert deletable == {"${DataBucket.Arn}/runs/*", "${DataBucket.Arn}/uploads/*"}
    assert _listed_prefixes(reaper) == {"runs/*", "uploads/*"}
    assert _listed_prefixes(function_statements(template, "ApiFunction")) == {"runs/*", "uploads/*"}
    workers = template["Resources"]["WorkerPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert _listed_prefixes(workers) == {"runs/*"}  # a worker never lists whose uploads there are
    # a worker deletes nothing but its runs' old checkpoints (the newest two of a series are kept)
    pruned = {r["Fn::Sub"] for s in _grants(workers, "s3:DeleteObject") for r in as_list(s["Resource"])}
    assert pruned == {"${DataBucket.Arn}/runs/*/checkpoints/*"}
    assert not _grants(function_statements(template, "ApiFunction"), "s3:DeleteObject")


def test_dispatcher_reports_partial_batch_failures(template: dict[str, Any]) -> None:
    events = functions(template)["DispatcherFunction"]["Properties"]["Events"]
    sqs_events = [e["Properties"] for e in events.values() if e["Type"] == "SQS"]
    assert len(sqs_events) == 1
    (props,) = sqs_events
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert props["BatchSize"] == 10
    queue_id = props["Queue"]["Fn::GetAtt"][0]
    queue = expanded_resources(template, POOLS)[queue_id]["Properties"]
    assert queue["QueueName"] == events_queue_name(defaults(template)["Prefix"])
    assert any(e["Type"] == "Schedule" for e in events.values())


def test_outputs(template: dict[str, Any]) -> None:
    assert {"ApiUrl", "RunsTable", "Bucket", "EventsQueueUrl", "WorkerPolicy", "SecretsTable", "SecretsKey"} <= set(
        template["Outputs"]
    )
    assert template["Outputs"]["WorkerPolicy"]["Value"] == {"Ref": "WorkerPolicy"}


def test_functions_and_their_workers_get_the_stack_region(template: dict[str, Any]) -> None:
    """Lambda sets AWS_REGION, which StackSettings reads; RUNPLANE_AWS_REGION also reaches the
    workers the dispatcher launches (it passes its RUNPLANE_* settings on)."""
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["RUNPLANE_AWS_REGION"] == {"Ref": "AWS::Region"}


# ---- the LocalStack hook --------------------------------------------------------------------


def test_hook_creates_the_same_names_and_indexes(provisioned: Provisioned) -> None:
    text = HOOK.read_text()
    for suffix in ("runs", "workers", "tokens", "pools", "quotas", "secrets", "sessions", "data"):
        assert f"$prefix-{suffix}" in text
    assert '"$prefix-pool-$pool" "$pool_visibility"' in text
    assert '"$prefix-events" "$events_visibility"' in text
    assert '"$name-dlq"' in text
    assert "AttributeName=pool,KeyType=HASH" in text
    match = re.search(r"--global-secondary-indexes '(.*?)'", text, re.DOTALL)
    assert match, "the hook creates no global secondary indexes"
    assert (
        sorted(json.loads(match.group(1)), key=lambda i: i["IndexName"])
        == provisioned.found["tables"]["runs_table"]["GlobalSecondaryIndexes"]
    )
    for key in (
        "AttributeName=id,KeyType=HASH",
        "AttributeName=token_hash,KeyType=HASH",
        "AttributeName=created_at,AttributeType=N",
        "AttributeName=qs,AttributeType=S",
        "AttributeName=owner,AttributeType=S",
        "AttributeName=rank,AttributeType=S",
        f"AttributeName={PURGE_QUEUE},AttributeType=S",
        f"AttributeName={PURGE_DUE},AttributeType=N",
    ):
        assert key in text


def test_hook_values_are_those_of_resources() -> None:
    """The hook runs where runplane is not installed, so it repeats the values: these must be
    the ones of runplane/adapters/aws/resources.py."""
    values = dict(re.findall(r"^([a-z_]+)=(\S+)", HOOK.read_text(), re.MULTILINE))
    assert {
        "retention": str(resources.MESSAGE_RETENTION_SECONDS),
        "pool_visibility": str(resources.POOL_VISIBILITY_SECONDS),
        "events_visibility": str(resources.EVENTS_VISIBILITY_SECONDS),
        "max_receives": str(MAX_RECEIVES),
        "ttl_attribute": resources.WORKERS_TTL_ATTRIBUTE,
        "runs_ttl_attribute": resources.RUNS_TTL_ATTRIBUTE,
        "relay_ttl_attribute": resources.RELAY_TTL_ATTRIBUTE,
        "sse_algorithm": resources.SSE_ALGORITHM,
        "object_ownership": resources.OBJECT_OWNERSHIP,
        "noncurrent_days": str(resources.NONCURRENT_VERSION_DAYS),
        "abort_days": str(resources.ABORT_INCOMPLETE_UPLOADS_DAYS),
        "key_spec": resources.SECRETS_KEY_SPEC,
        "key_usage": resources.SECRETS_KEY_USAGE,
    }.items() <= values.items()


def aws_cli_script() -> tuple[Path, list[str] | None]:
    """The ``aws`` on PATH, seen through a pyenv shim: its path, and the interpreter of its
    shebang when it is a Python script (the CLI's version 1), else None."""
    found = shutil.which("aws")
    assert found is not None, "the aws CLI is not on PATH: scripts/setup.sh --test installs it"
    script = Path(found)
    pyenv = shutil.which("pyenv")
    with script.open("rb") as f:
        head = f.read(4096).decode(errors="replace")
    if pyenv and "pyenv" in head:
        which = subprocess.run([pyenv, "which", "aws"], capture_output=True, text=True, timeout=60)
        assert which.returncode == 0, which.stderr
        script = Path(which.stdout.strip())
    with script.open("rb") as f:
        first = f.readline().decode(errors="replace")
    return script, (first[2:].split() if first.startswith("#!") and "python" in first else None)


@contextlib.contextmanager
def awslocal(bin_dir: Path, endpoint: str, env: dict[str, str]) -> Iterator[Path]:
    """``bin_dir/awslocal``: LocalStack's awslocal, played by the aws CLI against ``endpoint``.
    The hook calls it some thirty times a run; each call is a process of the aws CLI forked from
    one that has imported it (tests/forkserver.py), as the import is most of a call."""
    script, interpreter = aws_cli_script()
    shim = bin_dir / "awslocal"
    if interpreter is None:  # not a Python script: each call starts it
        shim.write_text(f'#!/bin/sh\nexec {script} --endpoint-url {endpoint} "$@"\n')
        shim.chmod(0o755)
        yield shim
        return
    server = ForkServer(interpreter, ["awscli.clidriver", "awscli.handlers"], env)
    try:
        client = f"{sys.executable} -I -S {FORKSERVER} --client {server.socket} --path {script}"
        shim.write_text(f'#!/bin/sh\nexec {client} -- --endpoint-url {endpoint} "$@"\n')
        shim.chmod(0o755)
        yield shim
    finally:
        server.stop()


@pytest.mark.slow
def test_hook_on_moto_creates_what_provision_creates(moto_endpoint: str, tmp_path: Path) -> None:
    """Run the hook (twice: it is idempotent) against moto's server, compare with provision().
    The aws CLI stands in for LocalStack's awslocal; scripts/setup.sh --test installs it."""
    tag = uuid.uuid4().hex[:8]
    hook, ref = AwsNames(prefix=f"hook{tag}"), AwsNames(prefix=f"ref{tag}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPLANE_", "AWS_"))}
    env |= {
        "PATH": f"{tmp_path}:{env['PATH']}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "RUNPLANE_PREFIX": hook.prefix,
        "RUNPLANE_POOL_NAMES": " , ".join(POOLS),
    }
    with awslocal(tmp_path, moto_endpoint, env):
        for _ in range(2):
            done = subprocess.run(
                ["bash", str(HOOK)], env=env, capture_output=True, text=True, timeout=240, check=False
            )
            assert done.returncode == 0, done.stdout + done.stderr

    session = boto3.session.Session(aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1")
    ddb, sqs, s3, kms = (session.client(s, endpoint_url=moto_endpoint) for s in ("dynamodb", "sqs", "s3", "kms"))
    provision(ref, POOLS, ddb, sqs, s3, tls_only=True, kms=kms)  # the hook always sets the policy
    got, want = read_stack(hook, POOLS, ddb, sqs, s3, kms), read_stack(ref, POOLS, ddb, sqs, s3, kms)
    for part in ("tables", "queues", "bucket", "key"):
        assert got[part] == want[part], part
    assert got["tables"]["workers_table"]["TimeToLive"] == ("ENABLED", resources.WORKERS_TTL_ATTRIBUTE)
    assert got["tables"]["runs_table"]["TimeToLive"] == ("ENABLED", resources.RUNS_TTL_ATTRIBUTE)
    assert got["tables"]["relay_table"]["TimeToLive"] == ("ENABLED", resources.RELAY_TTL_ATTRIBUTE)
    assert got["queues"]["events"]["VisibilityTimeout"] == resources.EVENTS_VISIBILITY_SECONDS
    assert got["bucket"]["policy"] == resources.bucket_policy("BUCKET", "us-east-1")


# Runs in the SAM venv: expand Fn::ForEach, apply the SAM transform, print every role it ends with.
_TRANSLATE = """
import json, sys
from samcli.yamlhelper import yaml_parse
from samcli.lib.cfn_language_extensions.api import process_template
from samtranslator.translator.transform import transform
template = process_template(yaml_parse(open(sys.argv[1]).read()))
template["Transform"] = "AWS::Serverless-2016-10-31"
template["Globals"]["Function"]["CodeUri"] = "s3://bucket/code.zip"  # what `sam package` leaves
class NoManagedPolicies:
    def load(self):
        return {}
out = transform(template, {}, NoManagedPolicies())
resources = out["Resources"].items()
roles = {k: r["Properties"] for k, r in resources if r["Type"] == "AWS::IAM::Role"}
functions = {k: r["Properties"]["Role"] for k, r in resources if r["Type"] == "AWS::Lambda::Function"}
print(json.dumps({"roles": roles, "functions": functions}))
"""


@pytest.mark.sam
def test_sam_gives_each_function_only_the_templates_statements() -> None:
    """After the SAM transform, each function's role holds the statements the template writes,
    plus only SAM's logs and X-Ray managed policies: no AWSLambdaSQSQueueExecutionRole (receive and
    delete on every queue), which SAM would attach to a role it makes for an SQS event."""
    ensure_sam_venv()
    done = run_tool([str(SAM_VENV / "bin" / "python"), "-c", _TRANSLATE, str(TEMPLATE)])
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    template = load_template()
    for function, role_ref in out["functions"].items():
        role = out["roles"][role_ref["Fn::GetAtt"][0]]
        managed = {arn if isinstance(arn, str) else arn["Fn::Sub"] for arn in role.get("ManagedPolicyArns", [])}
        assert {a.rsplit(":policy/", 1)[1] for a in managed} == {
            "service-role/AWSLambdaBasicExecutionRole",
            "AWSXrayWriteOnlyAccess",
        }, function
        written = [s for s in function_statements(template, function) if "Template" not in s]
        held = [
            s
            for policy in role.get("Policies", [])
            for branch in (policy["Fn::If"][1:] if "Fn::If" in policy else [policy])
            if isinstance(branch, dict) and "PolicyDocument" in branch
            for s in branch["PolicyDocument"]["Statement"]
        ]
        # iam:PassRole is there only with a WorkerRoleArn (empty by default)
        expected = sorted(s["Sid"] for s in written if s["Sid"] != "PassWorkerRole")
        assert sorted(s["Sid"] for s in held) == expected, function


@pytest.mark.sam
@pytest.mark.slow
def test_sam_build_packages_the_functions_and_nothing_else(tmp_path: Path) -> None:
    """`sam build` (makefile build method) gives each function its code and Lambda dependencies,
    small enough for Lambda, importable with nothing else on the path. (--parallel: the three
    builds, each a pip install, at once; each still has a directory of its own.)"""
    ensure_sam_venv()
    out = tmp_path / "build"
    done = run_tool(
        [str(SAM), "build", "--language-extensions", "--build-in-source", "--parallel", "--build-dir", str(out)],
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("ApiFunction", "DispatcherFunction", "ReaperFunction"):
        artifact = out / name
        size = sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file())
        assert size < 100 * 2**20, f"{name} is {size / 2**20:.0f} MB"
        assert not (artifact / ".venv").exists() and not (artifact / "moto").exists()
        check = subprocess.run(
            [
                sys.executable,
                "-S",
                "-c",
                "import sys; sys.path.insert(0, '.'); import functions.aws.api, "
                "functions.aws.dispatcher, functions.aws.reaper",
            ],
            cwd=artifact,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert check.returncode == 0, check.stderr


# ---- what `sam build` packages ----------------------------------------------------------------


def _requirement_names(lines: list[str]) -> set[str]:
    return {re.split(r"[\[<>=;! ]", line.strip(), maxsplit=1)[0].lower() for line in lines if line.strip()}


def test_the_functions_get_the_aws_extra_as_wheels_of_their_runtime(template: dict[str, Any]) -> None:
    """The Lambda build installs every requirement of the aws extra (cryptography included: the
    API seals secrets) and of the base it builds on, as binary wheels of the template's runtime
    and architecture, whatever Python runs the build."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = _requirement_names([*project["dependencies"], *project["optional-dependencies"]["aws"]])
    wanted -= {"httpx", "typer", "rich", "websockets"}  # the client's, CLI's and agent's, not the functions'
    lines = (ROOT / "functions" / "aws" / "requirements.txt").read_text().splitlines()
    found = _requirement_names([line for line in lines if not line.lstrip().startswith("#")])
    assert "cryptography" in wanted and wanted <= found, sorted(wanted - found)
    makefile = (ROOT / "Makefile").read_text()
    settings = dict(re.findall(r"^(LAMBDA_[A-Z]+) \?= (\S+)$", makefile, re.MULTILINE))
    runtime = template["Globals"]["Function"]["Runtime"]
    (architecture,) = template["Globals"]["Function"]["Architectures"]
    assert f"python{settings['LAMBDA_PYTHON']}" == runtime
    assert settings["LAMBDA_PLATFORM"].endswith(f"_{architecture}")
    targets = " ".join(f"build-{name}" for name in sorted(functions(template)))  # every function is built alike
    build = makefile.split(f"{targets}:", 1)[1].split("\n\n")[0]
    for flag in ("--python-version $(LAMBDA_PYTHON)", "--platform $(LAMBDA_PLATFORM)", "--only-binary=:all:"):
        assert flag in build, flag


def test_the_relay_is_one_function_behind_the_three_routes_of_a_websocket_api(template: dict[str, Any]) -> None:
    """$connect, $default and $disconnect (no other route, no authorizer: the function checks the
    ticket) go to one AWS_PROXY integration of the relay function, which API Gateway may invoke for
    this API alone; the stage the functions are told of (RUNPLANE_RELAY_URL, the RelayUrl output) is
    the one deployed."""
    resources_ = template["Resources"]
    of_type = {k: v.get("Properties", {}) for k, v in resources_.items() if isinstance(v, dict) and "Type" in v}
    api = resources_["RelayApi"]["Properties"]
    assert api["ProtocolType"] == "WEBSOCKET"
    routes = {p["RouteKey"]: p for k, p in of_type.items() if resources_[k]["Type"] == "AWS::ApiGatewayV2::Route"}
    assert set(routes) == {"$connect", "$default", "$disconnect"}
    for route in routes.values():
        assert route["ApiId"] == {"Ref": "RelayApi"}
        assert route["Target"] == {"Fn::Sub": "integrations/${RelayIntegration}"}
        assert route.get("AuthorizationType", "NONE") == "NONE"
    integration = resources_["RelayIntegration"]["Properties"]
    assert integration["IntegrationType"] == "AWS_PROXY"
    assert "${RelayFunction.Arn}" in integration["IntegrationUri"]["Fn::Sub"]
    assert functions(template)["RelayFunction"]["Properties"]["Handler"] == "functions/aws/relay.lambda_handler"
    importlib.import_module("functions.aws.relay").lambda_handler  # noqa: B018  (the handler is there)
    permission = resources_["RelayInvokePermission"]["Properties"]
    assert permission["FunctionName"] == {"Ref": "RelayFunction"}
    assert permission["Principal"] == "apigateway.amazonaws.com"
    assert permission["SourceArn"]["Fn::Sub"].endswith(":${RelayApi}/*")
    stage = resources_["RelayStage"]["Properties"]
    assert (stage["ApiId"], stage["AutoDeploy"]) == ({"Ref": "RelayApi"}, True)
    url = template["Globals"]["Function"]["Environment"]["Variables"]["RUNPLANE_RELAY_URL"]
    assert url == template["Outputs"]["RelayUrl"]["Value"]
    assert url["Fn::Sub"].endswith(f"/{stage['StageName']}")
