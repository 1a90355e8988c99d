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
from urllib.parse import unquote, urlsplit

import pytest

from runplane.adapters.local.files import FileObjectStore
from runplane.adapters.local.object_urls import sign_put, url_key
from runplane.devstack.front import MAX_REQUEST
from tests.object_front import objects_front

BUCKET = "rp-data"
KEY = "uploads/alice/" + "a" * 64
DATA = b"an archive of alice's code" * 100


def md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


@pytest.fixture
def store(tmp_path):
    state = tmp_path / "state"
    secret = secrets.token_bytes(32)
    with objects_front(state, lambda: secret) as (url, _):
        yield FileObjectStore(state, BUCKET, lambda: secret, url)


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
    assert put(url, DATA, headers, path=f"{parts.path}?{parts.query[:-1]}0")[0] == 403
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
