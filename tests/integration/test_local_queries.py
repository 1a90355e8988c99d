"""Every query the SQLite run, sweep and secret stores make is a search of an index (a lookup by key or a
range of one index, in the order the answer needs): never a scan of the table, never a sort, so
that a read, a listing page, a count, a pool's line and a conditional write cost the log of the
number of runs, not the number. Each statement is caught as the store runs it and asked for
SQLite's plan."""

import sqlite3

from runplane.adapters.local.db import Database
from runplane.adapters.local.runs import SqliteRunStore
from runplane.adapters.local.secrets import SqliteSecretStore
from runplane.adapters.local.sweeps import SqliteSweepStore
from runplane.domain.expect import Expect
from runplane.domain.runs import Run, RunSpec
from runplane.domain.secrets import Sealed, SecretRecord
from runplane.domain.states import RunState
from runplane.domain.sweeps import PENDING, Sweep, SweepSpec


def _plans(db: Database, work) -> dict[str, list[str]]:
    """The plan of every SELECT and UPDATE that ``work`` makes this thread's connection run."""
    seen: list[str] = []
    connection = db.connection()
    connection.set_trace_callback(seen.append)
    try:
        work()
    finally:
        connection.set_trace_callback(None)
    explain = sqlite3.connect(db.path)
    try:
        return {
            sql: [row[3] for row in explain.execute("EXPLAIN QUERY PLAN " + sql)]
            for sql in seen
            if sql.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE"))
        }
    finally:
        explain.close()


def test_every_query_of_the_run_and_sweep_stores_searches_an_index(tmp_path):
    db = Database.at(tmp_path / "state")
    runs, sweeps = SqliteRunStore(db), SqliteSweepStore(db)
    for i in range(30):
        spec = RunSpec(command="true", priority=40 + i % 3)
        made = runs.create(Run(id=f"r-{i}", owner="alice", spec=spec, queue="default", created_at=1000.0 + i))
        if i % 5 == 0:
            runs.update(made, Expect(), {"waiting_on": ["r-0"]} if i % 10 else {"state": RunState.KILLED})
    spec = SweepSpec(run=RunSpec(command="true"), count=1)
    for i in range(5):
        sweeps.create(Sweep(id=f"s-{i}", owner="alice", spec=spec, queue="default", created_at=1.0 + i, status=PENDING))

    def work():
        run = runs.get("r-7")
        runs.create(Run(id="r-new", owner="bob", spec=RunSpec(command="true"), queue="default", created_at=5000.0))
        runs.update(run, Expect(states=frozenset({RunState.QUEUED})), {"hinted_at": 1.0})
        runs.follow("r-7", "r-3")
        page = runs.list(owner="alice", limit=5)
        runs.list(owner="alice", limit=5, cursor=page.next_cursor)
        runs.list(owner="alice", state=RunState.KILLED, limit=2)
        runs.list(owner="alice", queue="default", limit=2)
        page = runs.list(queue="default", state=RunState.QUEUED, limit=5)
        runs.list(queue="default", state=RunState.QUEUED, limit=5, cursor=page.next_cursor)
        runs.waiting("default", limit=5)
        runs.head("default", 5)
        runs.head("default", 5, priority=41)
        runs.count("default", RunState.QUEUED)
        runs.due("default", 1e10, limit=3)
        runs.delete("r-0", 1e10)
        sweep = sweeps.get("s-1")
        sweeps.save(sweep.model_copy(update={"finished_at": 9.0}))
        cursor = sweeps.list("alice", limit=2)[1]
        sweeps.list("alice", limit=2, cursor=cursor)
        sweeps.unfinished(limit=2)
        sweeps.unfinished(limit=2, after=(1.0, "s-0"))

    plans = _plans(db, work)
    assert len(plans) >= 20  # every call above was seen
    for sql, plan in plans.items():
        steps = [step for step in plan if step.startswith(("SCAN runs", "SCAN sweeps", "SCAN run_purges", "USE TEMP"))]
        assert steps == [], f"{sql}: {plan}"
        assert any(step.startswith(("SEARCH runs", "SEARCH sweeps", "SEARCH run_purges")) for step in plan), (
            f"{sql}: {plan}"
        )


def test_every_query_of_the_secrets_store_searches_its_key(tmp_path):
    db = Database.at(tmp_path / "state")
    secrets = SqliteSecretStore(db)
    sealed = Sealed(key_id="file:0", wrapped_key="", nonce="", ciphertext="")
    for scope in ("user:alice", "user:bob", "group:ml"):
        for i in range(20):
            secrets.put(SecretRecord(scope=scope, name=f"s{i}", sealed=sealed, updated_at=1.0, updated_by="alice"))

    def work():
        secrets.get("user:alice", "s3")
        secrets.list("user:bob")
        secrets.list("group:ml", limit=5)

    plans = _plans(db, work)
    assert len(plans) == 3
    for sql, plan in plans.items():
        assert [step for step in plan if step.startswith(("SCAN", "USE TEMP B-TREE"))] == [], f"{sql}: {plan}"
        assert any(step.startswith("SEARCH secrets") for step in plan), f"{sql}: {plan}"
