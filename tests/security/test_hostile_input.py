"""Malformed and hostile requests get a 4xx with a message, never a 5xx, a stack trace, a silently
dropped run or another user's data. On both clouds' local stacks."""

import base64
import http.client
import json
import urllib.parse

import pytest

from runplane.client import Client
from tests.conftest import api_status
from tests.security.conftest import bearer, raw

PARKED = {"command": "echo hi", "queue": "parked"}


def body(**extra):
    return json.dumps({**PARKED, **extra}).encode()


def nested(depth):
    return b'{"command": "x", "queue": "parked", "env": ' + b"[" * depth + b"]" * depth + b"}"


HOSTILE = [
    (b'\xff\xfe{"command": "x"}', 400, "not UTF-8"),
    (b'{"command": "x", "name": "caf\xe9"}', 400, "not UTF-8"),
    (nested(5000), 400, "nests deeper than 32 levels"),
    (nested(40), 400, "nests deeper than 32 levels"),
    (b'{"command": "x", "resources": {"cpus": Infinity}}', 400, "Infinity is not a number"),
    (b'{"command": "x", "resources": {"cpus": NaN}}', 400, "NaN is not a number"),
    (b'{"command": "x", "resources": {"time": -Infinity}}', 400, "-Infinity is not a number"),
    (b'{"command": "x", "resources": {"cpus": 1' + b"0" * 5000 + b"}}", 400, "not valid JSON"),
    (body(resources={"cpus": 1e-200}), 422, "resources.cpus: Input should be greater than or equal to 0.01"),
    (body(resources={"cpus": 1e-100}), 422, "resources.cpus: Input should be greater than or equal to 0.01"),
    (body(resources={"cpus": 2000}), 422, "resources.cpus: Input should be less than or equal to 1024"),
    (body(resources={"time": 1e130}), 422, "resources.time: a duration cannot exceed"),
    (body(resources={"time": 5e-324}), 422, "resources.time: Input should be greater than or equal to 1"),
    (body(resources={"time": "31d"}), 422, "resources.time: Input should be less than or equal to 2592000"),
    (body(resources={"time": "8d"}), 422, "asks 8d, pool allows at most 7d"),
    (b'{"command": "x", "resources": {"memory": 1e400}}', 422, "memory: a size must be a finite, non-negative number"),
    (body(resources={"memory": 10**30}), 422, "resources.memory: a size cannot exceed"),
    (body(resources={"memory": 10**400}), 422, "resources.memory: a size cannot exceed"),
    (body(resources={"time": 10**400}), 422, "resources.time: a duration cannot exceed"),
    (body(resources={"cpus": 10**400}), 422, "resources.cpus: Input should be a valid number"),
    (body(env={"A": "\udfff"}), 422, "environment variable 'A' holds the control character \\udfff"),
    (body(env={"GCONV_PATH\n": "/tmp"}), 422, "environment variable name 'GCONV_PATH\\n' is not valid"),
    (body(inputs={"a\n": "run:r-1"}), 422, "input name 'a\\n' is not valid"),
    (body(inputs={"a": "s3://bkt/k\udfff"}), 422, "source must be"),
    (body(resources={"disk": "2p"}), 422, "resources.disk: a size cannot exceed 1p"),
    (body(command="echo a\u0000b"), 422, "command: command holds the control character \\x00"),
    (body(command="echo \u001b[2J"), 422, "command holds the control character \\x1b"),
    (body(env={"A": "x\u0007"}), 422, "environment variable 'A' holds the control character \\x07"),
    (body(env={f"V{i}": "x" for i in range(257)}), 422, "at most 256 environment variables"),
    (body(inputs={f"i{i}": "run:r-x" for i in range(65)}), 422, "at most 64 inputs"),
    (body(env={"LD_PRELOAD": "/tmp/x.so"}), 422, "'LD_PRELOAD' changes the dynamic loader"),
    (body(env={"LD_LIBRARY_PATH": "/tmp"}), 422, "'LD_LIBRARY_PATH' changes the dynamic loader"),
    (body(env={"GCONV_PATH": "/tmp"}), 422, "'GCONV_PATH' changes the dynamic loader"),
    (body(image="busybox\nFROM evil"), 422, "image: must be printable text on one line"),
    (body(name="x" * 201), 422, "name: String should have at most 200 characters"),
    (body(command="echo '\u202egnp.exe'"), 422, "command holds \\u202e, a character that changes how text is shown"),
    (body(command="rm -rf /data\u2066 #\u2069"), 422, "command holds \\u2066"),
    (body(command="echo a\u200bb"), 422, "command holds \\u200b"),
    (body(name="train\u202e"), 422, "name: holds \\u202e"),
    (body(name="tra\u200din"), 422, "name: holds \\u200d"),
    (body(image="busybox\ufeff"), 422, "image: holds \\ufeff"),
    (body(command="echo ok\U000e0069\U000e0067"), 422, "command holds \\U000e0069"),
    (body(command="echo a\u2028rm -rf ~"), 422, "command holds \\u2028"),
    (body(name="a\u3164b"), 422, "name: holds \\u3164"),
    (body(name="a\u2029b"), 422, "name: holds \\u2029"),
    (body(retry={"attempts": 0}), 422, "retry.attempts: Input should be greater than or equal to 1"),
    (body(retry={"attempts": 11}), 422, "retry.attempts: Input should be less than or equal to 10"),
    (body(retry={"attempts": "3"}), 422, "retry.attempts: Input should be a valid integer"),
    (body(retry={"attempts": 3, "on": ["killed"]}), 422, "retry.on.0: Input should be"),
    (body(retry={"attempts": 3, "on": ["x" * 5000]}), 422, "retry.on.0: Input should be"),
    (body(retry={"attempts": 3, "on": "nonzero_exit"}), 422, "retry.on: Input should be a valid list"),
    (body(retry={"attempts": 3, "memory_factor": 0.5}), 422, "retry.memory_factor: Input should be greater"),
    (b'{"command": "x", "retry": {"attempts": 2, "memory_factor": NaN}}', 400, "NaN is not a number"),
    (body(retry={"attempts": 2, "when": "always"}), 422, "retry.when: Extra inputs are not permitted"),
    (body(retry=[3]), 422, "retry: Input should be a valid dictionary"),
]


@pytest.mark.parametrize(("data", "status", "fragment"), HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_bodies_get_a_4xx_with_a_message_and_store_nothing(front, mallory, data, status, fragment):
    client, token = mallory
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    got, answer_headers, answer = raw(front, "POST", "/v1/runs", data, headers)
    assert got == status, answer
    assert fragment in answer["error"]["message"], answer
    assert set(answer) == {"error"} and "Traceback" not in json.dumps(answer)
    assert answer_headers["content-type"].startswith("application/json")
    assert client.request("GET", "/v1/runs")["runs"] == []  # nothing was stored


def test_both_clouds_answer_hostile_bodies_alike(devstack, azure_devstack):
    for data, _, _ in HOSTILE:
        on_aws = raw(devstack, "POST", "/v1/runs", data, bearer("alice"))
        on_azure = raw(azure_devstack, "POST", "/v1/runs", data, bearer("alice"))
        assert on_aws[0] == on_azure[0] and on_aws[2] == on_azure[2], data[:80]


def _chunked(front, chunks, headers):
    url = urllib.parse.urlsplit(front.api_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.putrequest("POST", "/v1/runs")
    for key, value in {**headers, "Transfer-Encoding": "chunked"}.items():
        conn.putheader(key, value)
    conn.endheaders()
    conn.send(chunks)
    resp = conn.getresponse()
    status, answer = resp.status, json.loads(resp.read())
    conn.close()
    return status, answer


def test_chunked_bodies_are_read_whole_or_refused(front, user):
    data = body(name="chunked")
    framed = b"".join(b"%x\r\n%s\r\n" % (len(data[i : i + 7]), data[i : i + 7]) for i in range(0, len(data), 7))
    status, run = _chunked(front, framed + b"0\r\n\r\n", bearer("alice"))
    assert status == 201 and run["name"] == "chunked"
    assert user("alice").request("GET", f"/v1/runs/{run['id']}")["name"] == "chunked"
    status, answer = _chunked(front, b"zz\r\nnot hex\r\n0\r\n\r\n", bearer("alice"))
    assert (status, answer["error"]["code"]) == (400, "bad_request")
    big = b"%x\r\n" % (20 * 1024 * 1024) + b"x" * 10
    status, answer = _chunked(front, big, bearer("alice"))
    assert (status, answer["error"]["code"]) == (413, "payload_too_large")


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/v1/runs", "GET, POST"),
        ("PUT", "/v1/runs/r-0123", "GET"),
        ("PATCH", "/v1/me", "GET"),
        ("GET", "/v1/tokens/tok-0000000000000000", "DELETE"),
        ("GET", "/v1/runs/r-0123/kill", "POST"),
        ("OPTIONS", "/v1/health", "GET"),
    ],
)
def test_wrong_methods_are_405_with_allow(front, method, path, allow):
    status, headers, answer = raw(front, method, path, headers=bearer("alice"))
    assert (status, headers["allow"]) == (405, allow)
    assert answer["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize("path", ["/v1/runs/%00", "/v1/runs/" + "a" * 3000, "/v1/runs/r-%E2%80%AEevil", "/v1/runs/.."])
def test_ids_that_cannot_be_ids_are_404(front, path):
    status, _, answer = raw(front, "GET", path, headers=bearer("alice"))
    assert status == 404 and answer["error"]["code"] == "not_found"


def _b64(data):
    return base64.urlsafe_b64encode(data if isinstance(data, bytes) else json.dumps(data).encode()).decode()


CURSORS = [
    "zzz",
    "%%%",
    _b64(b"\xff\xfe"),
    _b64([1, 2]),
    _b64({"id": "r-1", "owner": "bob", "created_at": 1}),  # another user's partition (AWS's shape)
    _b64({"id": {"S": "r-1"}, "owner": {"S": "alice"}, "created_at": {"N": "1"}}),
    _b64({"id": "r-1", "owner": "alice", "created_at": float("1e400")}),
    _b64({"id": "r-1", "owner": "alice", "created_at": "now", "extra": 1}),
    _b64({"id": "x" * 5000, "owner": "alice", "created_at": 1}),
    _b64({"after": "\u0000"}),
    _b64({"after": 5}),
    _b64({"after": "x" * 5000}),
    "A" * 5000,
]


@pytest.mark.parametrize("cursor", CURSORS, ids=range(len(CURSORS)))
def test_crafted_cursors_are_400(front, user, cursor):
    for state in (None, "queued"):
        query = {"cursor": cursor, "state": state}
        status, code, message = api_status(lambda: user("alice").request("GET", "/v1/runs", query=query))  # noqa: B023
        assert (status, code) == (400, "bad_request"), state
        assert "cursor is not valid" in message


def test_another_users_cursor_never_shows_their_runs(front, user):
    """A cursor lifted from bob's listing, used by alice: refused (it names bob's listing)."""
    bob, alice = user("bob"), user("alice")
    for _ in range(3):
        bob.request("POST", "/v1/runs", PARKED)
    alice.request("POST", "/v1/runs", PARKED)
    cursor = bob.request("GET", "/v1/runs", query={"limit": 1})["next_cursor"]
    assert cursor
    status, code, message = api_status(lambda: alice.request("GET", "/v1/runs", query={"cursor": cursor, "limit": 500}))
    assert (status, code) == (400, "bad_request")
    assert "cursor is not valid" in message


def test_output_cursors_that_were_not_made_here_are_400(user):
    run = user("alice").request("POST", "/v1/runs", PARKED)
    for cursor in ("@@@", _b64(b"\xff"), _b64(b"a\x00b"), _b64(b"x" * 1100)):
        status, code, _ = api_status(
            lambda: user("alice").request("GET", f"/v1/runs/{run['id']}/outputs", query={"cursor": cursor})  # noqa: B023
        )
        assert (status, code) == (400, "bad_request"), cursor


DEEP = base64.urlsafe_b64encode(b"[" * 1530).decode()  # 2,040 characters: under every cursor's length cap


def test_a_cursor_nested_past_the_parsers_depth_is_400_on_every_listing(front, user):
    """A cursor of ~1,530 nested brackets exhausts the JSON parser's recursion: a 400 on every
    listing that takes a cursor, never a 500."""
    assert len(DEEP) < 2048
    alice = user("alice")
    run = alice.request("POST", "/v1/runs", PARKED)
    for path in ("/v1/runs", "/v1/sweeps", f"/v1/runs/{run['id']}/outputs", "/v1/workers"):
        status, code, message = api_status(lambda: alice.request("GET", path, query={"cursor": DEEP}))  # noqa: B023
        assert status in (400, 422) and code in ("bad_request", "invalid_request"), (path, status, code, message)
        assert "cursor" in message, path


def test_list_pages_stay_under_5_mb_and_lose_nothing(front, user):
    """Runs of about 90 KB each (a spec may be 96 KiB): 70 to a page would be over 6 MB, past
    Lambda's limit; pages stop before 5 MB and the cursor continues after the last run shown."""
    made = user("admin").request("POST", "/v1/tokens", {"user": f"bulky-{front.config.cloud}"})
    bulky = Client(front.api_url, made["token"])
    payload = {f"K{i}": "v" * 7_500 for i in range(12)}
    ids = [bulky.request("POST", "/v1/runs", {**PARKED, "env": payload})["id"] for _ in range(70)]
    seen, sizes, cursor = [], [], None
    while True:
        status, _, page = raw(
            front,
            "GET",
            "/v1/runs?limit=500" + (f"&cursor={cursor}" if cursor else ""),
            headers={"Authorization": f"Bearer {made['token']}"},
        )
        assert status == 200
        sizes.append(len(json.dumps(page)))
        seen += [r["id"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert max(sizes) <= 5 * 1024 * 1024
    assert len(sizes) >= 2
    assert seen == list(reversed(ids))  # every run once, newest first


@pytest.mark.docker
def test_outputs_are_listed_a_page_at_a_time(front, user, docker_client):
    """A run that leaves many files gets its listing in pages (1,000 files at most by default),
    never one answer that grows with the number of files."""
    from tests.conftest import TERMINAL, wait_state

    alice = user("alice")
    run = alice.request("POST", "/v1/runs", {"command": "for i in $(seq 1 230); do : > f$i; done", "queue": "default"})
    assert wait_state(alice, run["id"], TERMINAL, timeout=120)["state"] == "succeeded"
    seen, cursor, pages = [], None, 0
    while True:
        page = alice.request("GET", f"/v1/runs/{run['id']}/outputs", query={"limit": 100, "cursor": cursor})
        assert len(page["files"]) <= 100
        seen += [f["path"] for f in page["files"]]
        pages += 1
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert pages == 3
    assert sorted(seen) == sorted(f"f{i}" for i in range(1, 231)) and len(seen) == 230
    assert len(alice.request("GET", f"/v1/runs/{run['id']}/outputs")["files"]) == 230  # the default page: 1,000
    status, code, _ = api_status(lambda: alice.request("GET", f"/v1/runs/{run['id']}/outputs", query={"limit": 1001}))
    assert (status, code) == (422, "invalid_request")


def test_a_binary_log_page_fits_lambdas_response_limit(devstack, alice):
    """Bytes that are not UTF-8 become six characters each as JSON, and each backslash counts twice
    in Lambda's response: a page of a binary log still stays under its 6 MB, and the next page
    goes on from where it stopped."""
    from runplane import bootstrap
    from runplane.services.logs import MAX_READ, log_chunk_key

    run = alice.request("POST", "/v1/runs", PARKED)
    bootstrap.stack().objects.put_bytes(log_chunk_key(run["id"], 0, "stdout", 0), b"\xff" * (MAX_READ + 4096))
    first = alice.request("GET", f"/v1/runs/{run['id']}/logs")
    assert first["next_offset"] == MAX_READ
    in_lambda = json.dumps({"statusCode": 200, "body": json.dumps(first)})  # what the handler returns
    assert len(in_lambda) < 6 * 1024 * 1024
    rest = alice.request("GET", f"/v1/runs/{run['id']}/logs", query={"offset": first["next_offset"]})
    assert rest["next_offset"] == MAX_READ + 4096
