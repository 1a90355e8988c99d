"""Retention on the AWS stores, past what the contract suite sees through the port: the attributes
the runs table keeps for it (``pq``/``pd``, the keys of the sparse index ``by_purge``, and the TTL
attribute ``ttl``), a sweep's write from a copy read before the owner kept the run, and the index and
TTL given to a runs table made before them.

moto does not expire items: these tests prove the TTL attribute and the table's TTL setting are
right, not that DynamoDB deletes the item (that is DynamoDB's own doing)."""

import uuid

import boto3
import pytest

from runplane.adapters.aws import resources
from runplane.adapters.aws.dynamodb import BY_OWNER, BY_PURGE, BY_QUEUE_STATE, BY_RANK, PURGE_DUE, PURGE_QUEUE
from runplane.adapters.aws.provision import AwsNames, provision
from runplane.domain.errors import ConditionFailed
from runplane.domain.expect import Expect
from runplane.domain.retention import TTL_GRACE_SECONDS, RunRetention, ttl_at
from runplane.domain.runs import Event, Run, RunSpec
from runplane.domain.states import RunState

TTL = resources.RUNS_TTL_ATTRIBUTE
DATES = RunRetention(checked_at=5100.0, outputs_at=7000.0, logs_at=8000.0, record_at=9000.0)


def _finished(stack, i=0):
    run = Run(
        id=f"r-ttl-{uuid.uuid4().hex[:8]}-{i}",
        owner="alice",
        queue="default",
        spec=RunSpec(command="echo"),
        created_at=1000.0,
        events=[Event(at=1000.0, state=RunState.QUEUED, message="submitted")],
    )
    run = stack.store.create(run)
    running = stack.store.update(run, Expect(), {"state": RunState.RUNNING, "attempt": 1, "worker_id": "w1"})
    return stack.store.update(running, Expect(), {"state": RunState.SUCCEEDED, "finished_at": 5000.0})


def _item(stack, run_id):
    return stack.store.client.get_item(TableName=stack.store.table, Key={"id": {"S": run_id}}, ConsistentRead=True)[
        "Item"
    ]


def test_a_dated_run_carries_its_ttl_and_a_kept_one_none(aws_stack):
    """The table's TTL is on ``ttl``; a run the sweep dated carries ``ttl_at`` (its record's date and
    some days' grace) and its index keys; kept, it carries neither; let go, both again."""
    described = aws_stack.store.client.describe_time_to_live(TableName=aws_stack.store.table)
    assert described["TimeToLiveDescription"] == {"TimeToLiveStatus": "ENABLED", "AttributeName": TTL}
    run = _finished(aws_stack)
    item = _item(aws_stack, run.id)
    assert TTL not in item  # not dated yet: the sweep's dates decide the record's
    assert (item[PURGE_QUEUE]["S"], float(item[PURGE_DUE]["N"])) == ("default", 5000.0)
    dated = aws_stack.store.update(run, Expect(), {"retention": DATES})
    item = _item(aws_stack, run.id)
    assert int(item[TTL]["N"]) == ttl_at(dated) == int(9000 + TTL_GRACE_SECONDS)
    assert float(item[PURGE_DUE]["N"]) == 7000.0
    kept = aws_stack.store.update(dated, Expect(), {"kept": True})
    item = _item(aws_stack, run.id)
    assert TTL not in item and PURGE_QUEUE not in item and PURGE_DUE not in item
    aws_stack.store.update(kept, Expect(), {"kept": False})
    assert int(_item(aws_stack, run.id)[TTL]["N"]) == ttl_at(dated)
    assert aws_stack.store.get(run.id) == dated  # the store's attributes never reach the run


def test_a_sweep_writing_from_a_copy_read_before_the_pin_leaves_the_run_kept(aws_stack):
    """The sweep read the run, its owner kept it, then the sweep wrote its dates from the older copy:
    the dates are written, but the kept run gets no TTL and stays out of the index."""
    stale = _finished(aws_stack)
    aws_stack.store.update(aws_stack.store.get(stale.id), Expect(), {"kept": True})
    written = aws_stack.store.update(stale, Expect(states=frozenset({RunState.SUCCEEDED})), {"retention": DATES})
    assert written.kept and written.retention == DATES
    item = _item(aws_stack, stale.id)
    assert TTL not in item and PURGE_DUE not in item
    assert aws_stack.store.due("default", 1e10) == []


def test_a_run_an_older_release_retried_is_neither_due_nor_deleted(aws_stack):
    """A release before retention retries a run without removing its index keys: the run is not
    due, and its record is not deleted, until it ends again."""
    run = _finished(aws_stack)
    aws_stack.store.client.update_item(  # what such a release writes: state and end, nothing of the index
        TableName=aws_stack.store.table,
        Key={"id": {"S": run.id}},
        UpdateExpression="SET #state = :queued, #fin = :none",
        ExpressionAttributeNames={"#state": "state", "#fin": "finished_at"},
        ExpressionAttributeValues={":queued": {"S": str(RunState.QUEUED)}, ":none": {"NULL": True}},
    )
    assert PURGE_DUE in _item(aws_stack, run.id)
    assert aws_stack.store.due("default", 1e10) == []
    with pytest.raises(ConditionFailed):
        aws_stack.store.delete(run.id, 1e10)
    assert aws_stack.store.get(run.id).state == RunState.QUEUED


def test_provision_gives_a_runs_table_made_before_retention_its_index_and_ttl(moto_endpoint):
    """A runs table of an earlier release (no by_purge, no TTL) gets both from provision(), which
    stays idempotent on the upgraded table."""
    names = AwsNames(prefix=f"up{uuid.uuid4().hex[:8]}")
    session = boto3.session.Session(aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1")
    ddb, sqs, s3 = (session.client(s, endpoint_url=moto_endpoint) for s in ("dynamodb", "sqs", "s3"))

    def index(name, hash_key, range_key):
        keys = [{"AttributeName": hash_key, "KeyType": "HASH"}, {"AttributeName": range_key, "KeyType": "RANGE"}]
        return {"IndexName": name, "KeySchema": keys, "Projection": {"ProjectionType": "ALL"}}

    ddb.create_table(
        TableName=names.runs_table,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[
            {"AttributeName": a, "AttributeType": t}
            for a, t in {"id": "S", "owner": "S", "qs": "S", "created_at": "N", "rank": "S"}.items()
        ],
        GlobalSecondaryIndexes=[
            index(BY_OWNER, "owner", "created_at"),
            index(BY_QUEUE_STATE, "qs", "created_at"),
            index(BY_RANK, "qs", "rank"),
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    for _ in range(2):
        provision(names, ["default"], ddb, sqs, s3)
        table = ddb.describe_table(TableName=names.runs_table)["Table"]
        (purge,) = [i for i in table["GlobalSecondaryIndexes"] if i["IndexName"] == BY_PURGE]
        assert [k["AttributeName"] for k in purge["KeySchema"]] == [PURGE_QUEUE, PURGE_DUE]
        ttl = ddb.describe_time_to_live(TableName=names.runs_table)["TimeToLiveDescription"]
        assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", TTL)
