"""Presigned PUTs of every object store (S3 on moto's server, Blob storage on Azurite, the files
of a stack on one machine behind its front): the signed bytes are stored; other bytes than the
declared MD5's, another length, an expired URL or the URL sent to another key store nothing.

moto's server checks neither a presigned URL's signature nor a body's ``Content-MD5`` (it stores
whatever comes): on AWS the refusals are S3's own, and what is tested there is that the URL signs
the headers S3 checks. Blob storage checks the MD5 and the SAS, but a SAS cannot bind a length:
Azurite stores a body of another length whose MD5 is its own (the API checks the object's size
when a run names it, the agent its SHA-256 when it fetches it)."""

from __future__ import annotations

import base64
import hashlib
import time
import urllib.error
import urllib.request
from urllib.parse import parse_qs, urlsplit, urlunsplit

import pytest

KEY = "uploads/alice/" + "b" * 64
DATA = b"a gzip'd tar of alice's directory" * 64


def md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def put(url: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=body, headers=headers, method="PUT")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_a_presigned_put_stores_the_bytes(stack):
    assert stack.objects.head(KEY) is None
    url, headers = stack.objects.put_url(KEY, len(DATA), md5(DATA))
    assert put(url, DATA, headers) in (200, 201)
    info = stack.objects.head(KEY)
    assert info is not None and (info.key, info.size) == (KEY, len(DATA))
    assert stack.objects.get_bytes(KEY) == DATA


def checks_signatures(request: pytest.FixtureRequest) -> bool:
    """Whether the stack under test refuses what a presigned URL does not allow (moto's does not)."""
    return request.node.callspec.params["stack"] != "aws-moto"


def test_an_s3_url_signs_the_md5_and_length_it_declares(stack, request):
    if request.node.callspec.params["stack"] != "aws-moto":
        pytest.skip("S3's presigned URLs only")
    url, headers = stack.objects.put_url(KEY, len(DATA), md5(DATA))
    signed = parse_qs(urlsplit(url).query)["X-Amz-SignedHeaders"][0].split(";")
    assert {"content-md5", "content-length", "host"} <= set(signed)
    assert headers["Content-MD5"] == md5(DATA) and headers["Content-Length"] == str(len(DATA))


def test_bytes_other_than_the_declared_md5_are_refused(stack, request):
    if not checks_signatures(request):
        pytest.skip("moto's server does not check Content-MD5")
    url, headers = stack.objects.put_url(KEY, len(DATA), md5(DATA))
    assert put(url, b"X" + DATA[1:], headers) >= 400
    assert stack.objects.head(KEY) is None


def test_another_length_is_refused(stack, request):
    if request.node.callspec.params["stack"] != "local-sqlite":
        pytest.skip("S3 refuses it (the length is signed; moto does not check); a SAS cannot bind it")
    url, headers = stack.objects.put_url(KEY, len(DATA), md5(DATA))
    shorter = DATA[:-1]
    assert put(url, shorter, {**headers, "Content-Length": str(len(shorter)), "Content-MD5": md5(shorter)}) >= 400
    assert stack.objects.head(KEY) is None


def test_an_expired_url_is_refused(stack, request):
    if not checks_signatures(request):
        pytest.skip("moto's server does not check presigned URLs")
    stack.objects.clock = lambda: time.time() - 3600
    url, headers = stack.objects.put_url(KEY, len(DATA), md5(DATA), expires_seconds=60)
    assert put(url, DATA, headers) >= 400
    assert stack.objects.head(KEY) is None


def test_an_object_of_other_content_is_not_overwritten(stack, request):
    if not checks_signatures(request):
        pytest.skip("S3's presigned PUT replaces an object; the key is the SHA-256 the agent checks")
    stack.objects.put_bytes(KEY, b"what was there")
    url, headers = stack.objects.put_url(KEY, len(DATA), md5(DATA))
    assert put(url, DATA, headers) >= 400
    assert stack.objects.get_bytes(KEY) == b"what was there"


def test_the_url_does_not_put_to_another_key(stack, request):
    if not checks_signatures(request):
        pytest.skip("moto's server does not check presigned URLs")
    url, headers = stack.objects.put_url(KEY, len(DATA), md5(DATA))
    parts = urlsplit(url)
    other = urlunsplit(parts._replace(path=parts.path.replace("alice", "bobby")))
    assert put(other, DATA, headers) >= 400
    assert stack.objects.head(KEY.replace("alice", "bobby")) is None
