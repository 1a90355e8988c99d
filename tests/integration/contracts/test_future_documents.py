"""The stores' other records, as a later release may write them (fields this release does not know):
pool records, quotas, usage records, lanes, tokens and sweeps are read by this release's stores,
and what those stores write back of them keeps the fields."""

import json

from azure.data.tables import UpdateMode

from runplane.adapters.azure.tables import key, pack, unpack
from runplane.domain.quotas import Lane, Quota, UsageRecord
from runplane.domain.runs import RunSpec
from runplane.domain.sweeps import PENDING, Sweep, SweepSpec
from runplane.domain.tenancy import ApiToken
from runplane.domain.workers import PoolRecord

LATER = {"region": "eu-west", "tier": {"name": "gold", "rank": 2}}
"""Fields a later release adds to a record."""


def _aws(stack):
    return stack.settings.cloud != "azure"


class Stored:
    """Where a store keeps one record's document: an item's attribute (DynamoDB), an entity's
    property or packed properties (Table storage), or a row's ``data`` (SQLite: ``row`` is the
    table and the condition that picks the row)."""

    def __init__(self, stack, store, item_key, entity_key, row, attribute="doc"):
        self.local, self.aws = stack.settings.cloud == "local", _aws(stack)
        self.store, self.attribute = store, attribute
        self.item_key, self.entity_key, self.row = item_key, entity_key, row

    def read(self):
        if self.local:
            table, where, args = self.row
            return json.loads(
                self.store.db.connection().execute(f"SELECT data FROM {table} WHERE {where}", args).fetchone()[0]
            )
        if self.aws:
            item = self.store.client.get_item(TableName=self.store.table, Key=self.item_key, ConsistentRead=True)
            return json.loads(item["Item"][self.attribute]["S"])
        entity = self.store.table.get_entity(*self.entity_key)
        return unpack(entity) if "n" in entity else json.loads(entity[self.attribute])

    def add(self, fields):
        """Rewrite the document with ``fields`` added, as a later release would."""
        doc = {**self.read(), **fields}
        if self.local:
            table, where, args = self.row
            with self.store.db.write() as c:
                c.execute(f"UPDATE {table} SET data = ? WHERE {where}", (json.dumps(doc), *args))
            return
        if self.aws:
            item = self.store.client.get_item(TableName=self.store.table, Key=self.item_key, ConsistentRead=True)
            item = {**item["Item"], self.attribute: {"S": json.dumps(doc)}}
            self.store.client.put_item(TableName=self.store.table, Item=item)
            return
        entity = dict(self.store.table.get_entity(*self.entity_key))
        body = pack(doc, "record") if "n" in entity else {self.attribute: json.dumps(doc)}
        self.store.table.update_entity({**entity, **body}, mode=UpdateMode.REPLACE)


def kept(stored):
    doc = stored.read()
    return {name: doc.get(name) for name in LATER}


def test_records_guarded_by_their_version_are_read_and_written_back_whole(stack):
    pools = stack.pool_states
    pool = Stored(stack, pools, {"pool": {"S": "gpu"}}, ("p", key("gpu")), ("pool_states", "pool = ?", ("gpu",)))
    pools.save(PoolRecord(pool="gpu"))
    pool.add(LATER)
    read = pools.get("gpu")
    assert read.version == 1
    assert pools.save(read.model_copy(update={"launched": 3})).version == 2
    assert (pool.read()["launched"], kept(pool)) == (3, LATER)

    quotas = stack.quotas
    usage = Stored(
        stack,
        quotas,
        {"id": {"S": "usage#user:alice"}},
        ("usage", key("user:alice")),
        ("quotas", "kind = ? AND key = ?", ("usage", "user:alice")),
    )
    quotas.save_usage(UsageRecord(kind="user", name="alice", gpu_seconds=5.0))
    usage.add(LATER)
    read_usage = quotas.usage("user", "alice")
    assert (read_usage.version, read_usage.gpu_seconds) == (1, 5.0)  # not a fresh record
    quotas.save_usage(read_usage.model_copy(update={"gpu_seconds": 6.0}))
    assert (quotas.usage("user", "alice").gpu_seconds, kept(usage)) == (6.0, LATER)
    assert [u.name for u in quotas.list_usage()] == ["alice"]

    lane = Stored(
        stack,
        quotas,
        {"id": {"S": "lane#gpu#50#alice"}},
        ("lane", f"{key('gpu')}:50:{key('alice')}"),
        ("quotas", "kind = ? AND key = ?", ("lane", "gpu#50#alice")),
    )
    quotas.save_lane(Lane(pool="gpu", priority=50, user="alice", tag=4.0))
    lane.add(LATER)
    read_lane = quotas.lane("gpu", "alice", 50)
    assert (read_lane.version, read_lane.tag) == (1, 4.0)
    quotas.save_lane(read_lane.model_copy(update={"tag": 8.0}))
    assert (quotas.lane("gpu", "alice", 50).tag, kept(lane)) == (8.0, LATER)


def test_quotas_tokens_and_sweeps_are_read_and_written_back_whole(stack):
    quotas = stack.quotas
    quota = Stored(
        stack,
        quotas,
        {"id": {"S": "quota#user:alice"}},
        ("quota", key("user:alice")),
        ("quotas", "kind = ? AND key = ?", ("quota", "user:alice")),
    )
    quotas.put(Quota(kind="user", name="alice", max_gpus=2, updated_at=1.0))
    quota.add(LATER)
    assert quotas.get("user", "alice").max_gpus == 2  # a quota still, not none
    assert [q.name for q in quotas.list()] == ["alice"]
    quotas.put(quotas.get("user", "alice").model_copy(update={"max_gpus": 4}))
    assert (quota.read()["max_gpus"], kept(quota)) == (4, LATER)

    tokens = stack.tokens.inner
    token = Stored(
        stack, tokens, {"token_hash": {"S": "f" * 64}}, (key("f" * 64), ""), ("tokens", "token_hash = ?", ("f" * 64,))
    )
    tokens.put("f" * 64, ApiToken(id="tok-0123456789abcdef", user="alice", scopes=["runs:read"], created_at=1.0))
    token.add(LATER)
    assert tokens.lookup("f" * 64).user == "alice"  # the token still works
    assert [t.id for t in tokens.list()] == ["tok-0123456789abcdef"]

    sweeps = stack.sweeps
    spec = SweepSpec(run=RunSpec(command="true", queue="parked"), count=2)
    made = sweeps.create(
        Sweep(id="s-later", owner="alice", spec=spec, queue="parked", created_at=1.0, status=PENDING * 2)
    )
    sweep = Stored(
        stack,
        sweeps,
        {"id": {"S": "s-later"}},
        ("sweeps", "sw:s-later"),
        ("sweeps", "id = ?", ("s-later",)),
        attribute="data",
    )
    sweep.add(LATER)
    read_sweep = sweeps.get("s-later")
    assert read_sweep.version == made.version
    assert [s.id for s in sweeps.list("alice")[0]] == ["s-later"]
    sweeps.save(read_sweep.model_copy(update={"killed": True}))
    assert (sweep.read()["killed"], kept(sweep)) == (True, LATER)
