"""Uploads against a hostile second user, on both clouds' local stacks: an upload lives under its
uploader's own key, so another user naming it in a run or a sweep is refused exactly as a
missing one is (404), and offering the same archive tells them nothing of it; an archive over
``max_upload_bytes`` is a 413 naming the limit; malformed offers are a 422 naming the field,
never a 5xx.

Every test makes users of its own, so nothing here meets another test's uploads.
"""

import base64
import hashlib
import json
import urllib.request
import uuid

import pytest

from runplane.domain.uploads import DEFAULT_MAX_UPLOAD_BYTES
from tests.security.conftest import Caller

PARKED = {"command": "echo hi", "queue": "parked"}


@pytest.fixture
def people(front):
    """``people()``: a Caller with a token of a new user."""
    admin = Caller(front, "admin-token")

    def make():
        status, made = admin("POST", "/v1/tokens", {"user": f"u-{uuid.uuid4().hex[:8]}"})
        assert status == 201, made
        return Caller(front, made["token"])

    return make


def _archive():
    data = f"an archive {uuid.uuid4().hex}".encode()
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
    return data, {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "md5": md5}


def _send(offer, data):
    """PUT ``data`` where an offer says, with its headers; the store's status."""
    req = urllib.request.Request(offer["url"], data=data, method="PUT", headers=offer["headers"])
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status


def test_another_users_upload_reads_exactly_as_one_that_does_not_exist(people):
    alice, bob = people(), people()
    data, body = _archive()
    status, offer = alice("POST", "/v1/uploads", body)
    assert status == 200 and offer["present"] is False and offer["source"] == f"upload:{body['sha256']}"
    assert _send(offer, data) in (200, 201)
    status, again = alice("POST", "/v1/uploads", body)
    assert status == 200 and again["present"] is True and again["url"] is None  # nothing to send twice

    named = {**PARKED, "inputs": {"code": offer["source"]}, "workdir": "/inputs/code"}
    status, run = alice("POST", "/v1/runs", named)
    assert status == 201 and run["spec"]["inputs"] == {"code": offer["source"]}

    missing = {**PARKED, "inputs": {"code": f"upload:{'0' * 64}"}}
    for who, spec in ((bob, named), (alice, missing)):
        status, refused = who("POST", "/v1/runs", spec)
        sha = spec["inputs"]["code"].removeprefix("upload:")
        gone = (  # alike for another user's, with how to send it again
            f"upload {sha} not found: uploads unused for a while expire; upload the directory again "
            "(runplane run --upload DIR, or the SDK's uploads=) and submit anew"
        )
        assert (status, refused["error"]["message"]) == (404, gone)
        status, refused = who("POST", "/v1/sweeps", {"run": spec, "count": 2})
        assert (status, refused["error"]["message"]) == (404, gone)
    # offering the same archive, bob is asked to send it to a key of his own: alice's is not his
    status, theirs = bob("POST", "/v1/uploads", body)
    assert status == 200 and theirs["present"] is False and theirs["url"] != offer["url"]


def test_an_archive_over_the_limit_is_413_naming_it(people):
    alice = people()
    _, body = _archive()
    status, refused = alice("POST", "/v1/uploads", {**body, "size": DEFAULT_MAX_UPLOAD_BYTES + 1})
    assert status == 413 and str(DEFAULT_MAX_UPLOAD_BYTES) in refused["error"]["message"]
    assert "max_upload_bytes" in refused["error"]["message"]
    assert alice("POST", "/v1/uploads", {**body, "size": DEFAULT_MAX_UPLOAD_BYTES})[0] == 200


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sha256": "A" * 64}, "sha256"),
        ({"sha256": "a" * 63}, "sha256"),
        ({"sha256": "../" + "a" * 61}, "sha256"),
        ({"size": 0}, "size"),
        ({"size": -5}, "size"),
        ({"size": "12"}, "size"),
        ({"size": True}, "size"),
        ({"size": 1.5}, "size"),
        ({"md5": "not base64 at all"}, "md5"),
        ({"md5": base64.b64encode(b"x" * 17).decode()}, "md5"),
        ({"owner": "someone-else"}, "owner"),
    ],
)
def test_a_malformed_offer_is_422_naming_the_field(people, change, field):
    status, refused = people()("POST", "/v1/uploads", {**_archive()[1], **change})
    assert status == 422 and field in json.dumps(refused["error"]), refused


def test_a_run_naming_a_malformed_upload_or_workdir_is_422(people):
    alice = people()
    for spec in (
        {**PARKED, "inputs": {"code": "upload:" + "A" * 64}},
        {**PARKED, "inputs": {"code": "upload:../../etc"}},
        {**PARKED, "workdir": "inputs/code"},
        {**PARKED, "workdir": "/inputs/../../etc"},
        {**PARKED, "workdir": "/inputs/\x1b[2Jcode"},
    ):
        status, refused = alice("POST", "/v1/runs", spec)
        assert status == 422, (spec, refused)
