"""Contract of QuotaStore: quotas (replaced whole by admins) and usage records (written only
while their version is the one the writer read)."""

import json

import pytest

from runplane.domain.errors import ConditionFailed
from runplane.domain.quotas import Hold, Lane, Quota, UsageRecord


def quota(kind, name, **limits):
    return Quota(kind=kind, name=name, updated_at=10.0, updated_by="root", **limits)


def hold(run_id, attempt=1, gpus=1, cpus=2.0):
    return Hold(run_id=run_id, attempt=attempt, gpus=gpus, cpus=cpus, at=5.0, gpu_seconds=gpus * 60.0)


def put_raw(request, stack, partition, subject, doc, version=None):
    """Store ``doc`` (any JSON) as the record of ``subject`` past the adapter, as a foreign or an
    older writer would: ``partition`` is ``quota`` or ``usage``."""
    quotas = stack.quotas
    if request.node.callspec.params["stack"] == "aws-moto":
        item = {"id": {"S": f"{partition}#{subject}"}, "doc": {"S": json.dumps(doc)}}
        if version is not None:
            item["version"] = {"N": str(version)}
        quotas.client.put_item(TableName=quotas.table, Item=item)
    elif request.node.callspec.params["stack"] == "local-sqlite":
        with quotas.db.write() as c:
            row = (partition, subject, version, json.dumps(doc))
            c.execute("INSERT OR REPLACE INTO quotas (kind, key, version, data) VALUES (?, ?, ?, ?)", row)
    else:
        from runplane.adapters.azure.tables import key

        text = json.dumps(doc)  # as a quota ("doc") and as a usage record (chunks "d0"..)
        entity = {"PartitionKey": partition, "RowKey": key(subject), "doc": text, "n": 1, "d0": text}
        if version is not None:
            entity["version"] = version
        quotas.table.upsert_entity(entity)


def test_quotas_put_get_replace_delete_list(stack):
    quotas = stack.quotas
    assert quotas.get("user", "alice") is None
    assert quotas.list() == []
    alice = quota("user", "alice", max_running=2, gpu_hours=10.5, period="week")
    vision = quota("group", "vision", max_gpus=4)
    quotas.put(vision)
    quotas.put(alice)
    quotas.put(quota("user", "bob.smith@lab", max_cpus=8.5))
    quotas.put(quota("group", "audio", cpu_hours=0))
    quotas.put(quota("user", "Ann_1"))
    assert quotas.get("user", "alice") == alice
    assert quotas.get("group", "vision") == vision
    assert quotas.get("group", "alice") is None  # a user's quota is no group's
    assert [(q.kind, q.name) for q in quotas.list()] == [
        ("user", "Ann_1"),
        ("user", "alice"),
        ("user", "bob.smith@lab"),
        ("group", "audio"),
        ("group", "vision"),
    ]
    replaced = quota("user", "alice", max_running=5)
    quotas.put(replaced)
    assert quotas.get("user", "alice") == replaced  # replaced whole: gpu_hours and period are gone
    assert quotas.delete("user", "alice") is True
    assert quotas.delete("user", "alice") is False  # idempotent
    assert quotas.get("user", "alice") is None
    assert quotas.delete("group", "nobody") is False
    assert [q.name for q in quotas.list()] == ["Ann_1", "bob.smith@lab", "audio", "vision"]


def test_quota_records_that_are_not_quotas_are_skipped(stack, request):
    """A stored record that does not validate, or that holds another subject's quota, is no quota
    at all: get says None and the listing leaves it out."""
    quotas = stack.quotas
    good = quota("user", "carol", max_running=1)
    quotas.put(good)
    put_raw(request, stack, "quota", "user:mallory", {"kind": "user", "name": "mallory", "max_gpus": -1})
    put_raw(request, stack, "quota", "group:vision", {"kind": "group", "name": "vision", "shell": "rm -rf /"})
    put_raw(request, stack, "quota", "user:eve", good.model_dump(mode="json"))  # carol's quota under eve's key
    put_raw(request, stack, "quota", "user:trent", ["not", "a", "quota"])
    assert quotas.get("user", "mallory") is None
    assert quotas.get("group", "vision") is None
    assert quotas.get("user", "eve") is None
    assert quotas.get("user", "trent") is None
    assert quotas.list() == [good]


def test_usage_starts_fresh(stack):
    record = stack.quotas.usage("user", "alice")
    assert record == UsageRecord(kind="user", name="alice")
    assert record.version == 0 and record.running == 0
    assert stack.quotas.list_usage() == []


def test_save_usage_chains_versions(stack):
    quotas = stack.quotas
    first = quotas.save_usage(UsageRecord(kind="group", name="vision", holds={"r-1#1": hold("r-1")}))
    assert first.version == 1
    read = quotas.usage("group", "vision")
    assert read == first
    assert (read.running, read.gpus, read.cpus) == (1, 1, 2.0)
    grown = read.model_copy(
        update={
            "holds": {**read.holds, "r-2#3": hold("r-2", attempt=3, gpus=2, cpus=0.5)},
            "period": "2025-05",
            "gpu_seconds": 120.5,
            "blocked": {"r-9": 0},
        }
    )
    second = quotas.save_usage(grown)
    assert second.version == 2
    assert quotas.usage("group", "vision") == second
    assert (second.running, second.gpus, second.cpus) == (2, 3, 2.5)
    third = quotas.save_usage(second.model_copy(update={"holds": {}, "blocked": {}}))
    assert third.version == 3
    assert quotas.usage("group", "vision") == third
    assert quotas.usage("user", "vision").version == 0  # the group's record is not the user's


def test_save_usage_with_a_stale_version_fails(stack):
    quotas = stack.quotas
    mine = quotas.usage("user", "alice")
    theirs = quotas.usage("user", "alice")
    stored = quotas.save_usage(theirs.model_copy(update={"holds": {"r-1#1": hold("r-1")}}))
    with pytest.raises(ConditionFailed):
        quotas.save_usage(mine.model_copy(update={"holds": {"r-2#1": hold("r-2")}}))  # version 0: one exists
    newer = quotas.save_usage(stored.model_copy(update={"gpu_seconds": 1.0}))
    with pytest.raises(ConditionFailed):
        quotas.save_usage(stored.model_copy(update={"holds": {}}))  # version 1: it is at 2 now
    with pytest.raises(ConditionFailed):
        quotas.save_usage(newer.model_copy(update={"version": 7}))  # a version never stored
    with pytest.raises(ConditionFailed):
        quotas.save_usage(UsageRecord(kind="user", name="bob", version=1))  # none stored at all
    assert quotas.usage("user", "alice") == newer  # no failed write changed anything
    assert quotas.usage("user", "bob").version == 0


def test_deleting_a_quota_keeps_its_usage(stack):
    quotas = stack.quotas
    quotas.put(quota("user", "alice", max_running=1))
    stored = quotas.save_usage(UsageRecord(kind="user", name="alice", holds={"r-1#1": hold("r-1")}))
    assert quotas.delete("user", "alice") is True
    assert quotas.usage("user", "alice") == stored
    assert quotas.get("user", "alice") is None


def test_list_usage(stack):
    quotas = stack.quotas
    quotas.put(quota("user", "zed", max_running=1))  # a quota is no usage record
    saved = [
        quotas.save_usage(UsageRecord(kind="group", name="vision", holds={"r-1#1": hold("r-1")})),
        quotas.save_usage(UsageRecord(kind="user", name="b_c@lab", blocked={"r-3": 2})),
        quotas.save_usage(UsageRecord(kind="user", name="alice", gpu_seconds=3.0, period="2025-05")),
        quotas.save_usage(UsageRecord(kind="group", name="audio")),
    ]
    listed = quotas.list_usage()
    assert [(r.kind, r.name) for r in listed] == [
        ("user", "alice"),
        ("user", "b_c@lab"),
        ("group", "audio"),
        ("group", "vision"),
    ]
    assert sorted(listed, key=lambda r: r.name) == sorted(saved, key=lambda r: r.name)


def test_a_usage_record_that_does_not_validate_reads_fresh_and_is_replaced(stack, request):
    """A stored usage record that does not validate (or is another subject's) reads as an empty
    record at the stored version: the next conditional write replaces it, never a write that read
    nothing."""
    quotas = stack.quotas
    put_raw(request, stack, "usage", "user:alice", {"kind": "user", "name": "alice", "holds": "all"}, version=4)
    other = UsageRecord(kind="user", name="bob", version=2, holds={"r-1#1": hold("r-1")})
    put_raw(request, stack, "usage", "user:eve", other.model_dump(mode="json"), version=2)
    read = quotas.usage("user", "alice")
    assert read == UsageRecord(kind="user", name="alice", version=4)
    assert quotas.usage("user", "eve") == UsageRecord(kind="user", name="eve", version=2)
    with pytest.raises(ConditionFailed):
        quotas.save_usage(UsageRecord(kind="user", name="alice"))
    stored = quotas.save_usage(read.model_copy(update={"holds": {"r-5#1": hold("r-5")}}))
    assert stored.version == 5
    assert quotas.usage("user", "alice") == stored
    assert [(r.name, r.running) for r in quotas.list_usage()] == [("alice", 1), ("eve", 0)]


# ---- lanes: a user's place in the fair share of one pool at one priority -------------------------


def test_lanes_start_fresh_and_chain_versions(stack):
    quotas = stack.quotas
    assert quotas.lane("gpu", "alice", 50) == Lane(pool="gpu", user="alice", priority=50)
    first = quotas.save_lane(Lane(pool="gpu", user="alice", priority=50, tag=3.0, lead=3.0, at=100.0))
    assert first.version == 1
    assert quotas.lane("gpu", "alice", 50) == first
    second = quotas.save_lane(first.model_copy(update={"tag": 4.5, "lead": 1.25, "at": 200.5}))
    assert second.version == 2
    assert quotas.lane("gpu", "alice", 50) == second
    # one lane per pool, priority and user; a user name with odd characters is a user like any other
    assert quotas.lane("cpu", "alice", 50).version == 0
    assert quotas.lane("gpu", "bob", 50).version == 0
    assert quotas.lane("gpu", "alice", 5).version == 0
    assert quotas.lane("gpu", "alice", 0).version == 0
    odd = quotas.save_lane(Lane(pool="gpu", user="a.b@example.com", priority=50, tag=1.0))
    assert quotas.lane("gpu", "a.b@example.com", 50) == odd
    # lanes are neither quotas nor usage records
    assert quotas.list() == [] and quotas.list_usage() == []


def test_lanes_of_one_user_at_two_priorities_are_apart(stack):
    quotas = stack.quotas
    high = quotas.save_lane(Lane(pool="gpu", user="alice", priority=90, tag=7.0, lead=7.0, at=1.0))
    low = quotas.save_lane(Lane(pool="gpu", user="alice", priority=9, tag=2.0, lead=2.0, at=1.0))
    assert quotas.save_lane(low.model_copy(update={"tag": 3.0})).version == 2
    assert quotas.lane("gpu", "alice", 90) == high
    assert quotas.lane("gpu", "alice", 9).tag == 3.0


def test_save_lane_with_a_stale_version_fails(stack):
    quotas = stack.quotas
    mine = quotas.lane("gpu", "alice", 50)
    theirs = quotas.lane("gpu", "alice", 50)
    stored = quotas.save_lane(theirs.model_copy(update={"tag": 1.0}))
    with pytest.raises(ConditionFailed):
        quotas.save_lane(mine.model_copy(update={"tag": 9.0}))  # version 0: one exists
    with pytest.raises(ConditionFailed):
        quotas.save_lane(stored.model_copy(update={"version": 5}))  # a version never stored
    with pytest.raises(ConditionFailed):
        quotas.save_lane(Lane(pool="gpu", user="bob", priority=50, version=1))  # none stored at all
    assert quotas.lane("gpu", "alice", 50) == stored
    assert quotas.lane("gpu", "bob", 50).version == 0
