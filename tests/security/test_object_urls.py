"""Object URLs of the stack on one machine, asked for by a hostile client through the stack's
front on loopback: only a URL the stack signed, unaltered and unexpired, GETs an object, as a
download; nothing outside the objects directory is ever served, whatever the path or a link
planted in the tree; and the tree is private to the stack's user."""

from __future__ import annotations

import http.client
import os
import secrets
import stat
import time
import urllib.request
from urllib.parse import urlsplit

import pytest

from runplane.adapters.local.files import FileObjectStore
from runplane.adapters.local.object_urls import sign, url_key
from runplane.domain.errors import BadRequest, NotFound
from tests.object_front import objects_front

BUCKET = "rp-data"
KEEP_OUT = b"the contents of a file outside the objects directory"


@pytest.fixture
def served(tmp_path):
    """A store in a fresh state directory, its URLs answered by the front; and files outside
    the objects directory that nothing may serve."""
    state = tmp_path / "state"
    secret = secrets.token_bytes(32)
    with objects_front(state, lambda: secret) as (url, _):
        store = FileObjectStore(state, BUCKET, lambda: secret, url)
        (tmp_path / "outside.txt").write_bytes(KEEP_OUT)
        (state / "outside.txt").write_bytes(KEEP_OUT)
        (state / "objects" / "outside.txt").write_bytes(KEEP_OUT)
        store.put_bytes("runs/r-1/outputs/1/report.html", b"<script>alert(1)</script>")
        store.put_bytes("runs/r-2/outputs/1/report.html", b"another user's report")
        yield store, secret


def fetch(url: str, method: str = "GET", path: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body of ``method`` of ``url`` (or of its raw ``path`` and query,
    sent exactly as written: no client normalises it)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.request(method, path if path is not None else f"{parts.path}?{parts.query}")
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_a_signed_url_downloads_the_object_as_an_attachment(served):
    store, _ = served
    url = store.url("runs/r-1/outputs/1/report.html")
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.read() == b"<script>alert(1)</script>"
        assert r.headers["Content-Disposition"] == "attachment; filename=\"report.html\"; filename*=UTF-8''report.html"
        assert r.headers["Content-Type"] == "application/octet-stream"  # never rendered as the page it holds
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["Cache-Control"] == "private, no-store"
        assert r.headers["Content-Length"] == "25"
    status, headers, body = fetch(url, "HEAD")
    assert (status, headers["Content-Length"], body) == (200, "25", b"")
    assert fetch(store.url("runs/r-1/outputs"))[0] == 404  # a folder is no object
    large = os.urandom(3 * 2**20 + 17)  # streamed from the file in chunks
    store.put_bytes("runs/r-1/outputs/1/weights.bin", large)
    status, headers, body = fetch(store.url("runs/r-1/outputs/1/weights.bin"))
    assert (status, headers["Content-Length"], body == large) == (200, str(len(large)), True)


def test_a_name_that_could_split_a_header_or_name_a_path_is_written_safely(served):
    store, _ = served
    store.put_bytes('runs/r-1/outputs/1/a"b;\r\nSet-Cookie: x=1 é.txt', b"x")
    status, headers, body = fetch(store.url('runs/r-1/outputs/1/a"b;\r\nSet-Cookie: x=1 é.txt'))
    assert (status, body) == (200, b"x")
    assert "Set-Cookie" not in headers
    assert headers["Content-Disposition"] == (
        'attachment; filename="a_b___Set-Cookie__x_1__.txt"; '
        "filename*=UTF-8''a%22b%3B%0D%0ASet-Cookie%3A%20x%3D1%20%C3%A9.txt"
    )


def test_altered_unsigned_or_expired_urls_are_refused(served):
    store, secret = served
    url = store.url("runs/r-1/outputs/1/report.html", 600)
    path, _, query = url.partition("?")
    expires, signature = (v.split("=")[1] for v in query.split("&"))
    flipped = ("0" if signature[0] != "0" else "1") + signature[1:]
    past = FileObjectStore(store.root, BUCKET, lambda: secret, store.public_url, clock=lambda: time.time() - 3600)
    other_stack = FileObjectStore(store.root, BUCKET, lambda: secrets.token_bytes(32), store.public_url)
    refused = {
        "altered signature": f"{path}?expires={expires}&signature={flipped}",
        "another run's object": f"{path.replace('/r-1/', '/r-2/')}?{query}",
        "altered expiry": f"{path}?expires={int(expires) + 3600}&signature={signature}",
        "no signature": f"{path}?expires={expires}",
        "no expiry": f"{path}?signature={signature}",
        "twice signed": f"{path}?{query}&signature={signature}",
        "many fields": f"{path}?{query}&" + "&".join(f"f{i}=1" for i in range(50)),
        "expired": past.url("runs/r-1/outputs/1/report.html", 60),
        "signed by another stack": other_stack.url("runs/r-1/outputs/1/report.html"),
        "another key with its signature": f"{path}x?{query}",
    }
    for what, bad in refused.items():
        status, headers, body = fetch(bad)
        assert status == 403, what
        assert b"report" not in body and b"<script>" not in body, what
        assert headers["Content-Type"] == "application/json", what
    status, _, body = fetch(url)
    assert (status, body) == (200, b"<script>alert(1)</script>")  # the one signed, unaltered, still works


@pytest.mark.parametrize(
    ("bucket", "key", "raw"),
    [
        (BUCKET, "../outside.txt", "/objects/rp-data/../outside.txt"),
        (BUCKET, "../../outside.txt", "/objects/rp-data/%2e%2e/%2E%2E/outside.txt"),
        (BUCKET, "../../outside.txt", "/objects/rp-data/..%2F..%2Foutside.txt"),
        ("..", "outside.txt", "/objects/%2e%2e/outside.txt"),
        (BUCKET, "/etc/passwd", "/objects/rp-data//etc/passwd"),
        (BUCKET, "runs/./r-1/outputs/1/report.html", "/objects/rp-data/runs/./r-1/outputs/1/report.html"),
        (BUCKET, "runs/r-1/outputs/1/report.html\x00", "/objects/rp-data/runs/r-1/outputs/1/report.html%00"),
        (".partial", "x", "/objects/.partial/x"),
    ],
)
def test_paths_that_leave_the_objects_directory_are_refused_even_when_signed(served, bucket, key, raw):
    """Signed by someone who holds the stack's secret, as no URL of the store is: the path's own
    checks still refuse what is not an object inside the objects directory."""
    store, secret = served
    expires = int(time.time()) + 600
    unsigned = fetch(store.public_url, path=f"{raw}?expires={expires}&signature={'0' * 64}")
    assert unsigned[0] == 403
    signed = fetch(
        store.public_url, path=f"{raw}?expires={expires}&signature={sign(url_key(secret), bucket, key, expires)}"
    )
    assert signed[0] == 404
    assert KEEP_OUT not in signed[2] and b"root:" not in signed[2]
    with pytest.raises(BadRequest):
        store.within(bucket).url(key)  # the store signs no such key


def test_links_planted_in_the_objects_tree_are_never_followed(served, tmp_path):
    store, _ = served
    run = store.root / "objects" / BUCKET / "runs" / "r-1"
    os.symlink(tmp_path / "outside.txt", run / "outputs" / "1" / "link.txt")
    os.symlink(tmp_path, run / "folder")
    os.symlink(store.root, store.root / "objects" / "linked-bucket")
    for key in ("runs/r-1/outputs/1/link.txt", "runs/r-1/folder/outside.txt"):
        status, _, body = fetch(store.url(key))
        assert status == 404 and KEEP_OUT not in body, key
        with pytest.raises(NotFound):
            store.get_bytes(key)
    linked = store.within("linked-bucket")
    status, _, body = fetch(linked.url("outside.txt"))
    assert status == 404 and KEEP_OUT not in body
    assert [o.key for o in store.list("runs/r-1/")] == ["runs/r-1/outputs/1/report.html"]
    with pytest.raises(BadRequest):  # nor written through
        store.put_bytes("runs/r-1/folder/planted.txt", b"x")
    assert not (tmp_path / "planted.txt").exists()
    store.put_bytes("runs/r-1/outputs/1/link.txt", b"replaced")  # the link itself is replaced, not its target
    assert (tmp_path / "outside.txt").read_bytes() == KEEP_OUT
    assert store.get_bytes("runs/r-1/outputs/1/link.txt") == b"replaced"


@pytest.mark.parametrize("method", ["POST", "DELETE", "PATCH"])
def test_object_urls_answer_get_head_and_put_only(served, method):
    store, _ = served
    status, headers, _ = fetch(store.url("runs/r-1/outputs/1/report.html"), method)
    assert (status, headers["Allow"]) == (405, "GET, HEAD, PUT")
    assert store.get_bytes("runs/r-1/outputs/1/report.html") == b"<script>alert(1)</script>"


def test_a_get_url_does_not_put(served):
    store, _ = served
    status, _, _ = fetch(store.url("runs/r-1/outputs/1/report.html"), "PUT")
    assert status in (400, 403)
    assert store.get_bytes("runs/r-1/outputs/1/report.html") == b"<script>alert(1)</script>"


def test_the_objects_tree_is_private_whatever_the_umask(tmp_path):
    before = os.umask(0)
    try:
        store = FileObjectStore(tmp_path / "state", BUCKET, lambda: b"k" * 32, "http://127.0.0.1:9")
        store.put_bytes("runs/r-1/logs/1/stdout/0000000000000000", b"hello")
        source = tmp_path / "model.bin"
        source.write_bytes(b"weights")
        store.put_file("runs/r-1/outputs/1/deep/model.bin", source)
    finally:
        os.umask(before)
    objects = tmp_path / "state" / "objects"
    found = [objects, *objects.rglob("*")]
    assert len(found) == 13
    for path in found:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
