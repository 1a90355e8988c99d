"""The production front of a serving stack (cheroot, runplane/devstack/wsgi.py), on the local
cloud in a process of its own: HTTPS with the operator's certificate, bodies past the limit
refused with 413 however they are framed, and a HEAD answered without a body, so that the next
answer on the connection is read whole. Hostile clients hold no one up: one that never shakes
hands, one whose head is endless, one whose Content-Length is not a number, and many that trickle
their headers."""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import http.client
import ipaddress
import secrets
import select
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from runplane.bootstrap import build_stack
from runplane.devstack.front import MAX_REQUEST
from runplane.devstack.process import DevStackProcess
from runplane.devstack.stack import DevConfig, free_port
from runplane.devstack.wsgi import HEAD_SECONDS, MAX_HEADERS
from runplane.settings import StackSettings

POOLS = """pools:
  - {name: default, backend: local, cpus: 1, memory: 1g, disk: 1g, max_workers: 0, default_image: busybox}
"""


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevStackProcess, Path]]:
    tmp = tmp_path_factory.mktemp("serve-front")
    cert, key = self_signed(tmp)
    (tmp / "pools.yaml").write_text(POOLS)
    config = DevConfig(
        port=free_port(),
        state_dir=tmp / "state",
        pools_file=str(tmp / "pools.yaml"),
        write_dev_file=False,
        serve=True,
        tls_cert=cert,
        tls_key=key,
    )
    stack = DevStackProcess(config, tmp / "serve.log")
    stack.start()
    yield stack, cert
    stack.stop()


def test_it_serves_https_with_the_operators_certificate(served):
    stack, cert = served
    assert stack.api_url.startswith("https://127.0.0.1:")
    me = httpx.get(f"{stack.api_url}/v1/me", headers={"Authorization": f"Bearer {stack.token}"}, verify=str(cert))
    assert me.status_code == 200 and me.json()["scopes"]
    with pytest.raises(httpx.ConnectError):  # an unknown issuer: no plain client trusts it
        httpx.get(f"{stack.api_url}/v1/me")


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_past_the_limit_is_refused_413(served, framing):
    stack, cert = served
    chunks = [b"x" * (1024 * 1024)] * (MAX_REQUEST // (1024 * 1024) + 1)
    body = b"".join(chunks) if framing == "content-length" else iter(chunks)
    answer = httpx.post(
        f"{stack.api_url}/v1/runs",
        content=body,
        headers={"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"},
        verify=str(cert),
    )
    assert answer.status_code == 413


def test_a_head_has_no_body_and_the_next_answer_on_the_connection_is_whole(served):
    stack, cert = served
    port = int(stack.api_url.rsplit(":", 1)[1])
    request = f"/v1/me HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {stack.token}\r\n"
    context = ssl.create_default_context(cafile=str(cert))
    with socket.create_connection(("127.0.0.1", port)) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(f"HEAD {request}\r\nGET {request}Connection: close\r\n\r\n".encode())
            received = b""
            while chunk := tls.recv(65536):
                received += chunk
    head, rest = received.split(b"\r\n\r\n", 1)
    # the API serves no HEAD of /v1/me: its refusal has a length, and no body on the wire
    assert head.startswith(b"HTTP/1.1 405") and b"Content-Length: 0" not in head
    assert rest.startswith(b"HTTP/1.1 200")
    get_headers, get_body = rest.split(b"\r\n\r\n", 1)
    lengths = [int(line.split(b":")[1]) for line in get_headers.split(b"\r\n") if line.startswith(b"Content-Length")]
    assert lengths == [len(get_body)]
    assert b'"scopes"' in get_body


def _tls(stack: DevStackProcess, cert: Path) -> ssl.SSLSocket:
    port = int(stack.api_url.rsplit(":", 1)[1])
    context = ssl.create_default_context(cafile=str(cert))
    return context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="127.0.0.1")


def _me(stack: DevStackProcess, cert: Path) -> int:
    auth = {"Authorization": f"Bearer {stack.token}"}
    return httpx.get(f"{stack.api_url}/v1/me", headers=auth, verify=str(cert), timeout=5).status_code


def test_a_client_that_never_shakes_hands_holds_no_one_up(served):
    """TLS is negotiated in the thread that serves a connection, not in the one that accepts them
    all: a connection that sends nothing does not keep the next client from being answered."""
    stack, cert = served
    port = int(stack.api_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)):  # accepted first, and silent
        assert _me(stack, cert) == 200


def test_a_head_past_the_limit_is_refused_413(served):
    stack, cert = served
    with _tls(stack, cert) as tls:
        tls.sendall(b"GET /v1/me HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * (MAX_HEADERS + 1024) + b"\r\n\r\n")
        assert tls.recv(100).startswith(b"HTTP/1.1 413")


@pytest.mark.parametrize("length", ["-1", "+2"])
def test_a_content_length_that_is_not_digits_is_refused_400_before_the_body(served, length):
    """``-1`` would read the body to the end of the connection: refused before a byte of it is read,
    while the client keeps the connection open."""
    stack, cert = served
    with _tls(stack, cert) as tls:
        tls.sendall(f"POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n{{}}".encode())
        answer = tls.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400") and b"Content-Length is not a number" in answer


def test_clients_trickling_their_headers_are_dropped_and_meanwhile_others_are_answered(served):
    """70 clients each sending a header line a second: another client is answered while they hold
    their connections, and each is dropped once HEAD_SECONDS have passed, however it trickles."""
    stack, cert = served
    slow = [_tls(stack, cert) for _ in range(70)]
    try:
        for tls in slow:
            tls.sendall(b"GET /v1/me HTTP/1.1\r\nHost: x\r\n")
        assert _me(stack, cert) == 200
        held, ends = list(slow), []
        until = time.monotonic() + HEAD_SECONDS + 10
        while held and time.monotonic() < until:
            for tls in select.select(held, [], [], 1.0)[0]:
                try:
                    ends.append(tls.recv(100)[:12])
                except OSError:
                    ends.append(b"")
                held.remove(tls)
            for tls in held:
                with contextlib.suppress(OSError):
                    tls.sendall(b"X-A: b\r\n")
        assert not held, f"{len(held)} trickling clients still held past {HEAD_SECONDS} s"
        assert set(ends) <= {b"HTTP/1.1 408", b""}
    finally:
        for tls in slow:
            tls.close()


def test_a_signed_put_past_the_request_limit_is_stored_as_it_is_read(served):
    stack, cert = served
    config = stack.config
    settings = StackSettings(
        cloud="local", state_dir=str(config.state_dir), public_url=stack.api_url, pools=config.pools_file
    )
    objects = build_stack(settings).objects
    data = secrets.token_bytes(MAX_REQUEST + 1024 * 1024)
    md5 = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
    url, headers = objects.put_url("uploads/alice/" + "c" * 64, len(data), md5)
    assert httpx.put(url, content=data, headers=headers, verify=str(cert)).status_code == 200
    assert objects.get_bytes("uploads/alice/" + "c" * 64) == data
    # a refused PUT leaves its body unread: its connection ends, and the next request is answered whole
    small = b"not alice's archive"
    bobby = urlsplit(objects.put_url("uploads/bobby/" + "c" * 64, len(small), md5)[0])
    port = urlsplit(stack.api_url).port
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=ssl.create_default_context(cafile=cert))
    try:
        connection.request("PUT", f"{bobby.path}x?{bobby.query}", body=small, headers={"Content-MD5": md5})
        assert connection.getresponse().read() and objects.head("uploads/bobby/" + "c" * 64 + "x") is None
        connection.request("GET", "/v1/me", headers={"Authorization": f"Bearer {stack.token}"})
        assert connection.getresponse().status == 200
    finally:
        connection.close()
