"""What the retention sweep needs of the one-machine stack's stores, beyond the contract every store
passes (tests/integration/contracts/test_retention_stores.py): a database of an earlier release gets
its sweep index filled from the runs already there when it is first opened, and only then, and a run
an agent of that release ends is indexed all the same; deleting
objects removes the folders it empties without ever failing a put that races it into one of them;
keys are checked before anything is deleted."""

import base64
import hashlib
import json
import sqlite3
import threading
from io import BytesIO
from urllib.parse import urlsplit

import pytest

from runplane.adapters.local.db import Database
from runplane.adapters.local.files import FileObjectStore
from runplane.adapters.local.object_urls import serve
from runplane.adapters.local.runs import DDL, SqliteRunStore
from runplane.adapters.records import written_json
from runplane.domain.errors import BadRequest, NotFound
from runplane.domain.expect import Expect
from runplane.domain.retention import RunRetention, purge_due
from runplane.domain.runs import Run, RunSpec
from runplane.domain.states import RunState
from runplane.ports import MAX_DELETE

_EARLIER = [  # (state, finished_at, kept) of runs a database of an earlier release holds
    (RunState.QUEUED, None, False),
    (RunState.RUNNING, None, False),
    (RunState.SUCCEEDED, 5000.0, False),
    (RunState.FAILED, 3000.0, False),
    (RunState.KILLED, None, False),  # killed before it started: due from its creation
    (RunState.TIMED_OUT, 4000.0, False),
    (RunState.SUCCEEDED, 2000.0, True),
]


def _purges(path) -> dict[str, float]:
    with sqlite3.connect(path) as c:
        return dict(c.execute("SELECT run_id, due FROM run_purges").fetchall())


def test_a_database_of_an_earlier_release_gets_its_finished_runs_indexed_once(tmp_path):
    root = tmp_path / "state"
    Database(root)  # the file, as an earlier release made it: its runs table and nothing of the sweep's
    runs = []
    with sqlite3.connect(root / "state.db") as c:
        c.executescript(DDL)
        for i, (state, finished_at, kept) in enumerate(_EARLIER):
            run = Run(id=f"r-{i}", owner="alice", queue="default", spec=RunSpec(command="true"), created_at=100.0 + i)
            run = run.model_copy(update={"state": state, "finished_at": finished_at, "kept": kept})
            data = json.loads(written_json(run))
            data.pop("retention", None)
            if not kept:
                data.pop("kept", None)
            c.execute(
                "INSERT INTO runs (id, owner, queue, state, listed, created_at, rank, data)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (run.id, run.owner, run.queue, str(state), str(state), run.created_at, None, json.dumps(data)),
            )
            runs.append(run)

    store = SqliteRunStore(Database(root))

    expected = {run.id: due for run in runs if (due := purge_due(run)) is not None}
    assert expected == {"r-2": 5000.0, "r-3": 3000.0, "r-4": 104.0, "r-5": 4000.0}
    assert _purges(root / "state.db") == expected
    assert [r.id for r in store.due("default", 1e10)] == ["r-4", "r-3", "r-5", "r-2"]
    # the sweep dates one; a process that opens the database later leaves the index as it is
    dated = RunRetention(checked_at=6000.0, outputs_at=9000.0)
    store.update(store.get("r-2"), Expect(), {"retention": dated})
    SqliteRunStore(Database(root))
    assert _purges(root / "state.db") == {**expected, "r-2": 9000.0}
    # an agent of the earlier release ends the running run as its store writes it: no row of its own
    ended = store.get("r-1").model_copy(update={"state": RunState.SUCCEEDED, "finished_at": 7000.0})
    with sqlite3.connect(root / "state.db") as c:
        c.execute(
            "UPDATE runs SET state = ?, listed = ?, data = ? WHERE id = ?",
            ("succeeded", "succeeded", written_json(ended), "r-1"),
        )
    assert _purges(root / "state.db") == {**expected, "r-2": 9000.0, "r-1": 7000.0}


def _objects(tmp_path) -> FileObjectStore:
    return FileObjectStore(tmp_path / "state", "data", lambda: b"k" * 32, "http://127.0.0.1:1")


def test_deleting_objects_removes_the_folders_it_empties_and_checks_every_key_first(tmp_path):
    objects = _objects(tmp_path)
    bucket = tmp_path / "state" / "objects" / "data"
    objects.put_bytes("runs/r1/outputs/1/live/plot.png", b"p")
    objects.put_bytes("runs/r1/outputs/1/model.bin", b"m")
    objects.put_bytes("runs/r1/logs/1/stdout", b"l")

    with pytest.raises(BadRequest):
        objects.delete(["runs/r1/logs/1/stdout", "runs/../../state.db"])
    with pytest.raises(ValueError):
        objects.delete(["runs/r1/logs/1/stdout"] * (MAX_DELETE + 1))
    assert objects.get_bytes("runs/r1/logs/1/stdout") == b"l"  # nothing deleted by a refused call

    objects.delete(["runs/r1/outputs/1/live/plot.png", "runs/r1/outputs/1/model.bin", "runs/r1/outputs"])
    assert not (bucket / "runs" / "r1" / "outputs").exists()
    assert [o.key for o in objects.list("runs/")] == ["runs/r1/logs/1/stdout"]
    objects.delete(["runs/r1/logs/1/stdout"])
    assert list(bucket.iterdir()) == []  # the bucket itself stays
    objects.put_bytes("runs/r1/outputs/1/model.bin", b"again")
    assert objects.get_bytes("runs/r1/outputs/1/model.bin") == b"again"
    with pytest.raises(NotFound):
        objects.touch("runs/r1/outputs/1")  # a folder is no object


@pytest.mark.parametrize("put", ["store", "signed-url"])
def test_a_put_racing_deletes_that_empty_its_folder_is_stored(tmp_path, put):
    """A delete of a folder's last object removes the folder; a put (the store's, or a PUT of a
    signed URL the front answers) that opened or made it a moment before stores its object all the
    same."""
    objects = _objects(tmp_path)
    key = "uploads/alice/" + "c" * 64
    body = b"archive"
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()

    def store() -> None:
        if put == "store":
            objects.put_bytes(key, body)
            return
        url, headers = objects.put_url(key, len(body), md5)
        parsed = urlsplit(url)
        answer = serve(
            objects.root, objects.secret, "PUT", parsed.path, parsed.query, headers=headers, body=BytesIO(body)
        )
        assert answer.status == 200, answer.body

    stop = threading.Event()
    failed: list[BaseException] = []

    def delete():
        while not stop.is_set():
            objects.delete([key])

    deleter = threading.Thread(target=delete)
    deleter.start()
    try:
        for _ in range(300):
            try:
                store()
            except Exception as e:
                failed.append(e)
    finally:
        stop.set()
        deleter.join(timeout=60)
    assert failed == []
    store()
    assert objects.get_bytes(key) == body
