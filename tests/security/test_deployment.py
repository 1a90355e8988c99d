"""The deployment's security settings: the stack's region, SigV4 presigned URLs on the regional
endpoint, the local stack's resources equal to the template's, least-privilege IAM for each
function and the workers, and IMDSv2 with hop limit 1 for EC2 workers.

Each test here failed on the deployment as it was before (SigV2 URLs on the global endpoint,
us-east-1 whatever AWS_REGION said, SAM CRUD policy templates and ``batch:*`` on ``*``, a local
stack without TTL, PITR or bucket settings)."""

from __future__ import annotations

import copy
import fnmatch
import json
import subprocess
import sys
import urllib.request
import uuid
from importlib import resources as package_files
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import botocore.session
import pytest
import yaml
from botocore.validate import ParamValidator

from runplane.adapters.aws import resources
from runplane.adapters.aws.provision import AwsNames, provision
from runplane.adapters.aws.quotas import DynamoQuotaStore
from runplane.adapters.aws.s3 import S3ObjectStore
from runplane.adapters.aws.secrets import DynamoSecretStore, KmsOpener, KmsSealer
from runplane.bootstrap import Stack, aws_clients, aws_names
from runplane.domain.quotas import Hold, Quota
from runplane.domain.secrets import SecretRecord, context, group_scope, user_scope
from runplane.settings import StackSettings
from tests.aws_readback import read_stack, template_stack
from tests.cfn_template import (
    ROOT,
    CfnLoader,
    as_list,
    expanded_resources,
    function_statements,
    functions,
    load_template,
    role_of,
)

BATCH = ROOT / "infra" / "aws-batch"
AMI = ROOT / "infra" / "ami"

# The only actions a function may be granted on every resource ("*"): AWS Batch defines no
# resource type for them (they support no resource-level permissions), so IAM requires "*".
# ecr:GetAuthorizationToken is the same: the workers' login token for a pool's ECR registries
# (the repositories' layers are granted by the operator, on their own repositories).
UNSCOPED_ACTIONS = {
    "batch:ListJobs",
    "batch:DescribeJobs",
    "batch:DescribeJobDefinitions",
    "ecr:GetAuthorizationToken",
}
READ_ACTIONS = {
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:Query",
    "dynamodb:Scan",
    "dynamodb:DescribeTable",
    "dynamodb:ConditionCheckItem",
}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


# ---- the region -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "region"),
    [
        ({"AWS_REGION": "eu-west-1"}, "eu-west-1"),  # what Lambda (and ECS) set
        ({"AWS_DEFAULT_REGION": "ap-south-1"}, "ap-south-1"),
        ({"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "ap-south-1"}, "eu-west-1"),
        ({"RUNPLANE_AWS_REGION": "eu-central-1", "AWS_REGION": "eu-west-1"}, "eu-central-1"),
        ({"RUNPLANE_AWS_REGION": "", "AWS_REGION": "eu-west-1"}, "eu-west-1"),
        ({}, "us-east-1"),
    ],
)
def test_region_comes_from_the_environment(environ: dict[str, str], region: str) -> None:
    settings = StackSettings.from_env(environ)
    assert settings.aws_region == region
    clients = aws_clients(settings)
    for service in ("dynamodb", "sqs", "s3"):
        assert clients[service].meta.region_name == region, service
        assert region in clients[service].meta.endpoint_url, service


# ---- presigned URLs -------------------------------------------------------------------------


@pytest.fixture
def offline_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keys from the environment only (signing needs no network), no profile of this machine."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "RUNPLANE_AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))


def _assert_sigv4(url: str, region: str) -> dict[str, list[str]]:
    query = parse_qs(urlsplit(url).query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"], url
    (credential,) = query["X-Amz-Credential"]
    assert credential.endswith(f"/{region}/s3/aws4_request"), credential
    assert "X-Amz-Signature" in query
    assert not {"AWSAccessKeyId", "Signature"} & set(query), "a Signature Version 2 URL"
    return query


@pytest.mark.usefixtures("offline_credentials")
@pytest.mark.parametrize("region", ["eu-west-1", "us-east-1", "ap-southeast-2"])
def test_presigned_urls_are_sigv4_on_the_regional_endpoint(region: str) -> None:
    settings = StackSettings.from_env({"AWS_REGION": region, "RUNPLANE_BUCKET": "rp-data-123456789012"})
    objects = S3ObjectStore(settings.bucket, aws_clients(settings)["s3"])
    url = objects.url("runs/r-1/outputs/1/model weights.bin", expires_seconds=600)
    parts = urlsplit(url)
    assert parts.scheme == "https"
    assert parts.hostname == f"rp-data-123456789012.s3.{region}.amazonaws.com"
    assert parts.path == "/runs/r-1/outputs/1/model%20weights.bin"
    query = _assert_sigv4(url, region)
    assert query["X-Amz-Expires"] == ["600"]


@pytest.mark.usefixtures("offline_credentials")
def test_bucket_names_that_cannot_be_host_names_keep_the_regional_endpoint() -> None:
    settings = StackSettings.from_env({"AWS_REGION": "eu-west-1", "RUNPLANE_BUCKET": "rp.data.example"})
    url = S3ObjectStore(settings.bucket, aws_clients(settings)["s3"]).url("runs/r-1/outputs/1/a")
    assert urlsplit(url).hostname == "s3.eu-west-1.amazonaws.com"  # path style: TLS covers the host
    _assert_sigv4(url, "eu-west-1")


def test_presigned_url_downloads_the_object_from_moto(aws_stack: Stack) -> None:
    key = "runs/r-1/outputs/1/result.txt"
    aws_stack.objects.put_bytes(key, b"forty-two\n")
    url = aws_stack.objects.url(key)
    _assert_sigv4(url, aws_stack.settings.aws_region)
    with urllib.request.urlopen(url, timeout=10) as response:  # the moto server on 127.0.0.1
        assert response.read() == b"forty-two\n"


# ---- the local stack is the template's ----------------------------------------------------------


def _template_stack(template: dict[str, Any], pools: list[str]) -> dict[str, Any]:
    """What read_stack() should find on a stack deployed from the template: its queues, the
    TTL and PITR of its tables, and its bucket, in read_stack()'s shape."""
    declared = expanded_resources(template, pools)
    prefix = template["Parameters"]["Prefix"]["Default"]
    name_to_id = {r["Properties"]["QueueName"]: i for i, r in declared.items() if r["Type"] == "AWS::SQS::Queue"}

    def queue(name: str) -> dict[str, Any]:
        (props,) = [r["Properties"] for r in declared.values() if r.get("Properties", {}).get("QueueName") == name]
        redrive = props.get("RedrivePolicy")
        return {
            "MessageRetentionPeriod": int(props.get("MessageRetentionPeriod", 345600)),  # SQS defaults
            "VisibilityTimeout": int(props.get("VisibilityTimeout", 30)),
            "maxReceiveCount": int(redrive["maxReceiveCount"]) if redrive else None,
            "redrives to its own -dlq": (
                redrive["deadLetterTargetArn"]["Fn::GetAtt"][0] == name_to_id[f"{name}-dlq"] if redrive else None
            ),
        }

    queues: dict[str, Any] = {}
    for role, name in [(f"pool {p}", f"{prefix}-pool-{p}") for p in pools] + [("events", f"{prefix}-events")]:
        queues[role] = queue(name)
        queues[f"{role} dlq"] = queue(f"{name}-dlq")

    tables = {}
    for logical_id, field in {
        "RunsTable": "runs_table",
        "WorkersTable": "workers_table",
        "TokensTable": "tokens_table",
        "PoolsTable": "pools_table",
        "QuotasTable": "quotas_table",
        "SecretsTable": "secrets_table",
        "SessionsTable": "sessions_table",
        "RelayTable": "relay_table",
    }.items():
        props = declared[logical_id]["Properties"]
        ttl = props.get("TimeToLiveSpecification", {})
        pitr = props.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled")
        tables[field] = {
            "TimeToLive": ("ENABLED", ttl["AttributeName"]) if ttl.get("Enabled") else ("DISABLED", None),
            "PointInTimeRecovery": "ENABLED" if pitr else "DISABLED",
        }

    bucket = declared["DataBucket"]["Properties"]
    lifecycle = []
    for rule in bucket["LifecycleConfiguration"]["Rules"]:
        if "Fn::If" in rule:  # a rule of a parameter (UploadRetentionDays) whose default leaves it out
            continue
        api_rule = {"ID": rule["Id"], "Status": rule["Status"], "Filter": {"Prefix": rule.get("Prefix", "")}}
        lifecycle.append(api_rule | {k: v for k, v in rule.items() if k not in ("Id", "Status", "Prefix")})
    (statement,) = declared["DataBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    statement = copy.deepcopy(statement)
    arns = {json.dumps({"Fn::GetAtt": ["DataBucket", "Arn"]}): "arn:aws:s3:::BUCKET"}
    arns[json.dumps({"Fn::Sub": "${DataBucket.Arn}/*"})] = "arn:aws:s3:::BUCKET/*"
    statement["Resource"] = [arns[json.dumps(r)] for r in as_list(statement["Resource"])]
    return {
        "tables": tables,
        "queues": queues,
        "bucket": {
            "encryption": [
                c["ServerSideEncryptionByDefault"]
                for c in bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
            ],
            "public_access_block": bucket["PublicAccessBlockConfiguration"],
            "ownership": bucket["OwnershipControls"]["Rules"],
            "versioning": bucket["VersioningConfiguration"]["Status"],
            "lifecycle": sorted(lifecycle, key=lambda r: r["ID"]),
            "policy": {"Version": "2012-10-17", "Statement": [statement]},
        },
    }


def test_local_stack_resources_are_the_templates(template: dict[str, Any], aws_stack: Stack) -> None:
    """provision() on moto (the local stack's path), read back from the services: queue
    visibility timeouts, TTL, PITR, encryption, public-access block, versioning and lifecycle are
    what template.yaml declares, and so is the secrets key. Served over plain HTTP, it gets no
    TLS-only policy (which would refuse every request): the next test gives it one."""
    pools = [p.name for p in aws_stack.pools.pools]
    clients = aws_clients(aws_stack.settings)
    names = aws_names(aws_stack.settings)
    found = read_stack(names, pools, clients["dynamodb"], clients["sqs"], clients["s3"], clients["kms"])
    for table in found["tables"].values():
        for key in ("KeySchema", "AttributeDefinitions", "GlobalSecondaryIndexes"):
            del table[key]
    expected = _template_stack(template, pools)
    assert found["key"] == template_stack(template, pools)["key"]  # spec, rotation, alias, key policy
    assert found["queues"] == expected["queues"]
    assert found["tables"] == expected["tables"]
    assert found["bucket"].pop("policy") is None
    expected["bucket"].pop("policy")
    assert found["bucket"] == expected["bucket"]
    # and the values are the ones the code holds
    assert found["queues"]["events"]["VisibilityTimeout"] == resources.EVENTS_VISIBILITY_SECONDS


def test_provision_gives_the_bucket_the_templates_tls_only_policy(template: dict[str, Any], moto_endpoint: str) -> None:
    settings = StackSettings(prefix=f"tls{uuid.uuid4().hex[:8]}", aws_endpoint_url=moto_endpoint)
    clients = aws_clients(settings)
    names = aws_names(settings)
    provision(names, ["default"], clients["dynamodb"], clients["sqs"], clients["s3"], tls_only=True)
    found = read_stack(names, ["default"], clients["dynamodb"], clients["sqs"], clients["s3"])
    assert found["bucket"]["policy"] == _template_stack(template, ["default"])["bucket"]["policy"]
    assert found["bucket"]["policy"]["Statement"] == [resources.tls_only_statement("arn:aws:s3:::BUCKET")]


class _PolicyRecorder:
    """An S3 client that records bucket policies and accepts every other call."""

    def __init__(self, endpoint_url: str) -> None:
        self.meta = SimpleNamespace(endpoint_url=endpoint_url)
        self.policies: dict[str, Any] = {}

    def put_bucket_policy(self, Bucket: str, Policy: str) -> None:
        self.policies[Bucket] = json.loads(Policy)

    def __getattr__(self, name: str) -> Any:
        answer = {
            "TableDescription": {"TableStatus": "ACTIVE"},
            "QueueUrl": "https://sqs/q",
            "Attributes": {"QueueArn": "arn:q"},
        }
        return lambda **kwargs: answer


@pytest.mark.parametrize(
    ("endpoint", "region", "policy"),
    [
        ("https://s3.eu-west-1.amazonaws.com", "eu-west-1", True),
        ("https://s3.cn-north-1.amazonaws.com.cn", "cn-north-1", True),
        ("http://127.0.0.1:5000", "us-east-1", False),
    ],
)
def test_provision_sets_the_tls_only_policy_over_https(endpoint: str, region: str, policy: bool) -> None:
    s3 = _PolicyRecorder(endpoint)
    other = _PolicyRecorder(endpoint)
    provision(AwsNames(prefix="p"), ["default"], other, other, s3, region)
    if not policy:
        assert s3.policies == {}
        return
    partition = "aws-cn" if region.startswith("cn-") else "aws"
    assert s3.policies == {"p-data": resources.bucket_policy("p-data", region)}
    assert s3.policies["p-data"]["Statement"][0]["Resource"][0] == f"arn:{partition}:s3:::p-data"


def test_bucket_refuses_plain_http(template: dict[str, Any]) -> None:
    """Every request to the bucket or its objects without TLS is denied, whoever makes it."""
    denies = [
        s
        for s in template["Resources"]["DataBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"]
        if s["Effect"] == "Deny"
    ]
    (deny,) = denies
    assert deny["Principal"] == "*" and deny["Action"] == "s3:*"
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    covered = {json.dumps(r, sort_keys=True) for r in as_list(deny["Resource"])}
    assert covered == {
        json.dumps({"Fn::GetAtt": ["DataBucket", "Arn"]}, sort_keys=True),
        json.dumps({"Fn::Sub": "${DataBucket.Arn}/*"}, sort_keys=True),
    }
    props = template["Resources"]["DataBucket"]["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    noncurrent = [r for r in props["LifecycleConfiguration"]["Rules"] if "NoncurrentVersionExpiration" in r]
    assert noncurrent and noncurrent[0]["NoncurrentVersionExpiration"]["NoncurrentDays"] > 0


# ---- IAM: least privilege -------------------------------------------------------------------


def _all_statements(template: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out = {name: function_statements(template, name) for name in functions(template)}
    out["WorkerPolicy"] = template["Resources"]["WorkerPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    return out


def _resource_types() -> dict[str, dict[str, Any]]:
    """cfn-lint's copy of the Service Authorization Reference: service -> action -> its
    resource types (none: the action supports no resource-level permissions)."""
    path = package_files.files("cfnlint") / "data" / "AdditionalSpecs" / "Policies.json"
    return {service: spec["Actions"] for service, spec in json.loads(path.read_text()).items()}


def _references(value: Any) -> set[str]:
    """The logical ids a statement's resources name (Ref, GetAtt, ${X.Arn} in a Sub)."""
    text = json.dumps(value)
    found = set()
    for logical_id in (
        "RunsTable",
        "WorkersTable",
        "TokensTable",
        "PoolsTable",
        "QuotasTable",
        "SecretsTable",
        "SessionsTable",
        "RelayTable",
        "RelayApi",
        "SecretsKey",
        "DataBucket",
        "EventsQueue",
    ):
        if f'"{logical_id}"' in text or f"${{{logical_id}" in text:
            found.add(logical_id)
    return found


def test_policies_are_statements_not_broad_sam_templates(template: dict[str, Any]) -> None:
    statements = _all_statements(template)
    assert statements
    for name, found in statements.items():
        templates = [s["Template"] for s in found if "Template" in s]
        assert not templates, f"{name} uses SAM policy templates (more than it needs): {templates}"


def test_nothing_is_granted_on_every_resource_but_the_unscoped_batch_reads(template: dict[str, Any]) -> None:
    types = _resource_types()
    statements = _all_statements(template)
    assert statements
    grants = set()  # whether a grant on every resource, and a scoped one, were both seen
    for name, found in statements.items():
        for statement in found:
            if "Template" in statement:
                continue  # a SAM policy template: test_policies_are_statements_not_broad_sam_templates
            assert (
                statement.get("Effect") == "Allow" and "NotAction" not in statement and "NotResource" not in statement
            )
            actions = set(as_list(statement["Action"]))
            assert not any("*" in a for a in actions), f"{name}: a wildcard action in {statement}"
            everything = "*" in as_list(statement["Resource"])
            grants.add(everything)
            for action in actions:
                service, _, verb = action.partition(":")
                scoped = bool(types[service][verb.lower()].get("Resources"))
                if everything:
                    assert action in UNSCOPED_ACTIONS, f"{name}: {action} is granted on every resource"
                    assert not scoped, f"{name}: {action} supports resource-level permissions; scope it"
                else:
                    # A scoped grant of an action IAM only grants on "*" would silently deny it.
                    assert scoped, f"{name}: {action} supports no resource-level permissions, yet is scoped"
    assert grants == {True, False}


def test_the_unscoped_batch_reads_are_documented(template: dict[str, Any]) -> None:
    text = (ROOT / "template.yaml").read_text()
    assert "support no resource-level permissions" in text
    readme = (BATCH / "README.md").read_text()
    for action in UNSCOPED_ACTIONS:
        assert action in readme


def test_each_function_reaches_only_its_tables(template: dict[str, Any]) -> None:
    reached = {
        name: set().union(*(_references(s.get("Resource")) for s in found))
        for name, found in _all_statements(template).items()
    }
    assert reached["ApiFunction"] == {
        "RunsTable",
        "WorkersTable",
        "PoolsTable",
        "TokensTable",
        "QuotasTable",
        "SecretsTable",
        "SessionsTable",
        "RelayTable",  # a session closed: its sides' connections found and dropped...
        "RelayApi",  # ...and hung up
        "SecretsKey",
        "DataBucket",
        "EventsQueue",
    }
    assert reached["RelayFunction"] == {"SessionsTable", "RelayTable", "RelayApi"}
    assert reached["DispatcherFunction"] == {
        "RunsTable",
        "WorkersTable",
        "PoolsTable",
        "QuotasTable",  # lanes only: a released sweep member's place in line
        "DataBucket",  # the stack record alone (runs/_stack/)
        "EventsQueue",
    }  # its event source
    assert reached["ReaperFunction"] == {
        "RunsTable",
        "QuotasTable",
        "EventsQueue",
        "DataBucket",  # the retention sweep: runs' objects and unused uploads
        "PoolsTable",  # the sweep's own record, and whether a pool's agents are of an earlier release
        "SessionsTable",  # sessions no worker took in time expire
    }
    assert reached["WorkerPolicy"] == {
        "RunsTable",
        "WorkersTable",
        "QuotasTable",
        "SecretsTable",
        "SessionsTable",
        "SecretsKey",
        "DataBucket",
        "EventsQueue",
    }


def test_each_principal_may_do_what_it_does_with_sessions(template: dict[str, Any]) -> None:
    """The API makes sessions (a conditional put), lists a run's and moves them on; the reaper
    expires them, and deletes an ended run's with its record (the retention sweep); the workers
    read and move on the sessions of their runs but cannot make one (no PutItem: a session is asked
    by its run's owner through the API, never by a worker)."""
    found = _all_statements(template)
    on_sessions = {name: _actions_on(statements, "SessionsTable") for name, statements in found.items()}
    assert on_sessions == {
        "ApiFunction": {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query"},
        "DispatcherFunction": set(),
        "ReaperFunction": {"dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:Query", "dynamodb:DeleteItem"},
        "RelayFunction": {"dynamodb:GetItem"},  # a ticket checked: the relay never changes a session
        "WorkerPolicy": {"dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:Query"},
    }


def test_only_the_relay_and_the_api_reach_the_relays_connections(template: dict[str, Any]) -> None:
    """The relay function claims, reads, counts and drops connection records and posts to, looks up
    and closes the relay's connections; the API (closing a session) only drops the records and
    hangs up; nobody else reaches either. @connections is granted on the relay's own stage."""
    found = _all_statements(template)
    on_table = {name: _actions_on(statements, "RelayTable") for name, statements in found.items()}
    on_api = {name: _actions_on(statements, "RelayApi") for name, statements in found.items()}
    assert on_table == {
        "ApiFunction": {"dynamodb:DeleteItem"},
        "DispatcherFunction": set(),
        "ReaperFunction": set(),
        "RelayFunction": {
            "dynamodb:GetItem",
            "dynamodb:BatchGetItem",
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
            "dynamodb:DeleteItem",
        },
        "WorkerPolicy": set(),
    }
    manage = {"execute-api:ManageConnections"}
    assert on_api == {
        "ApiFunction": manage,
        "DispatcherFunction": set(),
        "ReaperFunction": set(),
        "RelayFunction": manage,
        "WorkerPolicy": set(),
    }
    stage = "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${RelayApi}/v1/*/@connections/*"
    for name in ("ApiFunction", "RelayFunction"):
        (grant,) = [s for s in found[name] if "execute-api:ManageConnections" in as_list(s["Action"])]
        assert grant["Resource"] == {"Fn::Sub": stage}, name


def test_the_relay_function_has_a_concurrency_cap_of_its_own(template: dict[str, Any]) -> None:
    """Every session frame is a relay invocation: a reserved concurrency (a parameter; 0, the
    default, reserves none: AWS refuses a reservation that leaves an account under 100) caps what a
    flood of them costs and takes from the account, the stage is throttled, and one connection may
    send less than the stage takes (a parameter the function reads)."""
    relay = functions(template)["RelayFunction"]["Properties"]
    assert relay["ReservedConcurrentExecutions"] == {
        "Fn::If": ["HasRelayConcurrency", {"Ref": "RelayConcurrency"}, {"Ref": "AWS::NoValue"}]
    }
    assert template["Conditions"]["HasRelayConcurrency"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "RelayConcurrency"}, 0]}]
    }
    cap = template["Parameters"]["RelayConcurrency"]
    assert cap["Type"] == "Number" and cap["MinValue"] == cap["Default"] == 0 < cap["MaxValue"]
    rate = template["Parameters"]["RelayMessageRate"]  # one connection's share of the stage's throttle
    assert relay["Environment"]["Variables"]["RUNPLANE_RELAY_MESSAGE_RATE"] == {"Ref": "RelayMessageRate"}
    assert rate["Type"] == "Number" and 1 <= rate["MinValue"] <= rate["Default"] < 1000
    throttle = template["Resources"]["RelayStage"]["Properties"]["DefaultRouteSettings"]
    assert throttle == {"ThrottlingBurstLimit": 500, "ThrottlingRateLimit": 1000}


def test_the_dispatcher_has_no_access_to_the_tokens_table(template: dict[str, Any]) -> None:
    policies = functions(template)["DispatcherFunction"]["Properties"].get("Policies", [])
    assert "TokensTable" not in json.dumps([policies, role_of(template, "DispatcherFunction")])
    assert not any("TokensTable" in json.dumps(s) for s in function_statements(template, "DispatcherFunction"))


# What SAM attaches to the role it makes for a function, by event type: AWSLambdaSQSQueueExecutionRole
# (sqs:ReceiveMessage and sqs:DeleteMessage on every queue of the account) for SQS events.
BROAD_EVENT_POLICIES = {"SQS", "Kinesis", "DynamoDB", "MSK", "MQ", "SelfManagedKafka", "DocumentDB"}


def test_functions_with_queue_events_have_their_own_narrow_role(template: dict[str, Any]) -> None:
    with_queue_events = [
        (name, function)
        for name, function in functions(template).items()
        if {e["Type"] for e in function["Properties"].get("Events", {}).values()} & BROAD_EVENT_POLICIES
    ]
    assert with_queue_events, "no function has a queue event?"
    for name, function in with_queue_events:
        role = role_of(template, name)
        assert role is not None, f"{name}: SAM would attach a managed policy on every queue or stream"
        props = role["Properties"]
        assert props["AssumeRolePolicyDocument"]["Statement"] == [
            {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
        ]
        managed = {arn["Fn::Sub"].rsplit(":policy/", 1)[1] for arn in props.get("ManagedPolicyArns", [])}
        assert managed <= {"service-role/AWSLambdaBasicExecutionRole", "AWSXrayWriteOnlyAccess"}, managed
        # the event source mapping reads its own queue, and that queue only
        receive = [s for s in function_statements(template, name) if "sqs:ReceiveMessage" in as_list(s["Action"])]
        sources = [e["Properties"]["Queue"] for e in function["Properties"]["Events"].values() if e["Type"] == "SQS"]
        assert [s["Resource"] for s in receive] == sources


def _actions_on(found: list[dict[str, Any]], logical_id: str) -> set[str]:
    actions: set[str] = set()
    for statement in found:
        if "Template" in statement:
            if logical_id in json.dumps(statement["Template"]):
                actions |= {f"sam:{next(iter(statement['Template']))}"}
        elif logical_id in _references(statement.get("Resource")):
            actions |= set(as_list(statement["Action"]))
    return actions


def test_the_api_only_reads_the_workers_and_pools_tables(template: dict[str, Any]) -> None:
    found = function_statements(template, "ApiFunction")
    for table in ("WorkersTable", "PoolsTable"):
        actions = _actions_on(found, table)
        assert actions, f"the API reads {table}"
        assert actions <= READ_ACTIONS, f"the API may change {table}: {sorted(actions - READ_ACTIONS)}"


def test_the_api_manages_tokens_but_cannot_change_other_tables_wholesale(template: dict[str, Any]) -> None:
    found = function_statements(template, "ApiFunction")
    assert _actions_on(found, "TokensTable") == {
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:DeleteItem",
        "dynamodb:Scan",
    }
    # runs are never deleted or scanned
    assert not {"dynamodb:DeleteItem", "dynamodb:Scan"} & _actions_on(found, "RunsTable")


def test_the_dispatcher_reads_a_pools_workers_through_the_by_pool_index_and_cannot_scan_them(
    template: dict[str, Any],
) -> None:
    found = function_statements(template, "DispatcherFunction")
    assert _actions_on(found, "WorkersTable") == {"dynamodb:Query"}
    resources = {json.dumps(s["Resource"]) for s in found if "WorkersTable" in _references(s.get("Resource"))}
    assert resources == {json.dumps({"Fn::Sub": "${WorkersTable.Arn}/index/by_pool"})}
    table = template["Resources"]["WorkersTable"]["Properties"]
    [index] = table["GlobalSecondaryIndexes"]
    assert (index["IndexName"], [k["AttributeName"] for k in index["KeySchema"]]) == ("by_pool", ["pool", "id"])


def test_the_reaper_queries_and_updates_runs_and_sends_hints(template: dict[str, Any]) -> None:
    found = function_statements(template, "ReaperFunction")
    # DeleteItem: the retention sweep's, of a record due and not kept (a condition of the write)
    assert _actions_on(found, "RunsTable") == {
        "dynamodb:Query",
        "dynamodb:UpdateItem",
        "dynamodb:GetItem",
        "dynamodb:DeleteItem",
    }
    assert _actions_on(found, "PoolsTable") == {"dynamodb:GetItem", "dynamodb:PutItem"}
    (writes,) = [
        s
        for s in found
        if "dynamodb:PutItem" in as_list(s["Action"]) and "PoolsTable" in _references(s.get("Resource"))
    ]
    assert writes["Condition"] == {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["@retention"]}}
    sqs = {a for s in found for a in as_list(s["Action"]) if a.startswith("sqs:")}
    assert sqs == {"sqs:SendMessage", "sqs:GetQueueUrl"}


def test_workers_reach_their_runs_objects_and_queues_only(template: dict[str, Any]) -> None:
    found = template["Resources"]["WorkerPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert _actions_on(found, "RunsTable") == {"dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:Query"}
    # the table itself is never queried or scanned; of its indexes, only its pool's line in order
    queries = [
        s for s in found if "dynamodb:Query" in as_list(s["Action"]) and "RunsTable" in _references(s["Resource"])
    ]
    assert [s["Resource"] for s in queries] == [{"Fn::Sub": "${RunsTable.Arn}/index/by_rank"}]
    assert _actions_on(found, "WorkersTable") == {"dynamodb:PutItem", "dynamodb:GetItem"}
    objects = [s for s in found if "DataBucket" in _references(s["Resource"])]
    granted = set()
    for statement in objects:
        for resource in as_list(statement["Resource"]):
            text = resource.get("Fn::Sub", "") if isinstance(resource, dict) else ""
            granted.add(text or "the bucket")
            if text:  # objects: only under runs/ (and the agent's own log, write only; uploads, read only;
                # its runs' old checkpoints, delete only)
                assert text in ("${DataBucket.Arn}/runs/*", "${DataBucket.Arn}/agents/*", UPLOADS, CHECKPOINTS), text
                if text.endswith("/agents/*"):
                    assert as_list(statement["Action"]) == ["s3:PutObject"]
                if text == UPLOADS:
                    assert as_list(statement["Action"]) == ["s3:GetObject"]
                if text == CHECKPOINTS:
                    assert as_list(statement["Action"]) == ["s3:DeleteObject"]
            else:  # the bucket: listing, under runs/ only
                assert as_list(statement["Action"]) == ["s3:ListBucket"]
                assert statement["Condition"] == {"StringLike": {"s3:prefix": "runs/*"}}
    assert granted == {"${DataBucket.Arn}/runs/*", "${DataBucket.Arn}/agents/*", UPLOADS, CHECKPOINTS, "the bucket"}
    assert {"ApiUrl", "WorkerPolicy"} <= set(template["Outputs"])


UPLOADS = "${DataBucket.Arn}/uploads/*"
CHECKPOINTS = "${DataBucket.Arn}/runs/*/checkpoints/*"


def test_uploads_are_signed_by_the_api_and_read_by_workers_only(template: dict[str, Any]) -> None:
    """The API heads an upload and signs its PUT (s3:GetObject, s3:PutObject on uploads/ alone);
    workers only read uploads; the reaper's retention sweep reads one again and deletes it once
    unused for the stack's time; no other role touches them."""
    principals = _all_statements(template)
    on_uploads = {
        name: {a for s in statements if "Resource" in s and _on_uploads(s) for a in as_list(s["Action"]) if "s3:" in a}
        for name, statements in principals.items()
    }
    assert {name: actions for name, actions in on_uploads.items() if actions} == {
        "ApiFunction": {"s3:GetObject", "s3:PutObject"},
        "WorkerPolicy": {"s3:GetObject"},
        "ReaperFunction": {"s3:GetObject", "s3:DeleteObject"},
    }


def _on_uploads(statement: dict[str, Any]) -> bool:
    texts = [r.get("Fn::Sub", "") if isinstance(r, dict) else r for r in as_list(statement["Resource"])]
    return any(t == UPLOADS or t in ("*", "${DataBucket.Arn}/*") for t in texts)


# ---- IAM: secrets ----------------------------------------------------------------------------


def _secret_calls(use: Any, *clients: Any) -> list[tuple[str, dict[str, Any]]]:
    """(IAM action, request parameters) of every request ``use()`` makes through ``clients``."""
    calls: list[tuple[str, dict[str, Any]]] = []

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        service = model.service_model.endpoint_prefix
        calls.append((f"{service}:{model.name}", dict(params)))

    for client in clients:
        client.meta.events.register("provide-client-params.*.*", record)
    try:
        use()
    finally:
        for client in clients:
            client.meta.events.unregister("provide-client-params.*.*", record)
    assert calls
    return calls


def _grants(statements: list[dict[str, Any]], action: str, params: dict[str, Any]) -> bool:
    """Whether one of ``statements`` allows ``action`` on the secrets table or key with the
    request ``params``. The conditions a grant on the key may carry are those of
    SECRETS_KEY_CONDITION's shape, evaluated here on the request's EncryptionContext."""
    for statement in statements:
        if action not in as_list(statement["Action"]):
            continue
        if not {"SecretsTable", "SecretsKey"} & _references(statement.get("Resource")):
            continue
        condition = statement.get("Condition", {})
        assert set(condition) <= {"StringLike", "ForAllValues:StringEquals"}, condition
        ctx = params.get("EncryptionContext", {})
        ok = all(
            key.startswith("kms:EncryptionContext:")
            and any(fnmatch.fnmatchcase(ctx.get(key.removeprefix("kms:EncryptionContext:"), ""), p) for p in patterns)
            for key, patterns in condition.get("StringLike", {}).items()
        )
        for key, allowed in condition.get("ForAllValues:StringEquals", {}).items():
            assert key == "kms:EncryptionContextKeys", key
            ok = ok and set(ctx) <= set(allowed)
        if ok:
            return True
    return False


def test_each_principal_may_do_what_it_does_with_secrets(template: dict[str, Any], aws_stack: Stack) -> None:
    """The requests the secrets store, sealer and opener really make (recorded on moto) are all
    allowed by the principal's statements: the API sets, lists, reads and removes secrets and
    seals values; a worker reads and opens a run's. Neither may do the other's part: the API
    cannot open a value, a worker can neither seal nor write one."""
    store, sealer, opener = aws_stack.secrets, aws_stack.sealer, aws_stack.opener
    assert isinstance(store, DynamoSecretStore) and isinstance(sealer, KmsSealer) and isinstance(opener, KmsOpener)
    kms = sealer.client.client()
    scope = group_scope("vision")
    ctx = context(scope, "wandb")
    sealed = sealer.seal(b"wandb-key-1234", ctx)

    def administer() -> None:
        record = SecretRecord(scope=scope, name="wandb", sealed=sealer.seal(b"v", ctx), updated_at=1.0, updated_by="a")
        store.put(record)
        store.list(scope)
        store.get(scope, "wandb")
        store.delete(scope, "other")

    def open_for_a_run() -> None:
        store.get(scope, "wandb")
        assert opener.open(sealed, ctx) == b"wandb-key-1234"

    statements = _all_statements(template)
    api = _secret_calls(administer, store.client, kms)
    worker = _secret_calls(open_for_a_run, store.client, kms)
    assert {a for a, _ in api} == {
        "kms:GenerateDataKey",
        "dynamodb:PutItem",
        "dynamodb:Query",
        "dynamodb:GetItem",
        "dynamodb:DeleteItem",
    }
    assert {a for a, _ in worker} == {"dynamodb:GetItem", "kms:Decrypt"}
    for principal, calls in (("ApiFunction", api), ("WorkerPolicy", worker)):
        denied = [action for action, params in calls if not _grants(statements[principal], action, params)]
        assert denied == [], f"{principal} may not {denied}"
    assert not any(_grants(statements["ApiFunction"], a, p) for a, p in worker if a.startswith("kms:"))
    writes = [(a, p) for a, p in api if a in ("dynamodb:PutItem", "dynamodb:DeleteItem", "kms:GenerateDataKey")]
    assert not any(_grants(statements["WorkerPolicy"], a, p) for a, p in writes)
    # a data key for no secret's context (a bare Decrypt or GenerateDataKey) is granted to no one
    for principal in statements:
        for action in ("kms:Decrypt", "kms:GenerateDataKey"):
            assert not _grants(statements[principal], action, {}), principal
            assert not _grants(statements[principal], action, {"EncryptionContext": {"aws:s3:arn": "x"}}), principal


def test_only_the_workers_may_decrypt_and_only_the_api_may_seal(template: dict[str, Any]) -> None:
    """Of every principal the template grants anything, the worker policy alone holds kms:Decrypt
    and the API alone kms:GenerateDataKey, each on the secrets key only, with the condition
    every secret's context meets; the dispatcher and the reaper reach neither the key nor the
    secrets table. The key policy names no principal but the account."""
    granted = {
        name: {(a, json.dumps(s["Resource"])) for s in found for a in as_list(s["Action"]) if a.startswith("kms:")}
        for name, found in _all_statements(template).items()
    }
    key = json.dumps({"Fn::GetAtt": ["SecretsKey", "Arn"]})
    assert granted == {
        "ApiFunction": {("kms:GenerateDataKey", key)},
        "DispatcherFunction": set(),
        "ReaperFunction": set(),
        "RelayFunction": set(),
        "WorkerPolicy": {("kms:Decrypt", key)},
    }
    for name, found in _all_statements(template).items():
        for statement in found:
            if any(a.startswith("kms:") for a in as_list(statement["Action"])):
                assert statement["Condition"] == resources.SECRETS_KEY_CONDITION, name
    for principal in ("DispatcherFunction", "ReaperFunction"):
        reached = set().union(*(_references(s.get("Resource")) for s in _all_statements(template)[principal]))
        assert not {"SecretsTable", "SecretsKey"} & reached, principal
    assert _actions_on(_all_statements(template)["WorkerPolicy"], "SecretsTable") == {"dynamodb:GetItem"}
    policy = template["Resources"]["SecretsKey"]["Properties"]["KeyPolicy"]
    principals = [s["Principal"] for s in policy["Statement"]]
    assert principals == [{"AWS": {"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:root"}}]
    for scope in (user_scope("alice"), group_scope("vision")):
        assert _grants(
            _all_statements(template)["WorkerPolicy"], "kms:Decrypt", {"EncryptionContext": context(scope, "x")}
        )


# ---- IAM: the quotas table, item by item ----------------------------------------------------

QUOTA_WRITES = {"dynamodb:PutItem", "dynamodb:DeleteItem", "dynamodb:UpdateItem", "dynamodb:BatchWriteItem"}


def _quota_statements(template: dict[str, Any], principal: str) -> list[dict[str, Any]]:
    return [s for s in _all_statements(template)[principal] if "QuotasTable" in _references(s.get("Resource"))]


def _allows(found: list[dict[str, Any]], action: str, key: str | None) -> bool:
    """Whether one of ``found`` (statements on the quotas table) allows ``action`` on the item
    ``key`` (None: no item, a Scan). The one condition these statements may carry is IAM's
    ``ForAllValues:StringLike`` on ``dynamodb:LeadingKeys``; anything else fails the test."""
    for statement in found:
        if action not in as_list(statement["Action"]):
            continue
        condition = statement.get("Condition")
        if condition is None:
            return True
        assert set(condition) == {"ForAllValues:StringLike"}, condition
        assert set(condition["ForAllValues:StringLike"]) == {"dynamodb:LeadingKeys"}, condition
        patterns = as_list(condition["ForAllValues:StringLike"]["dynamodb:LeadingKeys"])
        if key is None or any(fnmatch.fnmatchcase(key, p) for p in patterns):
            return True
    return False


def _quota_calls(aws_stack: Stack, use: Any) -> list[tuple[str, str | None]]:
    """(IAM action, item key) of every request ``use(quotas)`` makes to the quotas table, on a
    DynamoQuotaStore of the moto server."""
    quotas = aws_stack.quotas
    assert isinstance(quotas, DynamoQuotaStore)
    calls: list[tuple[str, str | None]] = []

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        item = params.get("Key") or params.get("Item") or {}
        calls.append((f"dynamodb:{model.name}", item["id"]["S"] if "id" in item else None))

    quotas.client.meta.events.register("provide-client-params.dynamodb.*", record)
    try:
        use(quotas)
    finally:
        quotas.client.meta.events.unregister("provide-client-params.dynamodb.*", record)
    assert calls
    return calls


def _reserve_and_release(quotas: Any) -> None:
    """What a worker does around a run: read its quotas and usage, hold, release."""
    hold = Hold(run_id="r-1", attempt=1, gpus=1, at=1.0)
    for kind, name in (("user", "alice"), ("group", "vision")):
        quotas.get(kind, name)
        held = quotas.save_usage(quotas.usage(kind, name).model_copy(update={"holds": {hold.key: hold}}))
        quotas.save_usage(held.model_copy(update={"holds": {}}))


def _heal(quotas: Any) -> None:
    """What the reaper does: find holds, release the stale ones."""
    for record in quotas.list_usage():
        quotas.save_usage(quotas.usage(record.kind, record.name).model_copy(update={"holds": {}}))


def _administer(quotas: Any) -> None:
    """What the API does: set, show, list and remove quotas, with their usage."""
    quotas.put(Quota(kind="group", name="vision", max_gpus=2, updated_at=1.0))
    quotas.get("group", "vision")
    quotas.usage("group", "vision")
    quotas.list()
    quotas.list_usage()
    quotas.delete("group", "vision")


def _move_a_lane(quotas: Any) -> None:
    """What the API does at submit with a quota store: read the user's lane in the pool at the
    run's priority, move it."""
    quotas.save_lane(quotas.lane("gpu", "alice", 50))


def _set_a_quota(quotas: Any) -> None:
    quotas.put(Quota(kind="user", name="alice", max_gpus=1000, updated_at=1.0))


def test_each_principal_may_do_what_it_does_with_quotas(template: dict[str, Any], aws_stack: Stack) -> None:
    """The requests the quota store really makes (recorded on moto) for what each principal does
    are all allowed by its statements, item by item: the workers hold and release, the reaper
    heals holds, the API manages quotas and shows their usage."""
    aws_stack.quotas.save_usage(aws_stack.quotas.usage("user", "bob"))  # something for the reaper to find
    for principal, use in (
        ("WorkerPolicy", _reserve_and_release),
        ("ReaperFunction", _heal),
        ("ApiFunction", _administer),
        ("ApiFunction", _move_a_lane),
        ("DispatcherFunction", _move_a_lane),  # a sweep's released member
    ):
        found = _quota_statements(template, principal)
        denied = [call for call in _quota_calls(aws_stack, use) if not _allows(found, *call)]
        assert denied == [], f"{principal} may not {denied}"


def test_only_the_api_writes_quotas_and_it_writes_no_usage(template: dict[str, Any], aws_stack: Stack) -> None:
    """A worker (or a run that got hold of its credentials) and the reaper may write usage records
    only, never a quota (which would lift their own limits); the API may write quotas only, never
    the usage the workers keep. Nobody else reaches the table."""
    set_quota = _quota_calls(aws_stack, _set_a_quota)
    assert {action for action, _ in set_quota} == {"dynamodb:PutItem"}
    hold_and_release = [c for c in _quota_calls(aws_stack, _reserve_and_release) if c[0] in QUOTA_WRITES]
    assert hold_and_release
    for principal in ("WorkerPolicy", "ReaperFunction"):
        found = _quota_statements(template, principal)
        assert not any(_allows(found, *call) for call in set_quota), f"{principal} may set a quota"
        assert not any(_allows(found, "dynamodb:DeleteItem", key) for _, key in set_quota), principal
    api = _quota_statements(template, "ApiFunction")
    assert not any(_allows(api, *call) for call in hold_and_release), "the API may write usage records"
    # a worker that wrote lanes could move its own runs to the front of the line
    lanes = [c for c in _quota_calls(aws_stack, _move_a_lane) if c[0] in QUOTA_WRITES]
    assert lanes
    assert all(key is not None and key.startswith(DynamoQuotaStore.LANE) for _, key in lanes)
    for principal in ("WorkerPolicy", "ReaperFunction"):
        found = _quota_statements(template, principal)
        assert not any(_allows(found, *call) for call in lanes), f"{principal} may move a lane"
    dispatcher = _quota_statements(template, "DispatcherFunction")
    assert not any(_allows(dispatcher, *call) for call in set_quota), "the dispatcher may set a quota"
    assert not any(_allows(dispatcher, *call) for call in hold_and_release), "the dispatcher may write usage"
    # every write on the table is limited to one kind of item
    for principal in ("WorkerPolicy", "ReaperFunction", "ApiFunction", "DispatcherFunction"):
        for statement in _quota_statements(template, principal):
            if set(as_list(statement["Action"])) & QUOTA_WRITES:
                assert "Condition" in statement, f"{principal}: {statement['Sid']} writes any item"


def test_the_quota_grants_are_no_more_than_each_principal_uses(template: dict[str, Any]) -> None:
    granted = {
        principal: _actions_on(_all_statements(template)[principal], "QuotasTable")
        for principal in ("WorkerPolicy", "ReaperFunction", "ApiFunction")
    }
    assert granted == {
        "WorkerPolicy": {"dynamodb:GetItem", "dynamodb:PutItem"},
        "ReaperFunction": {"dynamodb:GetItem", "dynamodb:Scan", "dynamodb:PutItem"},
        "ApiFunction": {"dynamodb:GetItem", "dynamodb:Scan", "dynamodb:PutItem", "dynamodb:DeleteItem"},
    }
    prefixes = {DynamoQuotaStore.QUOTA + "*", DynamoQuotaStore.USAGE + "*", DynamoQuotaStore.LANE + "*"}
    for principal in granted:
        for statement in _quota_statements(template, principal):
            for patterns in statement.get("Condition", {}).get("ForAllValues:StringLike", {}).values():
                assert set(as_list(patterns)) <= prefixes, f"{principal}: keys the store does not write"


def test_the_documented_worker_policy_is_the_templates(template: dict[str, Any]) -> None:
    readme = (BATCH / "README.md").read_text()
    document = json.loads(readme.split("## The worker (agent) policy", 1)[1].split("```json", 1)[1].split("```", 1)[0])
    declared = template["Resources"]["WorkerPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    documented = {s["Sid"]: s for s in document["Statement"]}
    assert declared
    assert set(documented) == {s["Sid"] for s in declared}
    for statement in declared:
        doc = documented[statement["Sid"]]
        assert set(as_list(doc["Action"])) == set(as_list(statement["Action"])), statement["Sid"]
        assert doc.get("Condition") == statement.get("Condition"), statement["Sid"]


# ---- IMDSv2, hop limit 1 --------------------------------------------------------------------


def _require_imdsv2(options: dict[str, Any]) -> None:
    assert options["HttpTokens"] == "required"
    assert options["HttpPutResponseHopLimit"] == 1
    assert options.get("HttpEndpoint", "enabled") == "enabled"


def test_batch_launch_template_requires_imdsv2_with_hop_limit_1() -> None:
    cfn = yaml.load((BATCH / "launch-template.yaml").read_text(), Loader=CfnLoader)
    (launch,) = [r for r in cfn["Resources"].values() if r["Type"] == "AWS::EC2::LaunchTemplate"]
    _require_imdsv2(launch["Properties"]["LaunchTemplateData"]["MetadataOptions"])


def test_launch_template_data_for_the_cli_is_valid_and_requires_imdsv2() -> None:
    data = json.loads((BATCH / "launch-template-data.json").read_text())
    _require_imdsv2(data["MetadataOptions"])
    model = botocore.session.get_session().get_service_model("ec2")
    shape = model.operation_model("CreateLaunchTemplate").input_shape.members["LaunchTemplateData"]
    report = ParamValidator().validate(data, shape)
    assert not report.has_errors(), report.generate_report()


def test_launch_template_passes_cfn_lint() -> None:
    lint = Path(sys.executable).parent / "cfn-lint"
    done = subprocess.run([str(lint), str(BATCH / "launch-template.yaml")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_worker_docs_and_user_data_require_imdsv2() -> None:
    batch_readme = (BATCH / "README.md").read_text()
    assert "(launch-template.yaml)" in batch_readme and "(launch-template-data.json)" in batch_readme
    ami_readme = (AMI / "README.md").read_text()
    assert "HttpTokens: required" in ami_readme and "HttpPutResponseHopLimit: 1" in ami_readme
    assert "../aws-batch/launch-template.yaml" in ami_readme
    user_data = (AMI / "user-data.yaml").read_text()
    assert "HttpPutResponseHopLimit 1" in user_data
    script = yaml.safe_load(user_data)["runcmd"][0][-1]
    # refuses IMDSv1 (a metadata answer without a token) before anything starts the agent
    guard = script.index("http://169.254.169.254/latest/meta-data/")
    assert guard < script.index("runplane-install") and guard < script.index("install.sh")
    assert "systemctl disable --now runplane-agent" in script
