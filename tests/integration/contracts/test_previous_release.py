"""Two releases side by side on one stack: the previous release's dispatcher and API read the pool
records and dispatcher events this one writes (its models, copied below, refuse any field they do
not know), and this one reads records with fields it does not know, or with a schedule mark it cannot
use, without its scheduled passes failing on them."""

import base64
import json

from pydantic import BaseModel, ConfigDict, Field

from runplane.adapters.aws.sqs import events_queue_name as sqs_events_queue
from runplane.adapters.azure.queues import events_queue_name as storage_events_queue
from runplane.adapters.azure.run_rows import partition
from runplane.adapters.azure.tables import key, pack, unpack
from runplane.domain.expect import Expect
from runplane.domain.messages import DispatchEvent, RunEnd
from runplane.domain.runs import Failure, Run, RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.domain.workers import PoolRecord
from runplane.handlers import SCHEDULE_RECORD, PoolDispatcher


class PreviousRunEnd(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state: str
    reason: str | None = None
    to_running: float | None = Field(default=None, ge=0)


class PreviousDispatchEvent(BaseModel):
    """The previous release's DispatchEvent, as it was."""

    model_config = ConfigDict(extra="forbid")

    v: int = 1
    pool: str
    reason: str = "submitted"
    sweep: str | None = None
    upstream: str | None = None
    ended: PreviousRunEnd | None = None


class PreviousStartingJob(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker_id: str
    launched_at: float
    running_since: float | None = None


class PreviousPoolRecord(BaseModel):
    """The previous release's PoolRecord, as it was."""

    model_config = ConfigDict(extra="forbid")

    v: int = 1
    pool: str
    version: int = 0
    launching_since: float | None = None
    last_launch_at: float | None = None
    launched: int = 0
    failed_launches: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    disabled_reason: str | None = None
    disabled_at: float | None = None
    starting: dict[str, PreviousStartingJob] = Field(default_factory=dict)
    last_decision: str | None = None
    decided_at: float | None = None
    backlog: int | None = None
    workers: dict[str, int] = Field(default_factory=dict)
    counted_at: float | None = None


def _aws(stack):
    return stack.settings.cloud != "azure"


def stored_record(stack, pool):
    """A pool record's document as the store holds it."""
    states = stack.pool_states
    if stack.settings.cloud == "local":
        return json.loads(
            states.db.connection().execute("SELECT data FROM pool_states WHERE pool = ?", (pool,)).fetchone()[0]
        )
    if _aws(stack):
        item = states.client.get_item(TableName=states.table, Key={"pool": {"S": pool}}, ConsistentRead=True)
        return json.loads(item["Item"]["doc"]["S"])
    return unpack(states.table.get_entity(states.PARTITION, key(pool)))


def store_raw_record(stack, pool, doc):
    """A pool record written past this release's model, as another release might write it."""
    states = stack.pool_states
    if stack.settings.cloud == "local":
        with states.db.write() as c:
            row = (pool, doc["version"], json.dumps(doc))
            c.execute("INSERT INTO pool_states (pool, version, data) VALUES (?, ?, ?)", row)
    elif _aws(stack):
        item = {"pool": {"S": pool}, "version": {"N": str(doc["version"])}, "doc": {"S": json.dumps(doc)}}
        states.client.put_item(TableName=states.table, Item=item)
    else:
        entity = {"PartitionKey": states.PARTITION, "RowKey": key(pool), "version": doc["version"]}
        states.table.create_entity({**entity, **pack(doc, pool)})


def sent_events(stack):
    """The bodies of the dispatcher events on the stack's events queue."""
    queue, prefix = stack.queue, stack.settings.prefix
    if stack.settings.cloud == "local":
        return [e.body for e in queue.receive_events(32, 0, 0)]  # visible again at once, as peeked
    if _aws(stack):
        url = queue._url(sqs_events_queue(prefix))
        got = queue.client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        return [m["Body"] for m in got.get("Messages", [])]
    peeked = queue.client.get_queue_client(storage_events_queue(prefix)).peek_messages(max_messages=32)
    return [base64.b64decode(m.content).decode() for m in peeked]


def test_the_previous_release_reads_the_events_this_one_sends(stack):
    ended = RunEnd(state=RunState.SUCCEEDED, to_running=2.0)
    stack.queue.notify(DispatchEvent(pool="default", reason="submitted"))
    stack.queue.notify(DispatchEvent(pool="default", reason="run ended", upstream="r-1", ended=ended))
    stack.queue.notify(DispatchEvent(pool="default", reason="sweep released members", sweep="s-1"))
    bodies = sent_events(stack)
    assert len(bodies) == 3
    read = sorted((PreviousDispatchEvent.model_validate_json(b) for b in bodies), key=lambda e: e.reason)
    assert [(e.reason, e.upstream, e.sweep) for e in read] == [
        ("run ended", "r-1", None),
        ("submitted", None, None),
        ("sweep released members", None, "s-1"),
    ]
    # what only this release uses is still carried when set, and read back by this release
    stack.queue.notify(DispatchEvent(pool="default", reason="dependents continue", upstream="r-1", skip=40))
    [more] = [DispatchEvent.model_validate_json(b) for b in sent_events(stack) if "continue" in b]
    assert more.skip == 40


def test_the_previous_release_reads_the_pool_records_this_one_writes(stack):
    stack.pool_states.save(PoolRecord(pool="gpu", backlog=3, workers={"idle": 1}))
    PoolDispatcher(stack.ports).pool("default")  # a dispatch's own write of its pool's record
    for pool in ("default", "gpu"):
        assert PreviousPoolRecord.model_validate(stored_record(stack, pool)).pool == pool
    assert PreviousPoolRecord.model_validate(stored_record(stack, "gpu")).backlog == 3


def test_this_release_reads_records_with_fields_it_does_not_know(stack):
    later = {"v": 1, "pool": "default", "version": 4, "backlog": 2, "starting": {}, "placement": {"zone": "b"}}
    later["starting"] = {"job-1": {"worker_id": "w-1", "launched_at": 1.0, "region": "x"}}
    store_raw_record(stack, "default", later)
    record = stack.pool_states.get("default")
    assert (record.version, record.backlog, record.starting["job-1"].worker_id) == (4, 2, "w-1")
    assert stack.pool_states.save(record).version == 5


def test_a_schedule_mark_it_cannot_use_does_not_stop_the_passes(stack):
    store_raw_record(stack, SCHEDULE_RECORD, {"pool": SCHEDULE_RECORD, "version": 1, "resume": {"sweeps_after": 7}})
    done = PoolDispatcher(stack.ports).schedule()
    assert set(done["pools"]) == {p.name for p in stack.pools.pools}
    assert "error" not in done["waiting"] and "error" not in done["sweeps"]
    assert stack.pool_states.get(SCHEDULE_RECORD).resume == {"sweeps_turn": "1"}  # the bad mark is gone


def store_failure_reason(stack, run_id, reason):
    """Rewrite a stored run's failure reason past this release's model, as a later release might."""
    store = stack.store
    if stack.settings.cloud == "local":
        with store.db.write() as c:
            data = json.loads(c.execute("SELECT data FROM runs WHERE id = ?", (run_id,)).fetchone()[0])
            data["failure"]["reason"] = reason
            c.execute("UPDATE runs SET data = ? WHERE id = ?", (json.dumps(data), run_id))
    elif _aws(stack):
        item = store.client.get_item(TableName=store.table, Key={"id": {"S": run_id}}, ConsistentRead=True)["Item"]
        item["failure"]["M"]["reason"] = {"S": reason}
        store.client.put_item(TableName=store.table, Item=item)
    else:
        run = store.get(run_id)
        entity = store.table.get_entity(partition(run.queue), f"run:{key(run_id)}")
        doc = unpack(entity)
        doc["failure"]["reason"] = reason
        store.table.update_entity({**dict(entity), **pack(doc, run_id)})


def test_this_release_reads_a_failure_reason_a_later_release_added(stack):
    """A run ended by a later release with a reason this one does not know is still read, listed
    and shown (as agent_error, the later reason named in its message), and so is its end event."""
    run = Run(id="r-later", owner="alice", spec=RunSpec(command="true"), queue="default", created_at=1.0)
    stack.store.create(run)
    failure = Failure(reason=FailureReason.AGENT_ERROR, message="the GPU melted")
    stack.store.update(run, Expect(states=frozenset({RunState.QUEUED})), {"state": RunState.FAILED, "failure": failure})
    store_failure_reason(stack, run.id, "gpu_melted")

    read = stack.store.get(run.id)
    assert read.failure == Failure(reason=FailureReason.AGENT_ERROR, message="gpu_melted: the GPU melted")
    assert [r.id for r in stack.store.list(owner="alice", state=RunState.FAILED, limit=10).runs] == [run.id]
    ended = {"v": 1, "pool": "default", "upstream": run.id, "ended": {"state": "failed", "reason": "gpu_melted"}}
    assert DispatchEvent.model_validate_json(json.dumps(ended)).ended == RunEnd(
        state=RunState.FAILED, reason=FailureReason.AGENT_ERROR
    )
