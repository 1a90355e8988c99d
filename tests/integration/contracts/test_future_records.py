"""Records a later release wrote, with fields this release does not know at every depth (a run, its
spec, resources and timeline; a worker; a run hint and a dispatcher event on the queues), are read by
every reader of this release, and what this release writes back of them keeps those fields. An agent
takes no run whose spec holds a field it does not know (it would run it as if the field were not
there), and the run's waiting explanation says so; fields outside the spec do not stop it."""

import base64
import json
import time
from types import SimpleNamespace

from azure.data.tables import UpdateMode

from runplane import __version__
from runplane.adapters.azure.run_rows import partition
from runplane.adapters.azure.tables import key, pack, unpack
from runplane.domain.messages import RunMessage
from runplane.domain.runs import Event, Run, RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.domain.workers import Worker
from runplane.handlers import PoolDispatcher
from runplane.services import lifecycle
from runplane.services.overview import why_waiting
from runplane.services.runs import kill_run
from worker_agent.agent import Agent
from worker_agent.run_config import AgentConfig, AgentPorts


def _aws(stack):
    return stack.settings.cloud != "azure"


def _run_entities(stack, run_id, queue):
    """The entities that hold a run of ``queue`` in Table storage: the run and its copies."""
    store = stack.store
    found = store.table.query_entities("PartitionKey eq @pk", parameters={"pk": partition(queue)})
    return [e for e in found if "n" in e and unpack(e)["id"] == run_id]


def raw_run(stack, run_id, queue="default"):
    """A run's record as the store holds it, as JSON data (Azure: each copy of it the same)."""
    store = stack.store
    if stack.settings.cloud == "local":
        return json.loads(store.db.connection().execute("SELECT data FROM runs WHERE id = ?", (run_id,)).fetchone()[0])
    if _aws(stack):
        item = store.client.get_item(TableName=store.table, Key={"id": {"S": run_id}}, ConsistentRead=True)["Item"]
        return _plain(item)
    docs = [unpack(e) for e in _run_entities(stack, run_id, queue)]
    assert len(docs) >= 2 and all(d == docs[0] for d in docs)
    return docs[0]


def _plain(value):
    """A DynamoDB attribute value (or item) as JSON data."""
    if isinstance(value, dict) and len(value) == 1:
        [(kind, inner)] = value.items()
        if kind == "M":
            return {k: _plain(v) for k, v in inner.items()}
        if kind == "L":
            return [_plain(v) for v in inner]
        if kind == "S":
            return inner
        if kind == "N":
            return json.loads(inner)
        if kind == "BOOL":
            return inner
        if kind == "NULL":
            return None
    return {k: _plain(v) for k, v in value.items()}


def _dynamo(value):
    if isinstance(value, dict):
        return {"M": {k: _dynamo(v) for k, v in value.items()}}
    if isinstance(value, list):
        return {"L": [_dynamo(v) for v in value]}
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, int | float):
        return {"N": json.dumps(value)}
    if value is None:
        return {"NULL": True}
    return {"S": value}


def add_to_run(stack, run_id, later, queue="default"):
    """Rewrite a stored run past this release's model: ``later`` changes its record (Azure: each
    copy of it) as a later release might."""
    store = stack.store
    if stack.settings.cloud == "local":
        with store.db.write() as c:
            data = json.loads(c.execute("SELECT data FROM runs WHERE id = ?", (run_id,)).fetchone()[0])
            later(data)
            c.execute("UPDATE runs SET data = ? WHERE id = ?", (json.dumps(data), run_id))
        return
    if _aws(stack):
        item = store.client.get_item(TableName=store.table, Key={"id": {"S": run_id}}, ConsistentRead=True)["Item"]
        data = _plain(item)
        later(data)
        store.client.put_item(TableName=store.table, Item={k: _dynamo(v) for k, v in data.items()})
        return
    for entity in _run_entities(stack, run_id, queue):
        data = unpack(entity)
        later(data)
        store.table.update_entity({**dict(entity), **pack(data, run_id)}, mode=UpdateMode.REPLACE)


def outside_the_spec(data):
    """What a later release adds that only its control plane uses: no agent needs to know it."""
    data["priority_class"] = "gold"
    data["events"][0]["by"] = "api"
    data["usage"]["energy_joules"] = 7


def in_the_spec(data):
    """What a later release adds to what a run asks of its agent: an agent that does not know it
    must not run it as if it were not there."""
    data["spec"]["volumes"] = ["db-password"]
    data["spec"]["resources"]["nodes"] = 2


def _later_run(stack, run_id, later):
    submitted = Event(at=1.0, state=RunState.QUEUED, message="submitted")
    run = Run(id=run_id, owner="alice", spec=RunSpec(command="true"), queue="default", created_at=1.0)
    stack.store.create(run.model_copy(update={"events": [submitted]}))
    add_to_run(stack, run.id, later)
    return run


def _agent(stack, tmp_path):
    config = AgentConfig(pool="default", worker_id="w-1", work_dir=tmp_path / "w-1")
    ports = AgentPorts(stack.store, stack.queue, stack.objects)
    return Agent(config, ports, stack.workers, docker_client=None, clock=time.time)


def test_a_run_a_later_release_wrote_outside_its_spec_is_read_listed_claimed_and_kept_whole(stack, tmp_path):
    run = _later_run(stack, "r-future", outside_the_spec)

    read = stack.store.get(run.id)
    assert (read.id, read.spec.command, read.state) == (run.id, "true", RunState.QUEUED)
    assert [r.id for r in stack.store.list(owner="alice", limit=10).runs] == [run.id]
    assert [r.id for r in stack.store.list(queue="default", state=RunState.QUEUED, limit=10).runs] == [run.id]
    assert _agent(stack, tmp_path).intake.refuses(read) is None  # the control plane's own fields: taken

    claimed = lifecycle.claim(stack.store, read, read.attempt, "w-1", 60.0, 1000.0)
    assert (claimed.state, claimed.worker_id) == (RunState.PREPARING, "w-1")
    kept = raw_run(stack, run.id)
    assert kept["state"] == "preparing"
    assert kept["priority_class"] == "gold"
    assert kept["events"][0]["by"] == "api"
    assert kept["usage"]["energy_joules"] == 7
    assert len(kept["events"]) == 2


def test_a_run_a_later_release_wrote_into_its_spec_is_read_and_listed_but_not_taken(stack, tmp_path):
    run = _later_run(stack, "r-future", lambda data: (outside_the_spec(data), in_the_spec(data)))
    read = stack.store.get(run.id)
    assert (read.id, read.spec.command, read.state) == (run.id, "true", RunState.QUEUED)
    assert [r.id for r in stack.store.list(owner="alice", limit=10).runs] == [run.id]
    agent = _agent(stack, tmp_path)
    assert agent.intake.refuses(read) == (
        f"it needs an agent that knows spec.volumes, spec.resources.nodes (this agent is {__version__})"
    )

    stack.queue.send("default", RunMessage(run_id=run.id, attempt=0))
    (delivery,) = stack.queue.receive("default", 1, 5, visibility_seconds=30)
    agent.intake.take(delivery)  # its hint goes back, for an agent that knows it
    assert agent.slots.claimed == 0 and agent.slots.active == {}
    kept = raw_run(stack, run.id)
    assert (kept["state"], kept.get("worker_id"), kept["spec"]["volumes"]) == ("queued", None, ["db-password"])
    assert kept["spec"]["resources"]["nodes"] == 2

    now = time.time()
    stack.workers.put(Worker(id="w-1", pool="default", agent_version=__version__, started_at=now, heartbeat_at=now))
    assert why_waiting(stack.ports, read) == (
        f"needs an agent that knows spec.volumes, spec.resources.nodes; the agents of pool default are {__version__}"
    )
    assert kill_run(stack.ports, Principal(user="alice"), run.id).state == RunState.KILLED  # ended as any run is
    assert raw_run(stack, run.id)["spec"]["volumes"] == ["db-password"]


def add_to_worker(stack, worker_id, later):
    """Rewrite a worker's record past this release's model."""
    workers = stack.workers
    if stack.settings.cloud == "local":
        with workers.db.write() as c:
            doc = json.loads(c.execute("SELECT data FROM workers WHERE id = ?", (worker_id,)).fetchone()[0])
            later(doc)
            c.execute("UPDATE workers SET data = ? WHERE id = ?", (json.dumps(doc), worker_id))
        return
    if _aws(stack):
        item = workers.client.get_item(TableName=workers.table, Key={"id": {"S": worker_id}})["Item"]
        doc = json.loads(item["doc"]["S"])
        later(doc)
        workers.client.put_item(TableName=workers.table, Item={**item, "doc": {"S": json.dumps(doc)}})
        return
    entity = workers.table.get_entity(workers.PARTITION, key(worker_id))
    doc = unpack(entity)
    later(doc)
    workers.table.update_entity({**dict(entity), **pack(doc, worker_id)}, mode=UpdateMode.REPLACE)


def raw_worker(stack, worker_id):
    workers = stack.workers
    if stack.settings.cloud == "local":
        return json.loads(
            workers.db.connection().execute("SELECT data FROM workers WHERE id = ?", (worker_id,)).fetchone()[0]
        )
    if _aws(stack):
        return json.loads(
            workers.client.get_item(TableName=workers.table, Key={"id": {"S": worker_id}})["Item"]["doc"]["S"]
        )
    return unpack(workers.table.get_entity(workers.PARTITION, key(worker_id)))


def test_a_worker_a_later_agent_recorded_is_read_and_kept_whole(stack):
    stack.workers.put(Worker(id="w-future", pool="default", started_at=1.0, heartbeat_at=2.0))
    add_to_worker(stack, "w-future", lambda doc: doc.update(numa={"nodes": 2}, accelerator="h200"))

    assert stack.workers.get("w-future").pool == "default"
    assert [w.id for w in stack.workers.list(pool="default")] == ["w-future"]
    assert [w.id for w in stack.workers.list()] == ["w-future"]

    stack.workers.put(stack.workers.get("w-future").model_copy(update={"heartbeat_at": 3.0}))
    kept = raw_worker(stack, "w-future")
    assert (kept["heartbeat_at"], kept["numa"], kept["accelerator"]) == (3.0, {"nodes": 2}, "h200")


def test_queue_messages_a_later_release_sent_are_read(stack, send_raw):
    hint = json.dumps({"v": 1, "run_id": "r-future", "attempt": 0, "trace": "t-1"})
    send_raw("default", hint if _aws(stack) else base64.b64encode(hint.encode()).decode())
    [delivery] = stack.queue.receive("default", 10, 2, 30)
    assert (delivery.message.run_id, delivery.message.attempt) == ("r-future", 0)

    run = Run(id="r-ended", owner="alice", spec=RunSpec(command="true"), queue="default", created_at=1.0)
    stack.store.create(run)
    event = {
        "v": 1,
        "pool": "default",
        "reason": "run ended",
        "upstream": run.id,
        "region": "eu",
        "ended": {"state": "succeeded", "to_running": 1.0, "exit_signal": None, "node": "n1"},
    }
    handle = PoolDispatcher(stack.ports).record_handler()
    assert handle(SimpleNamespace(body=json.dumps(event))) is not None  # read, and its pool dispatched
