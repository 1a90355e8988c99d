"""What the Azure adapters add beyond the port contracts (tests/integration/contracts), on Azurite:
the runs table's layout (its retention index included) and its repair paths, ETag races made
deterministic, large runs, the queue's polling, encoding and names, SAS URLs, and how settings build
an Azure stack."""

import base64
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest
import requests
from azure.core.credentials import AccessToken
from azure.core.exceptions import ServiceRequestError
from azure.core.pipeline.transport import HttpTransport, RequestsTransportResponse
from azure.storage.blob import BlobServiceClient

from runplane.adapters.azure.blob import BlobObjectStore
from runplane.adapters.azure.clients import connect
from runplane.adapters.azure.provision import AzureNames, deprovision, provision, table_name
from runplane.adapters.azure.queues import (
    StorageQueueRunQueue,
    events_queue_name,
    poison_queue_name,
    pool_queue_name,
    queue_name,
)
from runplane.adapters.azure.runs import TableRunStore
from runplane.adapters.azure.tables import MAX_RUN_CHARS, key, newest_first
from runplane.adapters.azure.workers import TableWorkerRegistry
from runplane.bootstrap import azure_clients, azure_names, build_stack
from runplane.domain.errors import (
    AlreadyExists,
    BackendError,
    ConditionFailed,
    Conflict,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
)
from runplane.domain.expect import Expect
from runplane.domain.messages import DispatchEvent, RunMessage
from runplane.domain.retention import RunRetention
from runplane.domain.runs import Event, Run, RunSpec, run_rank
from runplane.domain.states import RunState
from runplane.domain.workers import Worker
from runplane.settings import StackSettings, parse_connection_string


def make_run(i=0, owner="alice", queue="default", **spec):
    return Run(
        id=f"r-{i}",
        owner=owner,
        queue=queue,
        spec=RunSpec(command="echo", **spec),
        created_at=1000.0 + i,
        events=[Event(at=1000.0, state=RunState.QUEUED, message="submitted")],
    )


@pytest.fixture
def clients(azure_stack):
    return azure_clients(azure_stack.settings)


@pytest.fixture
def runs_table(azure_stack, clients):
    return clients.tables.get_table_client(azure_names(azure_stack.settings).runs_table)


class Interleaved:
    """The real table client, with ``between`` run once right after the first read of a run (the
    ``reads``-th): another writer's write lands between this store's read and its write."""

    def __init__(self, table, between, reads=1):
        self.table = table
        self.between = between
        self.reads = reads

    def __getattr__(self, name):
        return getattr(self.table, name)

    def get_entity(self, partition_key, row_key, **kwargs):
        entity = self.table.get_entity(partition_key, row_key, **kwargs)
        self.reads -= row_key.startswith("run:")
        if row_key.startswith("run:") and self.between is not None and self.reads == 0:
            between, self.between = self.between, None
            between()
        return entity


# -- the runs table ------------------------------------------------------------------------


def test_a_write_between_read_and_write_that_breaks_expect_fails_the_update(azure_stack, runs_table):
    other = azure_stack.store
    run = other.create(make_run())
    claim = Expect(states=frozenset({RunState.QUEUED}), attempt=0)
    store = TableRunStore(
        Interleaved(runs_table, lambda: other.update(run, claim, {"state": RunState.PREPARING, "worker_id": "w1"}))
    )
    with pytest.raises(ConditionFailed, match=f"run {run.id} is preparing at attempt 0") as info:
        store.update(run, claim, {"state": RunState.PREPARING, "worker_id": "w2"})
    assert info.value.details["run"].worker_id == "w1"
    assert other.get(run.id).worker_id == "w1"


def test_a_write_between_read_and_write_that_keeps_expect_is_not_lost(azure_stack, runs_table):
    other = azure_stack.store
    run = other.create(make_run())
    store = TableRunStore(
        Interleaved(runs_table, lambda: other.update(run, Expect(), {"hinted_at": 5.0}, Event(at=2, message="A")))
    )
    updated = store.update(
        run, Expect(states=frozenset({RunState.QUEUED})), {"state": RunState.KILLED}, Event(at=3, message="B")
    )
    assert (updated.state, updated.hinted_at) == (RunState.KILLED, 5.0)
    assert [e.message for e in updated.events] == ["submitted", "A", "B"]
    assert other.get(run.id) == updated
    assert other.count("default", RunState.QUEUED) == 0
    assert [r.id for r in other.list(queue="default", state=RunState.KILLED).runs] == [run.id]


def _rows(table):
    return sorted((e["PartitionKey"], e["RowKey"]) for e in table.list_entities(select=["PartitionKey", "RowKey"]))


def test_layout_one_queue_partition_holds_the_run_and_its_state_copy(azure_stack, runs_table):
    run = azure_stack.store.create(make_run(3, owner="bob"))
    assert ("q:default", f"r:{key(run_rank(run))}") in _rows(runs_table)
    killed = azure_stack.store.update(run, Expect(), {"state": RunState.KILLED, "finished_at": 2000.5})
    assert _rows(runs_table) == [
        ("id:r-3", ""),
        ("o:bob", f"{newest_first(1003.0)}:r-3"),
        ("q:default", "p:0000002000.500000:r-3"),  # the retention sweep's index: due from its end
        ("q:default", "run:r-3"),
        ("q:default", f"s:killed:{newest_first(1003.0)}:r-3"),
    ]
    azure_stack.store.update(killed, Expect(), {"kept": True})
    assert [row for _, row in _rows(runs_table) if row.startswith("p:")] == []


def test_a_run_finished_before_the_retention_index_is_updated_and_deleted(azure_stack, runs_table):
    store = azure_stack.store
    run = store.update(store.create(make_run(4)), Expect(), {"state": RunState.FAILED, "finished_at": 3000.0})
    runs_table.delete_entity("q:default", "p:0000003000.000000:r-4")  # as a release without the index wrote it
    assert store.due("default", 1e10) == []
    dated = store.update(run, Expect(), {"retention": RunRetention(checked_at=3100.0, record_at=5000.0)})
    assert [r.id for r in store.due("default", 5000.0)] == [run.id]  # written afresh by the update
    runs_table.delete_entity("q:default", "p:0000005000.000000:r-4")
    store.delete(run.id, 5000.0)
    with pytest.raises(NotFound):
        store.get(dated.id)
    assert _rows(runs_table) == []


@pytest.mark.parametrize("indexed", [True, False])
def test_a_write_between_the_read_and_the_delete_of_a_run_is_not_lost(azure_stack, runs_table, indexed):
    other = azure_stack.store
    run = other.update(other.create(make_run(5)), Expect(), {"state": RunState.SUCCEEDED, "finished_at": 3000.0})
    if not indexed:  # written before the index: the delete's first try fails on its p: row, the write comes after
        runs_table.delete_entity("q:default", "p:0000003000.000000:r-5")
    between = Interleaved(runs_table, lambda: other.update(run, Expect(), {"kept": True}), reads=1 if indexed else 2)
    with pytest.raises(ConditionFailed, match=f"run {run.id} is not due"):
        TableRunStore(between).delete(run.id, 1e10)
    assert between.between is None  # the write did come between
    assert other.get(run.id).kept
    assert [r.id for r in other.list(owner="alice").runs] == [run.id]


class FailingDeletes:
    """The real table client, whose single-entity deletes fail: a delete stopped after the run."""

    def __init__(self, table):
        self.table = table

    def __getattr__(self, name):
        return getattr(self.table, name)

    def delete_entity(self, *args, **kwargs):
        raise ServiceRequestError("connection reset")


def test_a_delete_that_stopped_half_way_leaves_entries_that_point_at_no_run(azure_stack, runs_table):
    other = azure_stack.store
    run = other.update(other.create(make_run(6)), Expect(), {"state": RunState.SUCCEEDED, "finished_at": 3000.0})
    with pytest.raises(BackendError, match="delete run failed"):
        TableRunStore(FailingDeletes(runs_table)).delete(run.id, 3000.0)
    assert ("id:r-6", "") in _rows(runs_table)  # the run is gone, its entries are not
    with pytest.raises(NotFound):
        other.get(run.id)
    assert other.list(owner="alice").runs == []
    assert other.due("default", 1e10) == []
    with pytest.raises(NotFound):
        other.delete(run.id, 1e10)


def test_keys_with_characters_table_storage_refuses(azure_stack):
    store = azure_stack.store
    odd = make_run(owner="dom\\user/#1?").model_copy(update={"id": "r/x#y?z'é"})
    store.create(odd)
    assert store.get(odd.id) == odd
    assert [r.id for r in store.list(owner="dom\\user/#1?").runs] == [odd.id]
    assert store.list(owner="dom").runs == []
    assert key("a/b#c?d\\e'é~") == "a~2Fb~23c~3Fd~5Ce~27~C3~A9~7E"


def test_a_create_that_stopped_half_way_is_invisible_and_completed_by_a_retry(azure_stack, runs_table):
    store = azure_stack.store
    run = make_run(7)
    # what the first two writes of create leave behind when the third never happens
    runs_table.create_entity({"PartitionKey": "id:r-7", "RowKey": "", "queue": "default"})
    runs_table.create_entity(
        {"PartitionKey": "o:alice", "RowKey": f"{newest_first(run.created_at)}:r-7", "queue": "default"}
    )
    with pytest.raises(NotFound, match=f"run {run.id} not found"):
        store.get(run.id)
    assert store.list(owner="alice").runs == []
    with pytest.raises(Conflict, match="taken by a run of queue default"):
        store.create(run.model_copy(update={"queue": "parked"}))
    assert store.create(run) == run
    assert store.get(run.id) == run
    assert [r.id for r in store.list(owner="alice").runs] == ["r-7"]
    with pytest.raises(AlreadyExists, match=f"run {run.id} exists"):
        store.create(run)


def test_an_id_taken_in_another_queue_already_exists(azure_stack):
    store = azure_stack.store
    first = store.create(make_run(1))
    with pytest.raises(AlreadyExists, match=f"run {first.id} exists") as info:
        store.create(make_run(1, owner="mallory", queue="parked"))
    assert info.value.details["run"] == first
    assert store.list(owner="mallory").runs == []
    assert store.count("parked", RunState.QUEUED) == 0


def test_list_by_owner_skips_entries_of_others_and_filters(azure_stack):
    store = azure_stack.store
    for i in range(5):
        store.create(make_run(i, queue="default" if i % 2 else "parked"))
    store.create(make_run(9, owner="bob"))
    parked = store.list(owner="alice", queue="parked", limit=2)
    assert [r.id for r in parked.runs] == ["r-4", "r-2"]
    rest = store.list(owner="alice", queue="parked", limit=2, cursor=parked.next_cursor)
    assert [r.id for r in rest.runs] == ["r-0"]
    store.update(make_run(3), Expect(), {"state": RunState.KILLED})
    assert [r.id for r in store.list(owner="alice", state=RunState.KILLED).runs] == ["r-3"]


def test_large_runs_span_properties_and_oversized_ones_are_refused(azure_stack):
    store = azure_stack.store
    big = make_run(env={f"V{i}": "x" * 2000 for i in range(200)})  # ~400 KB of JSON
    assert len(big.model_dump_json()) > 12 * 32_000
    store.create(big)
    assert store.get(big.id) == big
    more = [Event(at=float(i), message="y" * 1000) for i in range(MAX_RUN_CHARS // 1000)]
    with pytest.raises(PayloadTooLarge, match=f"run {big.id} is \\d+ bytes as JSON; Table storage holds at most"):
        store.update(big, Expect(), {"events": more})
    assert store.get(big.id) == big
    huge = make_run(1, env={f"V{i}": "x" * 4000 for i in range(150)})
    with pytest.raises(PayloadTooLarge, match=f"run {huge.id} is \\d+ bytes as JSON; Table storage holds at most"):
        store.create(huge)
    with pytest.raises(NotFound, match=f"run {huge.id} not found"):
        store.get(huge.id)


def test_count_stops_at_cap(azure_stack):
    for i in range(5):
        azure_stack.store.create(make_run(i))
    assert azure_stack.store.count("default", RunState.QUEUED, cap=3) == 3
    assert azure_stack.store.count("default", RunState.QUEUED, cap=0) == 0
    assert azure_stack.store.count("default", RunState.QUEUED) == 5


def test_unprovisioned_tables_are_a_clear_backend_error(azurite):
    settings = StackSettings(cloud="azure", prefix=f"n{uuid.uuid4().hex[:8]}", azure_storage_connection_string=azurite)
    stack = build_stack(settings)
    with pytest.raises(BackendError, match="was the stack provisioned"):
        stack.store.get("r-1")
    with pytest.raises(NotFound, match="was the stack provisioned"):
        stack.queue.send("default", RunMessage(run_id="r-1", attempt=0))


# -- workers -------------------------------------------------------------------------------


def test_worker_records_expire_without_heartbeats(azure_stack, clients):
    now = [1000.0]
    table = clients.tables.get_table_client(azure_names(azure_stack.settings).workers_table)
    workers = TableWorkerRegistry(table, ttl_seconds=60, clock=lambda: now[0])
    workers.put(Worker(id="w-old", pool="default", started_at=1.0, heartbeat_at=1000.0))
    now[0] = 1030.0
    workers.put(Worker(id="w-new", pool="default", started_at=1.0, heartbeat_at=1030.0))
    now[0] = 1061.0
    with pytest.raises(NotFound, match="expired"):
        workers.get("w-old")
    assert [w.id for w in workers.list("default")] == ["w-new"]
    assert [e["RowKey"] for e in table.list_entities()] == ["w-new"]  # the expired record is deleted


# -- queues --------------------------------------------------------------------------------


def queue_with_clock(stack, on_sleep=None):
    now = [0.0]
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds
        if on_sleep:
            on_sleep(len(slept))

    queue = StorageQueueRunQueue(stack.settings.prefix, stack.queue.client, sleep=sleep, clock=lambda: now[0])
    return queue, slept


def test_receive_waits_by_polling_with_a_growing_pause(azure_stack):
    queue, slept = queue_with_clock(azure_stack)
    assert queue.receive("default", 10, wait_seconds=2, visibility_seconds=30) == []
    assert slept == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 0.45])
    assert queue.receive("default", 10, wait_seconds=0, visibility_seconds=30) == []
    assert len(slept) == 6


def test_receive_returns_as_soon_as_a_message_arrives(azure_stack):
    def arrive(n):
        if n == 3:
            azure_stack.queue.send("default", RunMessage(run_id="r-late", attempt=0))

    queue, slept = queue_with_clock(azure_stack, arrive)
    got = queue.receive("default", 10, wait_seconds=20, visibility_seconds=30)
    assert [d.message.run_id for d in got] == ["r-late"]
    assert len(slept) == 3


def test_messages_are_base64_json_as_the_functions_trigger_reads_them(azure_stack):
    azure_stack.queue.notify(DispatchEvent(pool="default", reason="submitted"))
    azure_stack.queue.send("default", RunMessage(run_id="r-1", attempt=2))
    client = azure_stack.queue.client
    prefix = azure_stack.settings.prefix
    [event] = client.get_queue_client(events_queue_name(prefix)).peek_messages()
    assert DispatchEvent.model_validate_json(base64.b64decode(event.content)).pool == "default"
    [hint] = client.get_queue_client(pool_queue_name(prefix, "default")).peek_messages()
    assert json.loads(base64.b64decode(hint.content)) == {"v": 1, "run_id": "r-1", "attempt": 2}


def test_unreadable_messages_go_to_the_poison_queue(azure_stack):
    client = azure_stack.queue.client
    name = pool_queue_name(azure_stack.settings.prefix, "default")
    client.get_queue_client(name).send_message("not base64 {")
    client.get_queue_client(name).send_message(base64.b64encode(b'{"run_id": 1}').decode())
    assert azure_stack.queue.receive("default", 10, wait_seconds=0, visibility_seconds=30) == []
    poison = [m.content for m in client.get_queue_client(poison_queue_name(name)).peek_messages(max_messages=10)]
    assert sorted(poison) == sorted(["not base64 {", base64.b64encode(b'{"run_id": 1}').decode()])


def test_queue_names_follow_the_naming_rules():
    assert pool_queue_name("T1_Stack", "gpu-a100") == "t1-stack-pool-gpu-a100"
    assert events_queue_name("runplane") == "runplane-events"
    assert poison_queue_name("runplane-pool-default") == "runplane-pool-default-poison"
    long = pool_queue_name("p" * 40, "q" * 40)
    assert len(long) <= 63 and long != pool_queue_name("p" * 40, "q" * 41)
    assert len(poison_queue_name(long)) <= 63
    assert queue_name("--") not in ("", "-")
    assert table_name("t-1234abcd" + "runs") == "t1234abcdruns"
    assert table_name("9lives") == "t9lives"


# -- blobs ---------------------------------------------------------------------------------


def test_sas_urls_expire_by_the_store_clock(azure_stack, clients):
    store = azure_stack.objects
    store.put_bytes("k", b"data")
    with urllib.request.urlopen(store.url("k", expires_seconds=60), timeout=10) as r:
        assert r.read() == b"data"
    past = BlobObjectStore(store.container, clients.blobs, clients.account_key, clock=lambda: time.time() - 7200)
    with pytest.raises(urllib.error.HTTPError, match="HTTP Error 403: Server failed to authenticate") as info:
        urllib.request.urlopen(past.url("k", expires_seconds=3600), timeout=10)
    assert info.value.code == 403


class DelegationKeyService(HttpTransport):
    """Blob storage's Get User Delegation Key call at the HTTP boundary, for a managed identity
    (Azurite grants these keys only with OAuth over HTTPS set up): answers each request with a
    key valid for the times asked, and records the requests."""

    def __init__(self):
        self.asked = []

    def send(self, request, **kwargs):
        body = request.body.decode()
        start, expiry = (re.search(f"<{tag}>(.*)</{tag}>", body).group(1) for tag in ("Start", "Expiry"))
        self.asked.append((request.method, request.url, start, expiry))
        key = (
            '<?xml version="1.0" encoding="utf-8"?><UserDelegationKey>'
            "<SignedOid>11111111-2222-3333-4444-555555555555</SignedOid>"
            "<SignedTid>66666666-7777-8888-9999-000000000000</SignedTid>"
            f"<SignedStart>{start}</SignedStart><SignedExpiry>{expiry}</SignedExpiry>"
            "<SignedService>b</SignedService><SignedVersion>2025-01-05</SignedVersion>"
            "<Value>a2V5LWJ5dGVzLWZvci10ZXN0aW5nLW9ubHkhIQ==</Value></UserDelegationKey>"
        )
        response = requests.Response()
        response.status_code, response.reason, response._content = 200, "OK", key.encode()
        response.headers["Content-Type"] = "application/xml"
        return RequestsTransportResponse(request, response)

    def open(self):
        pass

    def close(self):
        pass

    def __exit__(self, *args):
        pass


class Identity:
    def get_token(self, *scopes, **kwargs):
        return AccessToken("token", int(time.time()) + 3600)


def test_with_a_managed_identity_urls_are_signed_with_a_kept_user_delegation_key():
    service, now = DelegationKeyService(), [1_800_000_000.0]
    client = BlobServiceClient("https://acct.blob.core.windows.net", credential=Identity(), transport=service)
    store = BlobObjectStore("data", client, clock=lambda: now[0])
    first = urllib.parse.parse_qs(urllib.parse.urlsplit(store.url("runs/a/x", 3600)).query)
    assert first["se"] == ["2027-01-15T09:00:00Z"] and first["sp"] == ["r"] and first["sig"]
    assert first["skoid"] == ["11111111-2222-3333-4444-555555555555"]
    assert service.asked == [
        (
            "POST",
            "https://acct.blob.core.windows.net/?restype=service&comp=userdelegationkey",
            "2027-01-15T07:55:00Z",
            "2027-01-22T08:00:00Z",
        )
    ]
    now[0] += 6 * 24 * 3600  # the kept key still covers a one-hour URL
    store.url("runs/a/y", 3600)
    assert len(service.asked) == 1
    now[0] += 23.5 * 3600  # it would not: a new key
    late = urllib.parse.parse_qs(urllib.parse.urlsplit(store.url("runs/a/z", 3600)).query)
    assert len(service.asked) == 2 and late["ske"] == ["2027-01-29T07:30:00Z"]
    longest = urllib.parse.parse_qs(urllib.parse.urlsplit(store.url("runs/a/z", 30 * 24 * 3600)).query)
    assert longest["se"] <= longest["ske"]


def test_large_files_go_up_in_blocks(azure_stack, clients, tmp_path):
    path = tmp_path / "big.bin"
    path.write_bytes(bytes(range(256)) * (17 * 4096))  # 17 MiB
    azure_stack.objects.put_file("big.bin", path)
    blob = clients.blobs.get_blob_client(azure_stack.objects.container, "big.bin")
    committed, _ = blob.get_block_list("committed")
    assert [b.size for b in committed] == [8 * 2**20, 8 * 2**20, 2**20]
    assert azure_stack.objects.get_bytes("big.bin") == path.read_bytes()


def test_missing_objects_and_containers(azure_stack, tmp_path):
    with pytest.raises(NotFound, match="object nothing not found"):
        azure_stack.objects.download_file("nothing", tmp_path / "x")
    assert list(tmp_path.iterdir()) == []  # no partial file left behind
    with pytest.raises(BackendError, match="does not exist"):
        azure_stack.objects.within("no-such-container").list("")
    # a missing blob is no error to delete; a missing container is, as for every other call
    azure_stack.objects.delete(["nothing"])
    with pytest.raises(BackendError, match="delete runs/r1/outputs/1/f: container no-such-container does not exist"):
        azure_stack.objects.within("no-such-container").delete(["runs/r1/outputs/1/f"])
    with pytest.raises(BackendError, match="touch uploads/a: container no-such-container does not exist"):
        azure_stack.objects.within("no-such-container").touch("uploads/a")


# -- settings and provisioning -------------------------------------------------------------


def test_settings_without_an_account_are_refused():
    with pytest.raises(InvalidRequest, match="RUNPLANE_AZURE_STORAGE_CONNECTION_STRING"):
        build_stack(StackSettings(cloud="azure"))
    with pytest.raises(InvalidRequest, match="AccountName"):
        connect("DefaultEndpointsProtocol=http;AccountKey=abc")
    with pytest.raises(InvalidRequest, match="table name"):
        AzureNames("p", runs_table="my-runs")
    with pytest.raises(InvalidRequest, match="container name"):
        AzureNames("p", container="My_Data")


def test_an_account_name_alone_is_reached_with_the_identity():
    clients = connect(account="acct", credential=Identity())
    assert (clients.tables.url, clients.queues.url, clients.blobs.url) == (
        "https://acct.table.core.windows.net",
        "https://acct.queue.core.windows.net/",
        "https://acct.blob.core.windows.net/",
    )
    assert clients.account_key is None
    assert isinstance(build_stack(StackSettings(cloud="azure", azure_storage_account="acct")).objects, BlobObjectStore)


def test_stack_id_names_the_account_not_its_key(azurite):
    settings = StackSettings(cloud="azure", azure_storage_connection_string=azurite)
    rotated = azurite.replace(parse_connection_string(azurite)["AccountKey"], "bmV3LWtleQ==")
    assert StackSettings(cloud="azure", azure_storage_connection_string=rotated).stack_id() == settings.stack_id()
    others = {
        StackSettings().stack_id(),
        StackSettings(cloud="azure", azure_storage_account="one").stack_id(),
        StackSettings(cloud="azure", azure_storage_account="two").stack_id(),
        StackSettings(cloud="azure", azure_storage_connection_string=azurite, prefix="other").stack_id(),
    }
    assert settings.stack_id() not in others and len(others) == 4


def test_provision_is_idempotent_and_deprovision_removes_everything(azurite):
    settings = StackSettings(cloud="azure", prefix=f"p{uuid.uuid4().hex[:8]}", azure_storage_connection_string=azurite)
    clients, names = azure_clients(settings), azure_names(settings)
    provision(names, ["default"], clients)
    provision(names, ["default"], clients)
    tables = {t.name for t in clients.tables.list_tables()}
    assert set(names.tables) <= tables
    queues = {q.name for q in clients.queues.list_queues(name_starts_with=settings.prefix)}
    assert queues == set(names.queues(["default"]))
    deprovision(names, ["default"], clients)
    deprovision(names, ["default"], clients)
    assert not set(names.tables) & {t.name for t in clients.tables.list_tables()}
    assert list(clients.queues.list_queues(name_starts_with=settings.prefix)) == []
