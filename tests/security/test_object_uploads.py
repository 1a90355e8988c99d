"""Signed PUTs of the stack on one machine, sent by a hostile client through the stack's front on
loopback: only a URL the stack signed, unaltered and unexpired, stores an object, and only the
size and MD5 it was signed for; a body that is not that is refused and leaves nothing; an object
of other content is never overwritten; nothing is written outside the objects directory."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import os
import secrets
import threading
import time
from dataclasses import replace
from urllib.parse import unquote, urlsplit

import pytest

from runplane.adapters.local.files import FileObjectStore
from runplane.adapters.local.object_urls import PUT_LIMITS, sign_put, url_key
from runplane.devstack.front import MAX_REQUEST
from tests.object_front import objects_front

BUCKET = "rp-data"
KEY = "uploads/alice/" + "a" * 64
DATA = b"an archive of alice's code" * 100


def md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


@pytest.fixture
def served(tmp_path):
    """A store of objects and what its front calls (whose ``limits`` a test may tighten)."""
    state = tmp_path / "state"
    secret = secrets.token_bytes(32)
    with objects_front(state, lambda: secret) as (url, cloud):
        yield FileObjectStore(state, BUCKET, lambda: secret, url), cloud


@pytest.fixture
def store(served):
    return served[0]


def put(url: str, body: bytes, headers: dict[str, str], path: str | None = None) -> tuple[int, bytes]:
    """The status and body of a PUT of ``body`` to ``url`` (or its raw ``path`` and query)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.putrequest("PUT", path if path is not None else f"{parts.path}?{parts.query}")
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders()
        with contextlib.suppress(OSError):  # refused before the body was read: the front closed the connection
            connection.send(body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_a_signed_put_stores_the_bytes_and_a_second_of_the_same_bytes_is_harmless(store):
    url, headers = store.put_url(KEY, len(DATA), md5(DATA))
    assert headers["Content-MD5"] == md5(DATA) and headers["Content-Length"] == str(len(DATA))
    assert put(url, DATA, headers)[0] == 200
    assert store.get_bytes(KEY) == DATA
    info = store.head(KEY)
    assert info is not None and info.size == len(DATA)
    assert put(url, DATA, headers)[0] == 200
    assert store.get_bytes(KEY) == DATA
    assert store.head("uploads/alice/missing") is None


def test_bytes_other_than_the_signed_md5_are_refused_and_leave_nothing(store, tmp_path):
    other = b"X" + DATA[1:]
    url, headers = store.put_url(KEY, len(DATA), md5(DATA))
    status, body = put(url, other, headers)
    assert status == 400 and b"MD5" in body
    assert store.head(KEY) is None
    assert os.listdir(tmp_path / "state" / "objects" / ".partial") == []


def test_a_declared_size_or_md5_other_than_the_signed_ones_is_refused(store):
    url, headers = store.put_url(KEY, len(DATA), md5(DATA))
    assert put(url, DATA + b"more", {**headers, "Content-Length": str(len(DATA) + 4)})[0] == 403
    assert put(url, DATA[:-1], {**headers, "Content-Length": str(len(DATA) - 1)})[0] == 403
    assert put(url, b"other", {**headers, "Content-Length": "5", "Content-MD5": md5(b"other")})[0] == 403
    no_md5 = {k: v for k, v in headers.items() if k != "Content-MD5"}
    assert put(url, DATA, no_md5)[0] == 400
    assert store.head(KEY) is None


def test_a_body_shorter_than_declared_is_refused(store):
    url, headers = store.put_url(KEY, len(DATA), md5(DATA))
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.putrequest("PUT", f"{parts.path}?{parts.query}")
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders()
        connection.send(DATA[:100])
        connection.sock.shutdown(1)  # the client stops sending: the body ends short
        assert connection.getresponse().status == 400
    finally:
        connection.close()
    assert store.head(KEY) is None


def test_an_altered_expired_or_get_url_stores_nothing(store):
    url, headers = store.put_url(KEY, len(DATA), md5(DATA))
    parts = urlsplit(url)
    other_key = parts.path.replace("alice", "bobby")
    assert put(url, DATA, headers, path=f"{other_key}?{parts.query}")[0] == 403
    altered = parts.query[:-1] + ("1" if parts.query.endswith("0") else "0")  # another last character
    assert put(url, DATA, headers, path=f"{parts.path}?{altered}")[0] == 403
    assert put(url, DATA, headers, path=parts.path)[0] == 403
    get_url = urlsplit(store.url(KEY))
    assert put(url, DATA, headers, path=f"{get_url.path}?{get_url.query}")[0] == 403
    store.clock = lambda: 0.0  # signed long ago: expired now
    old_url, _ = store.put_url(KEY, len(DATA), md5(DATA))
    assert put(old_url, DATA, headers)[0] == 403
    assert store.head(KEY) is None and store.head("uploads/bobby/" + "a" * 64) is None


def test_an_object_of_other_content_is_never_overwritten(store):
    store.put_bytes(KEY, b"what was there")
    url, headers = store.put_url(KEY, len(DATA), md5(DATA))
    assert put(url, DATA, headers)[0] == 409
    assert store.get_bytes(KEY) == b"what was there"


def test_a_put_never_leaves_the_objects_directory(store, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    uploads = tmp_path / "state" / "objects" / BUCKET / "uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, uploads / "mallory")
    headers = {"Content-MD5": md5(DATA), "Content-Length": str(len(DATA))}
    for key in ("uploads/mallory/x", "../../outside/x", "uploads/../../x", "uploads/%2e%2e/%2e%2e/x"):
        expires = 2**36  # signed with the stack's own key: only the walk stands in the way
        signature = sign_put(url_key(store.secret()), BUCKET, unquote(key), expires, len(DATA), md5(DATA))
        status, _ = put(
            store.public_url, DATA, headers, path=f"/objects/{BUCKET}/{key}?expires={expires}&signature={signature}"
        )
        assert status == 404, key
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "x").exists() and not (tmp_path / "state" / "x").exists()


def test_a_put_larger_than_any_other_request_is_stored(store):
    data = secrets.token_bytes(MAX_REQUEST + 1024 * 1024)
    url, headers = store.put_url(KEY, len(data), md5(data))
    assert put(url, data, headers)[0] == 200
    assert store.get_bytes(KEY) == data


def start_put(url: str, headers: dict[str, str]) -> http.client.HTTPConnection:
    """A PUT of ``url`` whose headers are sent and whose body is still to come."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    connection.putrequest("PUT", f"{parts.path}?{parts.query}")
    for name, value in headers.items():
        connection.putheader(name, value)
    connection.endheaders()
    return connection


def test_a_put_the_disk_could_not_keep_its_reserve_for_is_507_and_stores_nothing(served):
    store, cloud = served
    cloud.limits = replace(PUT_LIMITS, reserve_bytes=2**62)  # more than any disk here holds free
    url, headers = store.put_url(KEY, len(DATA), md5(DATA))
    status, body = put(url, DATA, headers)
    assert status == 507 and b"no room" in body
    assert store.head(KEY) is None
    cloud.limits = replace(PUT_LIMITS, reserve_bytes=0, reserve_fraction=0.0)
    assert put(url, DATA, headers)[0] == 200 and store.get_bytes(KEY) == DATA


def test_a_second_put_of_a_url_while_the_first_is_received_is_409(store):
    url, headers = store.put_url(KEY, len(DATA), md5(DATA))
    first = start_put(url, headers)
    try:
        first.send(DATA[:100])
        time.sleep(0.3)  # the front has the first's headers and has begun its body
        status, body = put(url, DATA, headers)
        assert status == 409 and b"one at a time" in body
        first.send(DATA[100:])
        assert first.getresponse().status == 200
    finally:
        first.close()
    assert store.get_bytes(KEY) == DATA
    assert put(url, DATA, headers)[0] == 200  # once the first is done, the URL takes a PUT again


def test_a_body_that_trickles_is_cut_off_and_stores_nothing(served):
    store, cloud = served
    cloud.limits = replace(PUT_LIMITS, rate_after_seconds=0.2, min_bytes_per_second=1024 * 1024)
    url, headers = store.put_url(KEY, len(DATA), md5(DATA))
    connection = start_put(url, headers)
    try:
        for start in range(0, 400, 100):  # 100 bytes every 0.15 s: far under the least rate
            connection.send(DATA[start : start + 100])
            time.sleep(0.15)
        response = connection.getresponse()
        assert response.status == 408 and b"too slowly" in response.read()
    finally:
        connection.close()
    assert store.head(KEY) is None
    assert put(url, DATA, headers)[0] == 200  # the same bytes at once are taken


def test_a_body_that_ends_long_after_its_url_expired_is_refused(served):
    store, cloud = served
    cloud.limits = replace(PUT_LIMITS, expiry_grace_seconds=0.0)
    url, headers = store.put_url(KEY, len(DATA), md5(DATA), expires_seconds=1)
    connection = start_put(url, headers)
    try:
        connection.send(DATA[:100])
        threading.Event().wait(2.2)  # the URL expires while its body is on the way
        connection.send(DATA[100:])
        response = connection.getresponse()
        assert response.status == 403 and b"expired before its body ended" in response.read()
    finally:
        connection.close()
    assert store.head(KEY) is None
