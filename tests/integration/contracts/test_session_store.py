"""Contract of the sessions store (``SessionStore``, runplane/ports.py), the same on every stack
(``Stack.sessions``: SQLite, DynamoDB ``PREFIX-sessions``, Table storage ``PREFIXsessions``):

- one session per slot of a run: ``create`` takes a slot that is empty or holds a session that is
  over, and answers Conflict (naming the session, ``details['session']``) while a live one holds it;
  of writers racing for the slots of one run, each slot goes to exactly one (the per-run cap is one
  conditional write).
- ``get`` is the session of that id, NotFound once its slot holds another one, and NotFound (never
  a store's error) for text that is no session id.
- ``update`` writes only while the stored session is that one in one of the states asked for:
  ConditionFailed (``details['session']`` as stored) otherwise; of updates racing out of one state,
  exactly one wins. Fields that never change are refused.
- ``for_run`` lists the run's sessions by slot, live and over, none of another run's.
- a session written by a later release (a field this one does not know) reads, and an update
  writes that field back; one this release cannot read (a kind added later) is not listed, not
  found, and holds its slot (never an error of the store).
- the largest command a session may hold (MAX_COMMAND_BYTES, of the characters JSON spells longest)
  is stored whole: under DynamoDB's 400 KB item, over more than one Table storage property.
- ``forget`` deletes a run's sessions, live and over, and no other run's; again, it finds none.
- a stack made by a release without sessions gets the table from provisioning it again.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from azure.data.tables import UpdateMode

from runplane.adapters.aws.provision import provision
from runplane.adapters.azure.provision import provision as provision_azure
from runplane.adapters.azure.tables import pack, unpack
from runplane.bootstrap import aws_clients, aws_names, azure_clients, azure_names
from runplane.domain.errors import BackendError, ConditionFailed, Conflict, NotFound
from runplane.domain.sessions import MAX_COMMAND_BYTES, OVER, Session, SessionKind, SessionState, new_secret, session_id
from runplane.domain.wire import stored, written

CAP = 4


def new_run_id() -> str:
    return f"r-{uuid.uuid4().hex[:24]}"


def make(run_id: str, slot: int, **fields) -> Session:
    now = time.time()
    made = {
        "id": session_id(run_id, slot),
        "run_id": run_id,
        "slot": slot,
        "attempt": 1,
        "owner": "alice",
        "asked_by": "alice",
        "kind": SessionKind.EXEC,
        "command": ["sh", "-c", "echo hi"],
        "relay": "ws://127.0.0.1:8000/v1/relay",
        "client_secret_hash": new_secret()[1],
        "created_at": now,
        "expires_at": now + 60,
    }
    return Session(**{**made, **fields})


def test_sessions_are_kept_by_slot_and_listed_by_run(stack):
    store = stack.sessions
    run, other = new_run_id(), new_run_id()
    made = {slot: store.create(make(run, slot)) for slot in (2, 0, 1)}
    store.create(make(other, 0))
    assert [s.id for s in store.for_run(run)] == [made[0].id, made[1].id, made[2].id]
    assert store.get(made[1].id) == made[1]
    assert store.for_run(new_run_id()) == []
    for missing in (session_id(run, 3), session_id(run, 1), "../etc", f"{run}.99.zzzzzzzz", ""):
        with pytest.raises(NotFound):
            store.get(missing)


def test_a_live_session_holds_its_slot_and_one_over_frees_it(stack):
    store = stack.sessions
    run = new_run_id()
    first = store.create(make(run, 0))
    with pytest.raises(Conflict) as refused:
        store.create(make(run, 0))
    assert refused.value.details["session"] == first
    accepted = store.update(first, frozenset({SessionState.REQUESTED}), {"state": SessionState.ACCEPTED})
    with pytest.raises(Conflict):
        store.create(make(run, 0))  # accepted is live too
    store.update(accepted, frozenset({SessionState.ACCEPTED}), {"state": SessionState.ENDED, "end_reason": "closed"})
    second = store.create(make(run, 0))
    assert store.get(second.id) == second
    with pytest.raises(NotFound):
        store.get(first.id)
    with pytest.raises(NotFound):  # an update of the session the slot held before
        store.update(first, frozenset(SessionState), {"state": SessionState.ENDED})
    assert [s.id for s in store.for_run(run)] == [second.id]


@pytest.mark.parametrize("over", sorted(OVER))
def test_every_state_that_is_over_frees_the_slot(stack, over):
    store = stack.sessions
    run = new_run_id()
    store.create(make(run, 1, state=over))
    assert store.create(make(run, 1)).state == SessionState.REQUESTED


def test_update_is_conditional_on_the_state(stack):
    store = stack.sessions
    run = new_run_id()
    session = store.create(make(run, 0))
    changes = {"state": SessionState.ACCEPTED, "worker_id": "w-1", "worker_secret_hash": new_secret()[1]}
    accepted = store.update(session, frozenset({SessionState.REQUESTED}), changes)
    assert (accepted.state, accepted.worker_id) == (SessionState.ACCEPTED, "w-1")
    assert store.get(session.id) == accepted
    with pytest.raises(ConditionFailed) as lost:
        store.update(session, frozenset({SessionState.REQUESTED}), {"state": SessionState.EXPIRED})
    assert lost.value.details["session"] == accepted
    assert store.get(session.id).state == SessionState.ACCEPTED
    ended = store.update(
        session,
        frozenset({SessionState.ACCEPTED, SessionState.ACTIVE}),
        {"state": SessionState.ENDED, "exit_code": 3, "end_reason": "exited", "ended_at": time.time()},
    )
    assert store.for_run(run) == [ended]
    assert (ended.exit_code, ended.worker_id) == (3, "w-1")
    for fixed in (
        {"id": session_id(run, 0)},
        {"slot": 2},
        {"owner": "mallory"},
        {"command": ["sh"]},
        {"no_such_field": 1},
    ):
        with pytest.raises(ValueError):
            store.update(ended, frozenset(SessionState), fixed)


def test_a_session_of_a_later_release_reads_and_keeps_its_fields(stack):
    store = stack.sessions
    later = stored(Session, {**written(make(new_run_id(), 0)), "channels_opened": 7, "kind": "exec"})
    store.create(later)
    found = store.get(later.id)
    assert found.model_extra == {"channels_opened": 7}
    updated = store.update(found, frozenset({SessionState.REQUESTED}), {"state": SessionState.ACCEPTED})
    assert written(store.get(later.id))["channels_opened"] == 7
    assert written(updated)["channels_opened"] == 7


def rewrite_stored(stack, session: Session, **fields) -> None:
    """Change the stored session's fields past the store, as a later release's writer would."""
    cloud = stack.settings.cloud
    if cloud == "local":
        with stack.sessions.db.write() as c:
            where = (session.run_id, session.slot)
            (data,) = c.execute("SELECT data FROM sessions WHERE run_id = ? AND slot = ?", where).fetchone()
            c.execute(
                "UPDATE sessions SET data = ? WHERE run_id = ? AND slot = ?",
                (json.dumps({**json.loads(data), **fields}), *where),
            )
    elif cloud == "azure":
        table = stack.sessions.table
        entity = table.get_entity(session.run_id, f"{session.slot:02d}")
        table.upsert_entity({**entity, **pack({**unpack(entity), **fields}, "session")}, mode=UpdateMode.REPLACE)
    else:
        client, table = stack.sessions.client, stack.sessions.table
        key = {"run_id": {"S": session.run_id}, "slot": {"N": str(session.slot)}}
        doc = json.loads(client.get_item(TableName=table, Key=key)["Item"]["doc"]["S"])
        client.update_item(
            TableName=table,
            Key=key,
            UpdateExpression="SET doc = :doc",
            ExpressionAttributeValues={":doc": {"S": json.dumps({**doc, **fields})}},
        )


def test_a_session_this_release_cannot_read_is_left_alone(stack):
    store = stack.sessions
    run = new_run_id()
    unknown, known = store.create(make(run, 0)), store.create(make(run, 1))
    rewrite_stored(stack, unknown, kind="debugger")
    assert store.for_run(run) == [known]
    with pytest.raises(NotFound):
        store.get(unknown.id)
    with pytest.raises(NotFound):
        store.update(unknown, frozenset(SessionState), {"state": SessionState.ENDED})
    with pytest.raises(Conflict):
        store.create(make(run, 0))


def test_forget_deletes_a_runs_sessions_and_no_others(stack):
    store = stack.sessions
    run, other = new_run_id(), new_run_id()
    for slot in range(3):
        store.create(make(run, slot, state=SessionState.ENDED if slot else SessionState.ACTIVE))
    kept = store.create(make(other, 0))
    assert store.forget(run) == 3
    assert store.for_run(run) == []
    assert store.for_run(other) == [kept]
    assert store.forget(run) == 0
    assert store.create(make(run, 0)).slot == 0


def test_the_largest_command_is_stored_whole(stack):
    command = ["\x1b" * (MAX_COMMAND_BYTES // 2), "é" * (MAX_COMMAND_BYTES // 4)]  # 6 and 2 bytes each as JSON
    assert sum(len(arg.encode()) for arg in command) == MAX_COMMAND_BYTES
    session = stack.sessions.create(make(new_run_id(), 3, command=command))
    assert stack.sessions.get(session.id).command == command
    ended = stack.sessions.update(session, frozenset({SessionState.REQUESTED}), {"state": SessionState.EXPIRED})
    assert stack.sessions.for_run(session.run_id) == [ended]


def test_racing_creates_fill_each_slot_once(racing_stack):
    store = racing_stack.sessions
    run = new_run_id()
    start = threading.Barrier(8)

    def ask(_: int) -> Session | None:
        start.wait()
        for slot in range(CAP):  # as the service looks for a free slot
            try:
                return store.create(make(run, slot))
            except Conflict:
                continue
        return None

    with ThreadPoolExecutor(8) as pool:
        won = [s for s in pool.map(ask, range(8)) if s is not None]
    assert sorted(s.slot for s in won) == list(range(CAP))
    assert [s.id for s in store.for_run(run)] == [s.id for s in sorted(won, key=lambda s: s.slot)]


def test_racing_updates_out_of_one_state_have_one_winner(racing_stack):
    store = racing_stack.sessions
    session = store.create(make(new_run_id(), 0))
    start = threading.Barrier(8)

    def take(worker: int) -> str | None:
        start.wait()
        changes = {"state": SessionState.ACCEPTED, "worker_id": f"w-{worker}"}
        try:
            return store.update(session, frozenset({SessionState.REQUESTED}), changes).worker_id
        except ConditionFailed:
            return None

    with ThreadPoolExecutor(8) as pool:
        winners = [w for w in pool.map(take, range(8)) if w is not None]
    assert len(winners) == 1
    assert store.get(session.id).worker_id == winners[0]


def test_provisioning_a_stack_made_without_sessions_adds_their_table(aws_stack, azure_stack):
    pools = [p.name for p in aws_stack.pools.pools]
    aws = aws_clients(aws_stack.settings)
    aws["dynamodb"].delete_table(TableName=aws_names(aws_stack.settings).sessions_table)
    azure = azure_clients(azure_stack.settings)
    azure.tables.delete_table(azure_names(azure_stack.settings).sessions_table)
    for stack in (aws_stack, azure_stack):
        with pytest.raises(BackendError):  # as on a stack of the previous release
            stack.sessions.for_run(new_run_id())
    provision(aws_names(aws_stack.settings), pools, aws["dynamodb"], aws["sqs"], aws["s3"])
    provision_azure(azure_names(azure_stack.settings), pools, azure)
    for stack in (aws_stack, azure_stack):
        session = stack.sessions.create(make(new_run_id(), 0))
        assert stack.sessions.get(session.id) == session
