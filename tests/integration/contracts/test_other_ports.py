"""Contracts of RunQueue, ObjectStore, WorkerRegistry and TokenStore."""

import urllib.request

import pytest

from runplane.domain.errors import NotFound
from runplane.domain.models import Principal, RunMessage, Worker


def test_queue_send_receive_delete(stack):
    stack.queue.send("default", RunMessage(run_id="r-1", attempt=0))
    stack.queue.send("default", RunMessage(run_id="r-2", attempt=3))
    got = []
    for _ in range(5):
        got += stack.queue.receive("default", 10, wait_seconds=1, visibility_seconds=30)
        if len(got) == 2:
            break
    assert sorted((d.message.run_id, d.message.attempt) for d in got) == [("r-1", 0), ("r-2", 3)]
    assert all(d.receive_count == 1 for d in got)
    for d in got:
        stack.queue.delete("default", d)
        stack.queue.delete("default", d)  # idempotent
    assert stack.queue.receive("default", 10, wait_seconds=0, visibility_seconds=30) == []


def test_queue_redelivers_after_visibility_timeout(stack):
    stack.queue.send("parked", RunMessage(run_id="r-9", attempt=0))
    first = stack.queue.receive("parked", 1, wait_seconds=1, visibility_seconds=1)
    assert len(first) == 1
    import time

    time.sleep(1.5)
    again = stack.queue.receive("parked", 1, wait_seconds=2, visibility_seconds=30)
    assert [d.message.run_id for d in again] == ["r-9"]
    assert again[0].receive_count == 2


def test_queue_drops_unreadable_messages(stack, send_raw):
    send_raw("default", "{not json")
    stack.queue.send("default", RunMessage(run_id="r-ok", attempt=0))
    got = []
    for _ in range(4):
        got += stack.queue.receive("default", 10, wait_seconds=1, visibility_seconds=30)
    assert [d.message.run_id for d in got] == ["r-ok"]


def test_queue_sets_a_message_aside_after_five_receives(stack, dead_letters):
    stack.queue.send("parked", RunMessage(run_id="r-poison", attempt=2))
    counts = []
    for _ in range(5):
        got = stack.queue.receive("parked", 1, wait_seconds=2, visibility_seconds=30)
        assert [d.message.run_id for d in got] == ["r-poison"]
        counts.append(got[0].receive_count)
        stack.queue.release("parked", got[0], 0)  # back, visible at once
    assert counts == [1, 2, 3, 4, 5]
    assert stack.queue.receive("parked", 1, wait_seconds=1, visibility_seconds=30) == []
    [body] = dead_letters("parked")
    assert RunMessage.model_validate_json(body) == RunMessage(run_id="r-poison", attempt=2)


def test_queue_release(stack):
    stack.queue.send("parked", RunMessage(run_id="r-done", attempt=0))
    [done] = stack.queue.receive("parked", 1, wait_seconds=2, visibility_seconds=30)
    stack.queue.delete("parked", done)
    stack.queue.release("parked", done, 0)  # quiet: the message is gone
    stack.queue.send("parked", RunMessage(run_id="r-later", attempt=0))
    [later] = stack.queue.receive("parked", 1, wait_seconds=2, visibility_seconds=30)
    stack.queue.release("parked", later, 30)
    assert stack.queue.receive("parked", 1, wait_seconds=0, visibility_seconds=30) == []


def test_queue_unknown_pool(stack):
    with pytest.raises(NotFound, match="does not exist"):
        stack.queue.send("nope", RunMessage(run_id="r", attempt=0))


def test_objects_put_get_list_url(stack, tmp_path):
    stack.objects.put_bytes("runs/a/logs/1/stdout/0000000000000000", b"hello ")
    stack.objects.put_bytes("runs/a/logs/1/stdout/0000000000000006", b"world")
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (17 * 2**20))  # over the multipart threshold
    stack.objects.put_file("runs/a/outputs/1/big.bin", big)
    listed = stack.objects.list("runs/a/")
    assert [(o.key, o.size) for o in listed] == [
        ("runs/a/logs/1/stdout/0000000000000000", 6),
        ("runs/a/logs/1/stdout/0000000000000006", 5),
        ("runs/a/outputs/1/big.bin", 17 * 2**20),
    ]
    assert stack.objects.get_bytes("runs/a/logs/1/stdout/0000000000000006") == b"world"
    with urllib.request.urlopen(stack.objects.url("runs/a/logs/1/stdout/0000000000000000"), timeout=10) as r:
        assert r.read() == b"hello "
    back = tmp_path / "back.bin"
    stack.objects.download_file("runs/a/outputs/1/big.bin", back)
    assert back.read_bytes() == big.read_bytes()
    with pytest.raises(NotFound):
        stack.objects.get_bytes("runs/a/nothing")
    assert stack.objects.list("runs/none/") == []


def test_worker_registry(stack):
    w = Worker(id="w-1", pool="default", slots=2, free_slots=1, runs=["r-1"], started_at=1.0, heartbeat_at=2.0)
    stack.workers.put(w)
    stack.workers.put(Worker(id="w-2", pool="parked", started_at=1.0, heartbeat_at=2.0))
    assert stack.workers.get("w-1") == w
    assert [x.id for x in stack.workers.list("default")] == ["w-1"]
    assert [x.id for x in stack.workers.list()] == ["w-1", "w-2"]
    stack.workers.delete("w-1")
    stack.workers.delete("w-1")
    with pytest.raises(NotFound):
        stack.workers.get("w-1")


def test_token_store(stack):
    assert stack.tokens.lookup("abc") is None
    stack.tokens.put("abc", Principal(user="alice", scopes=["runs:read"]))
    assert stack.tokens.lookup("abc") == Principal(user="alice", scopes=["runs:read"])
