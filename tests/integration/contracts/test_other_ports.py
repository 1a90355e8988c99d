"""Contracts of RunQueue, ObjectStore, WorkerRegistry and TokenStore."""

import copy
import json
import re
import urllib.request
import uuid
from itertools import chain

import pytest

from runplane.bootstrap import make_ports
from runplane.domain.errors import NotFound
from runplane.domain.messages import RunMessage
from runplane.domain.tenancy import ApiToken
from runplane.domain.versions import StackRecord
from runplane.domain.workers import Worker
from runplane.services import skew
from runplane.services.auth import authenticate, hash_token
from runplane.services.tenancy import create_token


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
        # a browser saves it, never shows it as a page (the local front also names the file)
        assert r.headers["Content-Disposition"].split(";")[0] == "attachment"
    back = tmp_path / "back.bin"
    stack.objects.download_file("runs/a/outputs/1/big.bin", back)
    assert back.read_bytes() == big.read_bytes()
    with pytest.raises(NotFound):
        stack.objects.get_bytes("runs/a/nothing")
    assert stack.objects.list("runs/none/") == []


def test_objects_errors_are_the_ports_errors(stack, tmp_path):
    """A store whose bucket (container) is gone answers BackendError for every call, never the
    SDK's own exceptions: callers catch RunplaneError only."""
    from runplane.domain.errors import BackendError

    objects = copy.copy(stack.objects)
    setattr(objects, "bucket" if hasattr(objects, "bucket") else "container", f"gone-{uuid.uuid4().hex[:8]}")
    small = tmp_path / "small.txt"
    small.write_bytes(b"x")
    for call, what in (
        (lambda: objects.put_file("runs/a/outputs/1/small.txt", small), "upload runs/a/outputs/1/small.txt: "),
        (lambda: objects.put_bytes("runs/a/logs/1/stdout/0", b"x"), "upload runs/a/logs/1/stdout/0: "),
        (lambda: objects.list("runs/a/"), "list runs/a/: "),
    ):
        with pytest.raises(BackendError, match=f"^{re.escape(what)}.*(NoSuchBucket|does not exist)"):
            call()


def test_objects_are_listed_and_paged_in_key_order(stack):
    """Key order is the order of the keys' characters wherever a '/' falls ('a-c' and 'a.x' before
    'a/a'), in a whole listing and across pages; a prefix need not end at a '/'."""
    for key in ("p/ab", "p/a/b/c", "p/a-c", "p/a/a", "p/a.x", "q/a"):
        stack.objects.put_bytes(key, key.encode())
    ordered = ["p/a-c", "p/a.x", "p/a/a", "p/a/b/c", "p/ab"]
    assert [o.key for o in stack.objects.list("p/")] == ordered
    assert [o.key for o in stack.objects.list("p/a")] == ordered
    assert [o.key for o in stack.objects.list("p/a/")] == ["p/a/a", "p/a/b/c"]
    assert [(o.key, o.size) for o in stack.objects.list("p/a/b/c")] == [("p/a/b/c", 7)]
    pages, cursor = [], None
    while True:
        found, cursor = stack.objects.list_page("p/", cursor, 2)
        pages.append([o.key for o in found])
        if cursor is None:
            break
    assert pages == [ordered[:2], ordered[2:4], ordered[4:]]


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


def test_the_stack_record_is_kept_where_agents_read_it_and_no_workers_listing_meets_it(stack):
    """The control plane's record for its agents: none until written, then the last one written, in
    the object store agents read; one this release cannot read counts as none. The workers table
    holds workers alone: 0.1's functions list workers by reading the whole table and refuse an item
    that is no worker."""
    assert skew.stack_record(stack.objects) is None
    stack.workers.put(Worker(id="w-1", pool="default", started_at=1.0, heartbeat_at=2.0))
    skew.put_stack_record(stack.objects, StackRecord(version="0.2.0", oldest_agent="0.1", written_at=5.0))
    skew.put_stack_record(stack.objects, StackRecord(version="0.3.1", oldest_agent="0.2", written_at=6.0))
    assert skew.stack_record(stack.objects) == StackRecord(version="0.3.1", oldest_agent="0.2", written_at=6.0)
    assert [w.id for w in stack.workers.list()] == ["w-1"]
    if stack.settings.cloud == "azure":
        whole = [e["RowKey"] for e in stack.workers.table.list_entities()]
    elif stack.settings.cloud == "local":
        whole = [row[0] for row in stack.workers.db.connection().execute("SELECT id FROM workers")]
    else:
        whole = [i["id"]["S"] for i in stack.workers.client.scan(TableName=stack.workers.table)["Items"]]
    assert len(whole) == 1  # what 0.1's listing reads: the one worker
    stack.objects.put_bytes(skew.STACK_KEY, b'{"version": 3}')
    assert skew.stack_record(stack.objects) is None


def test_worker_registry_pages_cover_every_worker_once(stack):
    """Pages of three: each worker on exactly one page, a pool's pages hold only its workers, and
    a cursor past the end, or naming a worker that is gone, is not an error."""
    for i in range(8):
        stack.workers.put(Worker(id=f"w-p{i}", pool=("default", "parked")[i % 2], started_at=1.0, heartbeat_at=2.0))

    def walk(pool):
        pages, after = [], None
        while True:
            found, after = stack.workers.page(pool, 3, after)
            pages.append([w.id for w in found])
            assert len(found) <= 3
            if after is None:
                return pages
            assert len(pages) < 10, "the pages never end"

    every = walk(None)
    assert sorted(chain.from_iterable(every)) == [f"w-p{i}" for i in range(8)]
    assert all(len(page) == 3 for page in every[:-1])
    parked = walk("parked")
    assert sorted(chain.from_iterable(parked)) == ["w-p1", "w-p3", "w-p5", "w-p7"]
    assert stack.workers.page("nowhere", 3) == ([], None)
    stack.workers.delete("w-p2")
    cut = every[0][-1]  # a cursor naming a worker that has gone since still resumes after it
    stack.workers.delete(cut)
    rest, after = [], cut
    while after is not None:
        found, after = stack.workers.page(None, 3, after)
        rest += [w.id for w in found]
    assert sorted(rest) == sorted(w for w in chain.from_iterable(every[1:]) if w != "w-p2")


def token(token_id, user="alice", created_at=1.0, **extra):
    return ApiToken(id=token_id, user=user, scopes=["runs:read"], created_at=created_at, **extra)


def test_token_store(stack):
    tokens = stack.tokens.inner  # the store itself, not the per-process cache around it
    assert tokens.lookup("abc") is None
    alice = token("tok-00000000000000a1", groups=["vision"], expires_at=99.0, created_by="root")
    tokens.put("abc", alice)
    tokens.put("def", token("tok-00000000000000b0", "bob", created_at=0.5))
    assert tokens.lookup("abc") == alice
    assert [t.id for t in tokens.list()] == ["tok-00000000000000b0", "tok-00000000000000a1"]  # oldest first
    assert tokens.delete("tok-00000000000000a1") is True
    assert tokens.delete("tok-00000000000000a1") is False  # idempotent
    assert tokens.lookup("abc") is None
    assert [t.user for t in tokens.list()] == ["bob"]


def test_token_store_fails_closed_on_records_that_are_not_tokens(stack, request):
    """A record written by hand or by an older version (no id or scopes, a scope no one grants)
    is no token at all: lookup says None, the listing leaves it out. One with empty scopes is a
    token that may do nothing."""
    tokens = stack.tokens.inner
    bad = [
        {"user": "mallory"},
        {"id": "tok-00000000000000c2", "user": "mallory", "scopes": ["root"], "created_at": 1},
        {"id": "tok-00000000000000c1", "user": "mallory", "scopes": [], "created_at": 1},
    ]
    for i, doc in enumerate(bad):
        if request.node.callspec.params["stack"] == "aws-moto":
            item = {"token_hash": {"S": f"bad{i}"}, "doc": {"S": json.dumps(doc)}}
            tokens.client.put_item(TableName=tokens.table, Item=item)
        elif request.node.callspec.params["stack"] == "local-sqlite":
            with tokens.db.write() as c:
                c.execute(
                    "INSERT INTO tokens (token_hash, id, data) VALUES (?, ?, ?)", (f"bad{i}", "", json.dumps(doc))
                )
        else:
            tokens.table.upsert_entity({"PartitionKey": f"bad{i}", "RowKey": "", "doc": json.dumps(doc)})
    assert [tokens.lookup(f"bad{i}") for i in range(2)] == [None, None]
    powerless = tokens.lookup("bad2")
    assert powerless is not None and powerless.scopes == [] and not powerless.principal().can("runs:read")
    assert [t.id for t in tokens.list()] == ["tok-00000000000000c1"]


def raw_token_records(stack, request):
    """Every record of the token table as the store holds it, read past the adapter."""
    tokens = stack.tokens.inner
    if request.node.callspec.params["stack"] == "aws-moto":
        return tokens.client.scan(TableName=tokens.table)["Items"]
    if request.node.callspec.params["stack"] == "local-sqlite":
        c = tokens.db.connection()
        return [list(row) for row in c.execute("SELECT * FROM tokens")] + [
            [name, secret.hex()] for name, secret in c.execute("SELECT * FROM stack_secret")
        ]
    return [dict(entity) for entity in tokens.table.list_entities()]


def test_tokens_are_stored_only_as_hashes(stack, request):
    """What ``POST /v1/tokens`` stores: the SHA-256 of the secret as the record's key and no
    trace of the secret itself anywhere in the table (read directly); the secret still signs in."""
    made = [
        create_token(make_ports(stack, lambda: 1000.0), user=user, groups=["vision"], created_by="admin")
        for user in ("alice", "bob")
    ]
    stack.tokens.inner.secret()  # the stack's own item is in the same table
    records = raw_token_records(stack, request)
    assert len(records) == 3
    text = json.dumps(records, default=str)
    for new in made:
        assert new.secret.startswith("rp_") and new.secret not in text
        assert new.secret.removeprefix("rp_") not in text
        assert hash_token(new.secret) in text
        assert authenticate(stack.tokens.inner, f"Bearer {new.secret}", now=1001.0).user == new.token.user


def test_the_stack_secret_is_made_once(stack):
    """Every instance reads the same secret: the first one to need it makes it with a conditional
    write, the others read that one (and a token lookup never returns it)."""
    first = stack.tokens.inner.secret()
    assert len(first) == 32
    assert stack.tokens.inner.secret() == first
    assert stack.tokens.inner.lookup(type(stack.tokens.inner).SECRET_KEY) is None
    assert stack.tokens.inner.list() == []


def test_the_stack_secret_race_has_one_winner(racing_stack):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        secrets = list(pool.map(lambda _: racing_stack.tokens.inner.secret(), range(8)))
    assert len(set(secrets)) == 1
