"""template.yaml and the LocalStack hook: the AWS tools accept them, and they agree with the code.

The code is the reference: ``provision()`` (what the local stack creates), the queue-name helpers,
``StackSettings`` (what the functions read) and the Lambda entrypoints.
"""

from __future__ import annotations

import ast
import copy
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from runplane.adapters.aws.dynamodb import BY_OWNER, BY_QUEUE_STATE, DynamoWorkerRegistry
from runplane.adapters.aws.provision import MAX_RECEIVES, AwsNames, provision
from runplane.adapters.aws.sqs import events_queue_name, pool_queue_name
from runplane.domain.models import Worker
from runplane.settings import StackSettings

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
HOOK = ROOT / "localstack" / "init" / "ready.d" / "10-runplane.sh"
SAM_VENV = ROOT / ".venv-sam"
SAM = SAM_VENV / "bin" / "sam"
# Pool names with a character a logical id cannot hold, to exercise the &{Pool} expansion.
POOLS = ["default", "gpu-a100"]
TOOL_ENV = {**os.environ, "SAM_CLI_TELEMETRY": "0", "AWS_DEFAULT_REGION": "us-east-1"}


# ---- reading the template -------------------------------------------------------------------


class CfnLoader(yaml.SafeLoader):
    """YAML loader for CloudFormation: a short-form tag (``!Ref X``) becomes its long form."""


def _construct_tag(loader: CfnLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {"Ref" if suffix == "Ref" else f"Fn::{suffix}": value}


CfnLoader.add_multi_constructor("!", _construct_tag)


def load_template() -> dict[str, Any]:
    return yaml.load(TEMPLATE.read_text(), Loader=CfnLoader)


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


def defaults(template: dict[str, Any]) -> dict[str, str]:
    return {name: str(p.get("Default", "")) for name, p in template["Parameters"].items()}


def resolve(value: Any, params: dict[str, str]) -> Any:
    """Resolve what is known before deployment: Refs to parameters and Subs of parameters."""
    if isinstance(value, dict) and len(value) == 1:
        ((key, arg),) = value.items()
        if key == "Ref" and arg in params:
            return params[arg]
        if key == "Fn::Sub" and isinstance(arg, str):
            out = re.sub(r"\$\{([A-Za-z0-9]+)\}", lambda m: params.get(m.group(1), m.group(0)), arg)
            # What is known only at deployment (${AWS::AccountId}, resource names) stays a Sub.
            return out if "${" not in out else {key: out}
        if key == "Fn::GetAtt":
            return {key: [resolve(a, params) for a in arg]}
    if isinstance(value, dict):
        return {k: resolve(v, params) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, params) for v in value]
    return value


def _replace_identifier(value: Any, ident: str, item: str) -> Any:
    """What Fn::ForEach does to its fragment: ${ident} -> item, &{ident} -> item without symbols."""
    if isinstance(value, str):
        return value.replace(f"${{{ident}}}", item).replace(f"&{{{ident}}}", re.sub(r"[^0-9A-Za-z]", "", item))
    if isinstance(value, dict):
        return {_replace_identifier(k, ident, item): _replace_identifier(v, ident, item) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_identifier(v, ident, item) for v in value]
    return value


def expanded_resources(template: dict[str, Any], pools: list[str]) -> dict[str, Any]:
    """Resources with every Fn::ForEach over PoolNames expanded for ``pools`` and Subs resolved."""
    params = {**defaults(template), "PoolNames": ",".join(pools)}
    out: dict[str, Any] = {}
    for key, value in template["Resources"].items():
        if key.startswith("Fn::ForEach::"):
            ident, collection, fragment = value
            assert collection == {"Ref": "PoolNames"}, f"{key} should loop over the PoolNames parameter"
            for pool in pools:
                for logical_id, resource in _replace_identifier(copy.deepcopy(fragment), ident, pool).items():
                    assert logical_id not in out, f"duplicate logical id {logical_id}"
                    out[logical_id] = resolve(resource, params)
        else:
            out[key] = resolve(value, params)
    return out


def functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {
        k: v
        for k, v in template["Resources"].items()
        if isinstance(v, dict) and v.get("Type") == "AWS::Serverless::Function"
    }
    assert set(found) == {"ApiFunction", "DispatcherFunction", "ReaperFunction"}
    return found


# ---- what provision() creates, recorded from fake clients -------------------------------------


class _Waiter:
    def wait(self, **kwargs: Any) -> None:
        pass


class RecordingDynamo:
    def __init__(self) -> None:
        self.tables: dict[str, dict[str, Any]] = {}
        self.items: list[dict[str, Any]] = []

    def create_table(self, **kwargs: Any) -> None:
        self.tables[kwargs["TableName"]] = kwargs

    def get_waiter(self, name: str) -> _Waiter:
        return _Waiter()

    def put_item(self, **kwargs: Any) -> None:
        self.items.append(kwargs)


class RecordingSqs:
    def __init__(self) -> None:
        self.queues: dict[str, dict[str, str]] = {}

    def create_queue(self, QueueName: str, Attributes: dict[str, str]) -> dict[str, str]:
        self.queues[QueueName] = Attributes
        return {"QueueUrl": f"https://sqs.example/{QueueName}"}

    def get_queue_attributes(self, QueueUrl: str, AttributeNames: list[str]) -> dict[str, Any]:
        return {"Attributes": {"QueueArn": f"arn:aws:sqs:us-east-1:000000000000:{QueueUrl.rsplit('/', 1)[1]}"}}


class RecordingS3:
    def __init__(self) -> None:
        self.buckets: list[str] = []

    def create_bucket(self, **kwargs: Any) -> None:
        self.buckets.append(kwargs["Bucket"])


@pytest.fixture(scope="module")
def provisioned() -> tuple[AwsNames, RecordingDynamo, RecordingSqs]:
    names = AwsNames()
    ddb, sqs = RecordingDynamo(), RecordingSqs()
    provision(names, POOLS, ddb, sqs, RecordingS3())
    return names, ddb, sqs


def table_shape(props: dict[str, Any]) -> dict[str, Any]:
    """The parts of a table definition that the code depends on, order-insensitive where AWS is."""
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
        "BillingMode": props.get("BillingMode"),
    }


# ---- the AWS tools --------------------------------------------------------------------------


def run_tool(args: list[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, env=TOOL_ENV, capture_output=True, text=True, timeout=timeout, check=False)


def ensure_sam_venv() -> None:
    """A clean machine gets the SAM venv here (about a minute, once)."""
    if SAM.exists():
        return
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
@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--lint"], id="lint"),
        # The SAM transform itself, on the template with Fn::ForEach expanded locally.
        pytest.param(["--language-extensions"], id="transform"),
    ],
)
def test_sam_validate(args: list[str]) -> None:
    ensure_sam_venv()
    done = run_tool([str(SAM), "validate", "--template-file", str(TEMPLATE), *args])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "is a valid SAM Template" in done.stdout + done.stderr


# ---- the template agrees with the code ------------------------------------------------------


def test_tables_match_provision(template: dict[str, Any], provisioned: tuple[AwsNames, Any, Any]) -> None:
    names, ddb, _ = provisioned
    resources = expanded_resources(template, POOLS)
    pairs = {
        "RunsTable": names.runs_table,
        "WorkersTable": names.workers_table,
        "TokensTable": names.tokens_table,
        "PoolsTable": names.pools_table,
    }
    for logical_id, table_name in pairs.items():
        props = resources[logical_id]["Properties"]
        assert props["TableName"] == table_name
        assert table_shape(props) == table_shape(ddb.tables[table_name]), logical_id
    runs = resources["RunsTable"]["Properties"]
    assert {i["IndexName"] for i in runs["GlobalSecondaryIndexes"]} == {BY_OWNER, BY_QUEUE_STATE}
    assert runs["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}


def test_workers_ttl_is_the_attribute_the_registry_writes(template: dict[str, Any]) -> None:
    ttl = template["Resources"]["WorkersTable"]["Properties"]["TimeToLiveSpecification"]
    assert ttl["Enabled"] is True
    ddb = RecordingDynamo()
    worker = Worker(id="w-1", pool="default", started_at=1.0, heartbeat_at=1.0)
    DynamoWorkerRegistry("runplane-workers", ddb).put(worker)
    (item,) = ddb.items
    assert ttl["AttributeName"] in item["Item"]
    assert int(item["Item"][ttl["AttributeName"]]["N"]) > 0


def _queue_by_name(resources: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        r["Properties"]["QueueName"]: (logical_id, r["Properties"])
        for logical_id, r in resources.items()
        if r.get("Type") == "AWS::SQS::Queue"
    }


def test_queues_match_provision(template: dict[str, Any], provisioned: tuple[AwsNames, Any, Any]) -> None:
    names, _, sqs = provisioned
    queues = _queue_by_name(expanded_resources(template, POOLS))
    assert set(queues) == set(sqs.queues), "the template and provision() create different queues"
    wanted = [pool_queue_name(names.prefix, pool) for pool in POOLS] + [events_queue_name(names.prefix)]
    for name in wanted:
        _, props = queues[name]
        reference = sqs.queues[name]
        assert str(props["MessageRetentionPeriod"]) == reference["MessageRetentionPeriod"]
        redrive = props["RedrivePolicy"]
        assert (
            int(redrive["maxReceiveCount"])
            == MAX_RECEIVES
            == int(json.loads(reference["RedrivePolicy"])["maxReceiveCount"])
        )
        dlq_logical_id, attribute = redrive["deadLetterTargetArn"]["Fn::GetAtt"]
        assert attribute == "Arn"
        dlq_id, dlq_props = queues[f"{name}-dlq"]
        assert dlq_logical_id == dlq_id, f"{name} redrives to {dlq_logical_id}, not to its own dead-letter queue"
        assert str(dlq_props["MessageRetentionPeriod"]) == sqs.queues[f"{name}-dlq"]["MessageRetentionPeriod"]
    for pool in POOLS:
        _, props = queues[pool_queue_name(names.prefix, pool)]
        assert str(props["VisibilityTimeout"]) == sqs.queues[pool_queue_name(names.prefix, pool)]["VisibilityTimeout"]


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
    needed = {"prefix", "runs_table", "workers_table", "tokens_table", "bucket", "pools"}
    assert {prefix + f.upper() for f in needed} <= set(template["Globals"]["Function"]["Environment"]["Variables"])
    # And the settings really read them: every variable lands in its field.
    environ = {name: f"from-{name.lower()}" for name in runplane_vars}
    settings = StackSettings.from_env(environ)
    for name, value in environ.items():
        assert getattr(settings, name[len(prefix) :].lower()) == value, name


def test_functions_get_the_names_of_the_resources(template: dict[str, Any]) -> None:
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["RUNPLANE_RUNS_TABLE"] == {"Ref": "RunsTable"}
    assert variables["RUNPLANE_WORKERS_TABLE"] == {"Ref": "WorkersTable"}
    assert variables["RUNPLANE_TOKENS_TABLE"] == {"Ref": "TokensTable"}
    assert variables["RUNPLANE_POOLS_TABLE"] == {"Ref": "PoolsTable"}
    assert variables["RUNPLANE_BUCKET"] == {"Ref": "DataBucket"}
    assert variables["RUNPLANE_PREFIX"] == {"Ref": "Prefix"}
    assert variables["RUNPLANE_POOLS"] == {"Ref": "PoolsJson"}


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
    assert {"ApiUrl", "RunsTable", "Bucket", "EventsQueueUrl"} <= set(template["Outputs"])


# ---- the LocalStack hook --------------------------------------------------------------------


def test_hook_creates_the_same_names_and_indexes(provisioned: tuple[AwsNames, Any, Any]) -> None:
    text = HOOK.read_text()
    for suffix in ("runs", "workers", "tokens", "data"):
        assert f"$prefix-{suffix}" in text
    assert '"$prefix-pool-$pool"' in text
    assert '"$prefix-events"' in text
    assert '"$name-dlq"' in text
    assert f"max_receives={MAX_RECEIVES}" in text
    match = re.search(r"--global-secondary-indexes '(.*?)'", text, re.DOTALL)
    assert match, "the hook creates no global secondary indexes"
    names, ddb, _ = provisioned
    assert (
        sorted(json.loads(match.group(1)), key=lambda i: i["IndexName"])
        == table_shape(ddb.tables[names.runs_table])["GlobalSecondaryIndexes"]
    )
    for key in (
        "AttributeName=id,KeyType=HASH",
        "AttributeName=token_hash,KeyType=HASH",
        "AttributeName=created_at,AttributeType=N",
        "AttributeName=qs,AttributeType=S",
        "AttributeName=owner,AttributeType=S",
    ):
        assert key in text


def _describe(ddb: Any, table: str) -> dict[str, Any]:
    return table_shape(ddb.describe_table(TableName=table)["Table"] | {"BillingMode": None})


def _queue_attributes(sqs: Any, name: str) -> dict[str, Any]:
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    redrive = json.loads(attrs.get("RedrivePolicy", "{}"))
    return {
        "MessageRetentionPeriod": attrs["MessageRetentionPeriod"],
        "VisibilityTimeout": attrs["VisibilityTimeout"],
        "maxReceiveCount": str(redrive.get("maxReceiveCount", "")),
        "dlq": redrive.get("deadLetterTargetArn", "").rsplit(":", 1)[-1],
    }


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("aws") is None, reason="needs the aws CLI to stand in for awslocal")
def test_hook_on_moto_creates_what_provision_creates(moto_endpoint: str, tmp_path: Path) -> None:
    """Run the hook (twice: it is idempotent) against moto's server, compare with provision()."""
    shim = tmp_path / "awslocal"
    shim.write_text(f'#!/bin/sh\nexec aws --endpoint-url {moto_endpoint} "$@"\n')
    shim.chmod(0o755)
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
    for _ in range(2):
        done = subprocess.run(["bash", str(HOOK)], env=env, capture_output=True, text=True, timeout=240, check=False)
        assert done.returncode == 0, done.stdout + done.stderr

    session = boto3.session.Session(aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1")
    ddb, sqs, s3 = (session.client(s, endpoint_url=moto_endpoint) for s in ("dynamodb", "sqs", "s3"))
    provision(ref, POOLS, ddb, sqs, s3)
    for attr in ("runs_table", "workers_table", "tokens_table"):
        assert _describe(ddb, getattr(hook, attr)) == _describe(ddb, getattr(ref, attr)), attr
    ttl = ddb.describe_time_to_live(TableName=hook.workers_table)["TimeToLiveDescription"]
    assert ttl["AttributeName"] == "expires_at"
    pairs = [(pool_queue_name(hook.prefix, p), pool_queue_name(ref.prefix, p)) for p in POOLS]
    pairs.append((events_queue_name(hook.prefix), events_queue_name(ref.prefix)))
    for hook_queue, ref_queue in pairs:
        got, want = _queue_attributes(sqs, hook_queue), _queue_attributes(sqs, ref_queue)
        assert got["dlq"] == f"{hook_queue}-dlq"
        assert got | {"dlq": ""} == want | {"dlq": ""}
        assert int(got["maxReceiveCount"]) == MAX_RECEIVES
    s3.head_bucket(Bucket=hook.bucket)


@pytest.mark.sam
@pytest.mark.slow
def test_sam_build_packages_the_functions_and_nothing_else(tmp_path: Path) -> None:
    """`sam build` (makefile build method) gives each function its code and Lambda dependencies,
    small enough for Lambda, importable with nothing else on the path."""
    ensure_sam_venv()
    out = tmp_path / "build"
    done = run_tool(
        [str(SAM), "build", "--language-extensions", "--build-in-source", "--build-dir", str(out)], timeout=600
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
