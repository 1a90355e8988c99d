"""A run's checkpoint against a hostile second user, on both clouds' local stacks: another user's
run's checkpoint route and a ``from_checkpoint`` of another user's run answer exactly as for a run
that does not exist and leak nothing; a run with no checkpoint yet is a 404 on the route and a 409 at
submit; a cursor that is not one a page gave (malformed, or naming another run's series) is a 400; a
checkpoint rule that cannot be is a 422 naming what is wrong.

The checkpoints are synced into the stack's object store as a worker syncs them (``worker_agent.checkpoints``).
"""

import json
import urllib.request
import uuid

import pytest

from runplane import bootstrap
from runplane.client import Client
from runplane.domain.cursors import encode_cursor
from runplane.settings import StackSettings
from tests.security.conftest import bearer, raw
from worker_agent.checkpoints import prune, sync

PARKED = {"command": "echo hi", "queue": "parked"}


@pytest.fixture(scope="module")
def objects(front):
    """The object store behind ``front`` (the one its API presigns URLs of)."""
    if front.config.cloud == "local":
        return bootstrap.stack().objects  # the embedded stack serves this process's handlers
    settings = StackSettings(
        cloud="azure",
        prefix=front.config.prefix,
        azure_storage_connection_string=front.config.azure_connection_string,
        pools=front.config.pools_file,
    )
    return bootstrap.build_stack(settings).objects


def ended_run(client, **fields):
    """A run of ``client``'s that no worker took, killed: its record stays, nothing writes to it."""
    run = client.request("POST", "/v1/runs", {**PARKED, **fields})
    client.request("POST", f"/v1/runs/{run['id']}/kill")
    return run


def checkpoint(objects, run_id, tmp_path, files):
    """A checkpoint of ``run_id``'s series holding ``files`` (path -> bytes) and an empty directory."""
    directory = tmp_path / uuid.uuid4().hex
    (directory / "empty").mkdir(parents=True)
    for path, data in files.items():
        (directory / path).parent.mkdir(parents=True, exist_ok=True)
        (directory / path).write_bytes(data)
    return sync(objects, run_id, directory, None, attempt=1)


def alike(front, headers, method, path_of, their_id, body_of=None):
    """The answer to ``headers``' request about ``their_id``, asserted the same (but the id) as about
    a run id that does not exist."""
    missing = "r-" + uuid.uuid4().hex[:24]
    answers = []
    for run_id in (their_id, missing):
        data = json.dumps(body_of(run_id)).encode() if body_of else None
        status, _, answer = raw(front, method, path_of(run_id), data, headers)
        answers.append((status, json.dumps(answer).replace(run_id, "ID")))
    assert answers[0] == answers[1]
    return answers[0]


FILES = {"model.pt": b"weights" * 100, "step": b"41\n", "opt/state.bin": b"\x00\x01" * 10}


def test_a_checkpoint_is_its_owners_alone(front, people, objects, tmp_path):
    owner, _ = people()
    _, mallory = people()
    run = ended_run(owner, checkpoint={"interval": "10m"})
    made = checkpoint(objects, run["id"], tmp_path, FILES)

    page = owner.request("GET", f"/v1/runs/{run['id']}/checkpoint")
    assert (page["run_id"], page["series"], page["seq"], page["attempt"]) == (run["id"], run["id"], made.seq, 1)
    assert (page["file_count"], page["total_bytes"], page["dirs"]) == (
        3,
        sum(map(len, FILES.values())),
        ["empty", "opt"],
    )
    assert {f["path"]: f["size"] for f in page["files"]} == {p: len(d) for p, d in FILES.items()}
    step = next(f for f in page["files"] if f["path"] == "step")
    with urllib.request.urlopen(step["url"], timeout=30) as got:  # the presigned URL reads the file
        assert got.read() == b"41\n"

    # another user: the route and from_checkpoint answer as for a run that does not exist
    status, text = alike(front, mallory, "GET", lambda r: f"/v1/runs/{r}/checkpoint", run["id"])
    assert status == 404 and "model.pt" not in text
    status, text = alike(
        front, mallory, "POST", lambda r: "/v1/runs", run["id"], lambda r: {**PARKED, "from_checkpoint": r}
    )
    assert status == 404 and "checkpoint" not in text
    # nor an administrator's: a checkpoint goes to another owner only by its owner's hand
    status, _ = alike(
        front, bearer("admin"), "POST", lambda r: "/v1/runs", run["id"], lambda r: {**PARKED, "from_checkpoint": r}
    )
    assert status == 404
    sweep = {"run": {**PARKED}, "count": 2}
    status, _ = alike(
        front,
        mallory,
        "POST",
        lambda r: "/v1/sweeps",
        run["id"],
        lambda r: {**sweep, "run": {**PARKED, "from_checkpoint": r}},
    )
    assert status == 404

    # its owner starts a run from it: the new run's checkpoint is that one until it syncs its own
    started = ended_run(owner, from_checkpoint=run["id"])
    assert started["spec"]["from_checkpoint"] == run["id"]
    shown = owner.request("GET", f"/v1/runs/{started['id']}/checkpoint")
    assert (shown["run_id"], shown["series"], shown["seq"]) == (started["id"], run["id"], made.seq)
    status, text = alike(front, mallory, "GET", lambda r: f"/v1/runs/{r}/checkpoint", started["id"])
    assert status == 404


def test_no_checkpoint_yet_is_a_404_on_the_route_and_a_409_at_submit(front, people):
    owner, headers = people()
    run = ended_run(owner, checkpoint={"interval": 60})
    status, _, answer = raw(front, "GET", f"/v1/runs/{run['id']}/checkpoint", None, headers)
    assert (status, answer["error"]["code"]) == (404, "not_found")
    assert answer["error"]["message"] == f"run {run['id']} has no checkpoint yet"
    body = json.dumps({**PARKED, "from_checkpoint": run["id"]}).encode()
    status, _, answer = raw(front, "POST", "/v1/runs", body, headers)
    assert (status, answer["error"]["code"]) == (409, "conflict")
    assert f"run {run['id']} has no checkpoint yet" in answer["error"]["message"]
    assert [r["id"] for r in owner.request("GET", "/v1/runs")["runs"]] == [run["id"]]  # the refused one is not stored


def test_a_cursor_goes_on_with_its_checkpoint_and_no_other(front, people, objects, tmp_path):
    owner, headers = people()
    _, mallory = people()
    run = ended_run(owner, checkpoint={"interval": 60})
    checkpoint(objects, run["id"], tmp_path, FILES)
    first = owner.request("GET", f"/v1/runs/{run['id']}/checkpoint?limit=2")
    assert len(first["files"]) == 2 and first["dirs"] and first["next_cursor"]
    rest = owner.request("GET", f"/v1/runs/{run['id']}/checkpoint?limit=2&cursor={first['next_cursor']}")
    assert (len(rest["files"]), rest["dirs"], rest["next_cursor"]) == (1, [], None)
    assert {f["path"] for f in first["files"] + rest["files"]} == set(FILES)

    # a cursor of its own run's series naming another run's: refused, whoever's that run is
    theirs = ended_run(Client(front.api_url, mallory["Authorization"].split()[1]), checkpoint={"interval": 60})
    checkpoint(objects, theirs["id"], tmp_path, {"mine": b"x"})
    forged = encode_cursor({"r": run["id"], "q": 1, "i": 1}).rstrip("=")
    for cursor in (forged, "bm90IGpzb24", "e30", encode_cursor({"r": theirs["id"], "q": 1, "i": 1, "x": 1})):
        status, _, answer = raw(front, "GET", f"/v1/runs/{theirs['id']}/checkpoint?cursor={cursor}", None, mallory)
        assert (status, answer["error"]["code"]) == (400, "bad_request"), (cursor, answer)
        assert "cursor" in answer["error"]["message"] and "model.pt" not in json.dumps(answer)

    # a newer checkpoint replaces the one a cursor goes on with: 409, list again
    checkpoint(objects, run["id"], tmp_path, {"model.pt": b"newer"})
    prune(objects, run["id"], keep=1)
    status, _, answer = raw(
        front, "GET", f"/v1/runs/{run['id']}/checkpoint?limit=2&cursor={first['next_cursor']}", None, headers
    )
    assert (status, answer["error"]["code"]) == (409, "conflict")
    assert owner.request("GET", f"/v1/runs/{run['id']}/checkpoint")["seq"] == 2


BAD_RULES = [
    ({}, "give at least one of interval"),
    ({"interval": 0.5}, "checkpoint.interval"),
    ({"interval": "soon"}, "checkpoint.interval"),
    ({"signal": "SIGKILL"}, "checkpoint.signal"),
    ({"grace": "2h"}, "checkpoint.grace"),
    ({"exit_code": 0}, "checkpoint.exit_code"),
    ({"exit_code": 2}, "checkpoint.exit_code"),
    ({"exit_code": 137}, "checkpoint.exit_code"),
    ({"exit_code": "85"}, "checkpoint.exit_code"),
    ({"max_pieces": 3}, "give exit_code too"),
    ({"exit_code": 85, "max_pieces": 0}, "checkpoint.max_pieces"),
    ({"interval": 60, "every": 5}, "checkpoint.every: Extra inputs are not permitted"),
]


def test_a_checkpoint_rule_that_cannot_be_is_a_422_naming_it(front, people):
    owner, headers = people()
    for rule, fragment in BAD_RULES:
        body = json.dumps({**PARKED, "checkpoint": rule}).encode()
        status, _, answer = raw(front, "POST", "/v1/runs", body, headers)
        assert (status, answer["error"]["code"]) == (422, "invalid_request"), (rule, answer)
        assert fragment in answer["error"]["message"], (rule, answer)
    for bad in ("r-../x", "", "r-" + "0" * 100, 5):
        body = json.dumps({**PARKED, "from_checkpoint": bad}).encode()
        status, _, answer = raw(front, "POST", "/v1/runs", body, headers)
        assert (status, answer["error"]["code"]) == (422, "invalid_request"), (bad, answer)
        assert "from_checkpoint" in answer["error"]["message"]
    assert owner.request("GET", "/v1/runs")["runs"] == []  # nothing was stored
