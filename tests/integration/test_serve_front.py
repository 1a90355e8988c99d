"""The production front of a serving stack (cheroot, runplane/devstack/wsgi.py), on the local
cloud in a process of its own: HTTPS with the operator's certificate, bodies past the limit
refused with 413 however they are framed, and a HEAD answered without a body, so that the next
answer on the connection is read whole."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from runplane.devstack.front import MAX_REQUEST
from runplane.devstack.process import DevStackProcess
from runplane.devstack.stack import DevConfig, free_port

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
