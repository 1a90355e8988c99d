"""The Azure relay's refusals, on Web PubSub's stand-in and the function app's event route: a
token of one session opens nothing of another's; a token expired, or signed with another key, is
refused by the service (its client endpoint and its REST API alike); an event whose ce-signature
is not the access key's is refused by the route, and so is the abuse-protection handshake of
another origin. And the stand-in's own behaviour where the contract does not reach: message kinds
kept, the REST calls, sendEvent mode, its events signed and in order, the handshake once. (What
the relay does for a session is the relay contract's: test_session_relay.py.)"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from runplane.adapters.azure.relay import HUB, TICKET_HEADER, group, mint, signature
from runplane.devstack.webpubsub import WebPubSubFake
from runplane.domain import session_wire
from runplane.domain.session_wire import Frame, FrameType
from tests.integration.contracts.relay_stacks import STACKS, RelayStack


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[RelayStack]:
    with STACKS["azure"](tmp_path) as stack:
        yield stack


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    with pytest.raises(InvalidStatus) as caught:
        connect(url, additional_headers=headers or {}, open_timeout=10)
    return caught.value.response.status_code


def test_a_token_of_one_session_opens_nothing_of_another(relay: RelayStack) -> None:
    a, a_client, _ = relay.session()
    b, b_client, b_worker = relay.session()
    a_url = relay.relay.endpoint(a, a_client).url
    b_url = relay.relay.endpoint(b, b_client).url
    # a's URL (its token names a) with b's ticket, and b's URL with a's ticket: neither opens
    assert _status(a_url, {TICKET_HEADER: f"Bearer {b_client}"}) == 401
    assert _status(b_url, {TICKET_HEADER: f"Bearer {a_client}"}) == 401
    # a's client sending to b's worker group: a's URL with the group changed is refused at connect
    assert (
        _status(a_url.replace(group(a.id, "worker"), group(b.id, "worker")), {TICKET_HEADER: f"Bearer {a_client}"})
        == 401
    )
    # the worker's URL with the client's ticket (it would publish to itself) is refused too
    assert _status(relay.relay.endpoint(b, b_client).worker_url or "", {TICKET_HEADER: f"Bearer {b_client}"}) == 401
    fake: WebPubSubFake = relay.extras["fake"]
    assert fake.connections(HUB) == []
    # the token alone, straight to the service (no event handler to ask): it joins nothing, sends nothing
    fake.handlers.clear()
    with connect(a_url.replace(group(a.id, "worker"), group(b.id, "worker"))) as ws:
        assert fake.connections(HUB, group(b.id, "worker")) == []
        ws.send(b"\x02\x00\x01\x00\x00\x00\x01forged")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert b_worker  # b's sides were never reached


def test_the_workers_url_outlasts_the_clients_as_the_worker_dials_again_with_it_after_a_drop(relay: RelayStack) -> None:
    session, client_ticket, _ = relay.session()
    endpoint = relay.relay.endpoint(session, client_ticket)

    def lasts(url: str) -> int:
        token = parse_qs(urlsplit(url).query)["access_token"][0]
        claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
        return int(claims["exp"]) - int(claims["iat"])

    assert (lasts(endpoint.url), lasts(endpoint.worker_url or "")) == (15 * 60, 24 * 3600)


def test_expired_and_other_key_tokens_are_refused_by_the_service(relay: RelayStack) -> None:
    fake: WebPubSubFake = relay.extras["fake"]
    url = f"ws{fake.endpoint.removeprefix('http')}/client/hubs/{HUB}"
    aud = f"{fake.endpoint}/client/hubs/{HUB}"
    now = int(time.time())
    good = {"aud": aud, "exp": now + 60, "sub": "someone"}
    fake.handlers.clear()
    with connect(f"{url}?access_token={mint(fake.key, good)}"):
        pass  # the control: a token of the key, in time, for this hub opens
    for token in (
        mint(fake.key, {**good, "exp": now - 3600}),  # expired
        mint("another-key", good),  # another key
        mint(fake.key, {**good, "aud": f"{fake.endpoint}/client/hubs/other"}),  # another hub
        mint(fake.key, {"aud": aud, "sub": "someone"}),  # no exp
    ):
        assert _status(f"{url}?access_token={token}") == 401
    assert _status(url, {"Authorization": f"Bearer {mint('another-key', good)}"}) == 401
    rest = f"{fake.endpoint}/api/hubs/{HUB}/groups/g/:send"
    for token, status in (
        (mint(fake.key, {"aud": rest, "exp": now + 60}), 202),
        (mint(fake.key, {"aud": rest, "exp": now - 3600}), 401),
        (mint("another-key", {"aud": rest, "exp": now + 60}), 401),
        (mint(fake.key, {"aud": f"{fake.endpoint}/api/hubs/{HUB}/:send", "exp": now + 60}), 401),
    ):
        answer = httpx.post(rest, content=b"x", headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == status


def test_the_event_route_refuses_forged_signatures_and_other_origins(relay: RelayStack) -> None:
    session, client_ticket, _ = relay.session()
    fake: WebPubSubFake = relay.extras["fake"]
    route = fake.handlers[HUB].url
    body = (
        f'{{"headers": {{"{TICKET_HEADER}": ["Bearer {client_ticket}"]}}, '
        f'"query": {{"group": ["{group(session.id, "worker")}"]}}}}'
    )
    headers = {
        "ce-type": "azure.webpubsub.sys.connect",
        "ce-connectionId": "c-1",
        "ce-hub": HUB,
        "ce-userId": session.id,
        "Content-Type": "application/json",
    }
    signed = httpx.post(route, content=body, headers={**headers, "ce-signature": signature(fake.key, "c-1")})
    assert signed.status_code == 200  # the control: the service's own event is answered
    assert signed.json()["groups"] == [group(session.id, "client")]
    signed_headers = {**headers, "ce-signature": signature(fake.key, "c-1")}
    for bad in (b"not json", b"[]", b'{"headers": [], "query": {}}', b'{"headers": {}, "query": "x"}'):
        assert httpx.post(route, content=bad, headers=signed_headers).status_code == 400, bad
    for forged in ("", "sha256=00", signature("another-key", "c-1"), signature(fake.key, "c-2")):
        answer = httpx.post(route, content=body, headers={**headers, "ce-signature": forged})
        assert (answer.status_code, answer.content) == (401, b"")
    gone = {**headers, "ce-type": "azure.webpubsub.sys.disconnected", "ce-userId": f"{session.id}.worker"}
    assert httpx.post(route, content=b"{}", headers={**gone, "ce-signature": "sha256=00"}).status_code == 401
    other = httpx.options(route, headers={"WebHook-Request-Origin": "evil.example"})
    assert "WebHook-Allowed-Origin" not in other.headers
    own = httpx.options(route, headers={"WebHook-Request-Origin": "127.0.0.1"})
    assert own.headers["WebHook-Allowed-Origin"] == "127.0.0.1"


def test_a_disconnected_event_ends_only_the_side_its_connection_was_once_that_side_is_gone(relay: RelayStack) -> None:
    fake: WebPubSubFake = relay.extras["fake"]
    route = fake.handlers[HUB].url
    victim, v_client, v_worker = relay.session()
    mine, m_client, _ = relay.session()
    data = Frame(FrameType.DATA, 0, 1, b"still here").encode()

    def disconnected(connection: str, user: str) -> int:
        headers = {
            "ce-type": "azure.webpubsub.sys.disconnected",
            "ce-connectionId": connection,
            "ce-signature": signature(fake.key, connection),  # a leaked signature: the service's own
            "ce-hub": HUB,
            "ce-userId": user,
            "Content-Type": "application/json",
        }
        return httpx.post(route, content=b'{"reason": ""}', headers=headers).status_code

    with relay.dial(victim, v_client) as client, relay.dial(victim, v_worker) as worker:
        with relay.dial(mine, m_client):
            (leaked,) = fake.connections(HUB, group(mine.id, "client"))
            tag = (fake.user(leaked) or "").rsplit(".", 1)[-1]
        _wait(lambda: fake.user(leaked) is None)
        # a gone connection's signature, replayed with the victim's side named: refused, nothing told
        for named in (f"{victim.id}.worker", f"{victim.id}.worker.{tag}", f"{victim.id}.client.{tag}"):
            assert disconnected(leaked, named) == 401, named
        # a live connection's own signature and user id (its connected event, leaked): it is not gone
        (live,) = fake.connections(HUB, group(victim.id, "worker"))
        assert disconnected(live, fake.user(live) or "") == 204
        worker.send(data)
        assert client.recv() == data  # no GONE came first: the victim's session goes on
        assert relay.held(victim.id) == ["client", "worker"]
        worker.close()  # the control: the worker's own end reaches its client
        gone = session_wire.decode(client.recv())
        assert (gone.type, gone.json()) == (FrameType.GONE, {"reason": "worker_gone"})


class _Upstream(BaseHTTPRequestHandler):
    """An event handler that records what the service sends it and answers as told."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, dict[str, str], bytes]]
    allow = "*"

    def _any(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.command, {k.lower(): v for k, v in self.headers.items()}, body))
        kind = self.headers.get("ce-type", "")
        answer, headers = b"", {"WebHook-Allowed-Origin": self.allow}
        if kind == "azure.webpubsub.sys.connect":
            answer, headers["Content-Type"] = b'{"groups": ["joined"], "roles": ["webpubsub.sendToGroup.g"]}', "x"
        elif kind == "azure.webpubsub.user.message":  # sendEvent mode: the answer goes back, as it came
            answer, headers["Content-Type"] = body[::-1], self.headers.get("Content-Type", "")
        self.send_response(200 if answer or self.command == "OPTIONS" else 204)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    do_POST = do_OPTIONS = _any

    def log_message(self, format: str, *args: object) -> None:
        pass


Service = tuple[WebPubSubFake, list[tuple[str, dict[str, str], bytes]]]


@pytest.fixture
def service() -> Iterator[Service]:
    seen: list[tuple[str, dict[str, str], bytes]] = []
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), type("Upstream", (_Upstream,), {"seen": seen}))
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    fake = WebPubSubFake().start()
    fake.handle("h", f"http://127.0.0.1:{upstream.server_address[1]}/events")
    try:
        yield fake, seen
    finally:
        fake.stop()
        upstream.shutdown()
        upstream.server_close()


def _client(fake: WebPubSubFake, user: str, query: str = "", **claims: object) -> ClientConnection:
    token = mint(
        fake.key, {"aud": f"{fake.endpoint}/client/hubs/h", "exp": int(time.time()) + 60, "sub": user, **claims}
    )
    return connect(f"ws{fake.endpoint.removeprefix('http')}/client/hubs/h?access_token={token}{query}", max_size=None)


def _rest(
    fake: WebPubSubFake, method: str, path: str, body: bytes = b"", kind: str = "text/plain", **query: str
) -> int:
    url = f"{fake.endpoint}/api/hubs/h{path}"
    token = mint(fake.key, {"aud": url, "exp": int(time.time()) + 60})
    headers = {"Authorization": f"Bearer {token}", "Content-Type": kind}
    params = {**query, "api-version": "2024-12-01"}
    return httpx.request(method, url, params=params, content=body, headers=headers).status_code


def _wait(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_the_stand_in_keeps_message_kinds_and_tells_its_handler_what_happens(service: Service) -> None:
    fake, seen = service
    with (
        _client(fake, "member", **{"webpubsub.group": "g"}) as member,
        _client(fake, "sender", "&webpubsub_mode=sendToGroup&group=g") as sender,
    ):
        # the connect event's roles let the sender publish to g; its groups join it to "joined"
        sender.send(b"\x00\xffbinary")
        sender.send("text")
        assert (member.recv(timeout=10), member.recv(timeout=10)) == (b"\x00\xffbinary", "text")
        assert _rest(fake, "POST", "/groups/g/:send", b"\x01raw", "application/octet-stream") == 202
        assert _rest(fake, "POST", "/groups/joined/:send", b"to joined") == 202
        assert (member.recv(timeout=10), member.recv(timeout=10)) == (b"\x01raw", "to joined")
        assert sender.recv(timeout=10) == "to joined"  # both joined "joined" (the connect event's groups)
        (member_id,) = fake.connections("h", "g")
        assert (_rest(fake, "HEAD", f"/connections/{member_id}"), _rest(fake, "HEAD", "/groups/g")) == (200, 200)
        assert _rest(fake, "POST", f"/connections/{member_id}/:send", b"\x02", "application/octet-stream") == 202
        assert member.recv(timeout=10) == b"\x02"
        assert _rest(fake, "DELETE", f"/connections/{member_id}", reason="done") == 204
        with pytest.raises(ConnectionClosed):
            member.recv(timeout=10)
        assert (_rest(fake, "HEAD", f"/connections/{member_id}"), _rest(fake, "HEAD", "/groups/g")) == (404, 404)
    with _client(fake, "eventer") as eventer:  # sendEvent mode: a message event, its answer back
        eventer.send(b"abc")
        assert eventer.recv(timeout=10) == b"cba"
        eventer.send("xyz")
        assert eventer.recv(timeout=10) == "zyx"
    _wait(lambda: sum(h.get("ce-type") == "azure.webpubsub.sys.disconnected" for _, h, _ in seen) == 3)
    assert [m for m, _, _ in seen].count("OPTIONS") == 1  # the abuse-protection handshake, once
    events = [(h["ce-type"].rsplit(".", 1)[-1], h["ce-userid"]) for m, h, _ in seen if m == "POST"]
    for user in ("member", "sender", "eventer"):
        mine = [kind for kind, who in events if who == user]
        assert mine[:2] == ["connect", "connected"] and mine[-1] == "disconnected", (user, mine)
    for method, headers, _ in seen:
        if method == "POST":  # each event signed with the key, over its connection id
            assert headers["ce-signature"] == signature(fake.key, headers["ce-connectionid"])
            assert headers["ce-hub"] == "h" and headers["webhook-request-origin"] == "127.0.0.1"
    connect_body = next(json.loads(b) for _, h, b in seen if h.get("ce-type", "").endswith(".connect"))
    assert connect_body["claims"]["sub"] == ["member"] and "access_token" not in connect_body["query"]
