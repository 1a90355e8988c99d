"""The SQLite queue across processes, as the stack's processes use it (the front sends, every agent
receives, each with its own connections to one database): a waiting receive wakes when another
process sends, not when its wait ends, and receivers racing on one queue never take the same
message while it is invisible."""

import json
import multiprocessing
import time
import traceback

from runplane.adapters.local.db import Database
from runplane.adapters.local.pools import SqlitePoolStateStore
from runplane.adapters.local.queues import SqliteRunQueue
from runplane.adapters.local.quotas import SqliteQuotaStore
from runplane.adapters.local.tokens import SqliteTokenStore
from runplane.adapters.local.workers import SqliteWorkerRegistry
from runplane.domain.messages import DispatchEvent, RunMessage
from runplane.domain.workers import Worker
from tests.integration.test_local_queries import _plans

WAIT = 30.0
"""How long the waiting receive may wait: the send it must wake for comes long before."""
RECEIVERS = 4
MESSAGES = 120


def _sender(state_dir, go, sent):
    """Send one hint when told to; report when the send returned (or what went wrong)."""
    try:
        queue = SqliteRunQueue(Database.at(state_dir))
        go.wait(timeout=60)
        queue.send("default", RunMessage(run_id="r-woken", attempt=0))
        sent.put((time.time(), None))
    except BaseException:
        sent.put((0.0, traceback.format_exc()))


def test_a_waiting_receive_wakes_when_another_process_sends(tmp_path):
    state_dir = tmp_path / "state"
    queue = SqliteRunQueue(Database.at(state_dir))
    context = multiprocessing.get_context("fork")
    go, sent = context.Event(), context.Queue()
    sender = context.Process(target=_sender, args=(state_dir, go, sent))
    sender.start()
    try:
        assert queue.receive("default", 1, wait_seconds=0.2, visibility_seconds=30) == []  # nothing yet
        go.set()  # the sender sends while this process waits below
        began = time.time()
        got = queue.receive("default", 1, wait_seconds=WAIT, visibility_seconds=30)
        woken = time.time()
        at, error = sent.get(timeout=60)
    finally:
        sender.join(timeout=10)
    assert error is None, error
    assert [d.message.run_id for d in got] == ["r-woken"]
    # woken by the send, not by the end of its wait: a few seconds of slack on a busy machine
    assert woken - at < 5.0 and woken - began < WAIT / 2


def _receiver(state_dir, n, start, results):
    """Receive until the queue stays empty for a second, holding each batch a moment as an agent
    would (so that the others get their turns); report each message's id and receipt."""
    try:
        queue = SqliteRunQueue(Database.at(state_dir))
        start.wait(timeout=60)
        got = []
        while deliveries := queue.receive("default", 2, wait_seconds=1.0, visibility_seconds=300):
            got += [(d.message.run_id, d.receipt, d.receive_count) for d in deliveries]
            time.sleep(0.02)
        results.put((n, got, None))
    except BaseException:
        results.put((n, [], traceback.format_exc()))


def test_receivers_in_many_processes_never_take_a_message_twice_while_it_is_invisible(tmp_path):
    state_dir = tmp_path / "state"
    queue = SqliteRunQueue(Database.at(state_dir))
    for i in range(MESSAGES):
        queue.send("default", RunMessage(run_id=f"r-{i}", attempt=0))
    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(RECEIVERS), context.Queue()
    receivers = [context.Process(target=_receiver, args=(state_dir, n, start, results)) for n in range(RECEIVERS)]
    for receiver in receivers:
        receiver.start()
    got = [results.get(timeout=120) for _ in receivers]
    for receiver in receivers:
        receiver.join(timeout=10)

    assert [error for *_, error in got if error] == []
    taken = [(run_id, count) for _, deliveries, _ in got for run_id, _, count in deliveries]
    assert sorted(run_id for run_id, _ in taken) == sorted(f"r-{i}" for i in range(MESSAGES))  # each once
    assert {count for _, count in taken} == {1}
    assert sum(1 for _, deliveries, _ in got if deliveries) > 1  # they did race: more than one took some
    receipts = [receipt for _, deliveries, _ in got for _, receipt, _ in deliveries]
    assert len(set(receipts)) == MESSAGES


def test_a_waiting_receive_wakes_when_a_message_it_waits_for_turns_visible(tmp_path):
    """No commit comes: the receive wakes because the message it was given back turns visible."""
    queue = SqliteRunQueue(Database.at(tmp_path / "state"))
    queue.send("default", RunMessage(run_id="r-back", attempt=0))
    [first] = queue.receive("default", 1, wait_seconds=1, visibility_seconds=30)
    queue.release("default", first, 1)  # visible again in a second
    began = time.monotonic()
    [again] = queue.receive("default", 1, wait_seconds=WAIT, visibility_seconds=30)
    assert (again.message.run_id, again.receive_count) == ("r-back", 2)
    assert time.monotonic() - began < WAIT / 2


def test_every_query_of_the_queue_and_the_small_stores_searches_an_index(tmp_path):
    """A receive, a delete, a release and the reads of workers, pool records, quotas and tokens are
    each a search of an index (SQLite's plan of each statement as the stores run it): never a scan
    of the table, never a sort, so a receive costs the log of the backlog, not the backlog."""
    db = Database.at(tmp_path / "state")
    queue, workers = SqliteRunQueue(db), SqliteWorkerRegistry(db)
    pools, quotas, tokens = SqlitePoolStateStore(db), SqliteQuotaStore(db), SqliteTokenStore(db)
    for i in range(30):
        queue.send("default" if i % 2 else "other", RunMessage(run_id=f"r-{i}", attempt=0))
        workers.put(Worker(id=f"w-{i}", pool="default" if i % 2 else "other", started_at=1.0, heartbeat_at=2.0))

    def work():
        got = queue.receive("default", 3, wait_seconds=0, visibility_seconds=0)  # visible still: taken once
        queue.delete("default", got[0])
        queue.release("default", got[1], 5)
        queue.receive("default", 1, wait_seconds=0.05, visibility_seconds=30)
        workers.get("w-3")
        workers.list("default")
        workers.page("default", 5, "w-1")
        pools.save(pools.get("default"))
        quotas.save_lane(quotas.lane("default", "alice", 50))
        quotas.usage("user", "alice")
        tokens.lookup("f" * 64)
        tokens.delete("tok-0123456789abcdef")

    plans = _plans(db, work)
    assert len(plans) >= 12  # every call above was seen
    for sql, plan in plans.items():
        assert [step for step in plan if step.startswith(("SCAN ", "USE TEMP B-TREE"))] == [], f"{sql}: {plan}"
        assert any(step.startswith("SEARCH ") for step in plan), f"{sql}: {plan}"


def test_events_handled_together_are_deleted_in_one_write_and_a_receipt_received_again_since_deletes_nothing(
    tmp_path,
):
    db = Database.at(tmp_path / "state")
    queue = SqliteRunQueue(db)
    for pool in ("a", "b", "c"):
        queue.notify(DispatchEvent(pool=pool))
    first = queue.receive_events(10, 0, 0)  # visibility 0: all three stay visible, under these receipts
    assert [json.loads(d.body)["pool"] for d in first] == ["a", "b", "c"]
    again = queue.receive_events(1, 0, 0)  # "a" received again: its first receipt is stale
    assert json.loads(again[0].body)["pool"] == "a"

    before = db.mark()[0]
    queue.delete_events([d.receipt for d in first])
    assert db.mark()[0] == before + 1  # one commit for the batch

    left = queue.receive_events(10, 0, 30)
    assert [json.loads(d.body)["pool"] for d in left] == ["a"]
    queue.delete_events([])  # nothing handled: nothing written
    assert db.mark()[0] == before + 2  # the receive's commit, and none for the empty delete
