"""A pool's registries through the worker's cloud identity: ECR tokens from moto's server, ACR
refresh tokens from a stand-in of a registry's token exchange on loopback (the node identity's
Entra token is the one thing that cannot be had here). Each login is fetched once while fresh, by
one of several threads asking at once, and again once the clock passes its refresh point."""

import base64
import http.server
import json
import re
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from types import SimpleNamespace

import boto3
import pytest

from runplane.domain.secrets import SecretUnavailable
from tests.conftest import free_port
from worker_agent import ecr
from worker_agent.acr import ACR_USER, AcrLogins
from worker_agent.ecr import EcrLogins

SERVER = "123456789012.dkr.ecr.eu-west-1.amazonaws.com"
EXPIRES = datetime(2015, 1, 1, tzinfo=UTC).timestamp()  # what moto's ECR says every token expires at


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def counted(logins: EcrLogins, region: str) -> list[str]:
    """The GetAuthorizationToken calls ``logins`` makes to ``region`` (botocore's own hook)."""
    calls: list[str] = []
    logins._client(region).meta.events.register(
        "before-parameter-build.ecr.GetAuthorizationToken",
        lambda **kwargs: calls.append(kwargs["params"]["registryIds"][0]),
    )
    return calls


def test_an_ecr_login_is_fetched_once_while_fresh_and_again_before_it_expires(moto_endpoint):
    clock = Clock(EXPIRES - 12 * 3600)  # a token of 12 hours: replaced after 9 (75% of its life)
    logins = EcrLogins(endpoint_url=moto_endpoint, clock=clock)
    calls = counted(logins, "eu-west-1")
    with ThreadPoolExecutor(8) as pool:  # several slots pulling at once
        found = list(pool.map(lambda _: logins(SERVER), range(16)))
    assert calls == ["123456789012"]
    assert {(c.username, c.password) for c in found} == {("AWS", "123456789012-auth-token")}
    clock.now += 9 * 3600 - 1
    logins(SERVER)
    assert len(calls) == 1
    clock.now += 1
    assert logins(SERVER).password == "123456789012-auth-token"
    assert len(calls) == 2
    # 3 hours left at that fetch: replaced an hour before they are over, at the latest
    clock.now = EXPIRES - 3600
    logins(SERVER)
    assert len(calls) == 3


def test_ecr_logins_say_which_registry_and_why_they_fail():
    with pytest.raises(SecretUnavailable, match=r"registry ghcr\.io: not an ECR registry"):
        EcrLogins()("ghcr.io")
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(SecretUnavailable, match=rf"registry {SERVER}: cannot reach ECR in eu-west-1"):
        EcrLogins(endpoint_url=closed)(SERVER)


def jwt(claims: dict[str, object]) -> str:
    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part(claims)}.signature"


class Exchange:
    """A registry's ``POST /oauth2/exchange`` on loopback: checks the form ACR documents and
    answers a refresh token that expires ``life`` seconds after the clock's now; a token other than
    ``accepted`` gets 401."""

    def __init__(self, clock: Clock, accepted: str, life: float = 3 * 3600, redirect_to: str | None = None) -> None:
        self.forms: list[dict[str, str]] = []
        exchange = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
                exchange.forms.append(form)
                if redirect_to is not None:  # a registry that sends the token on elsewhere
                    self.send_response(307)
                    self.send_header("Location", f"http://{redirect_to}/oauth2/exchange")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                good = (
                    self.path == "/oauth2/exchange"
                    and self.headers.get("Content-Type") == "application/x-www-form-urlencoded"
                    and form.get("grant_type") == "access_token"
                    and form.get("service") == exchange.host
                )
                if not good:
                    self.send_response(400)
                    self.end_headers()
                    return
                if form.get("access_token") != accepted:
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps({"refresh_token": jwt({"exp": int(clock.now + life), "n": len(exchange.forms)})})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.host = f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class NodeIdentity:
    """The node's managed identity: the one part that cannot run here."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str) -> SimpleNamespace:
        self.scopes.append(scopes)
        return SimpleNamespace(token=self.token, expires_on=0)


LOOPBACK = re.compile(r"127\.0\.0\.1:[0-9]+")
"""The stand-ins' servers, taken as ACR hosts (the default takes NAME.azurecr.io and its like only)."""


@pytest.fixture
def clock():
    return Clock(1_800_000_000)


def test_an_acr_login_is_the_exchanged_refresh_token_fetched_again_before_it_expires(clock):
    exchange = Exchange(clock, accepted="entra-token")
    try:
        logins = AcrLogins(NodeIdentity("entra-token"), clock=clock, scheme="http", servers=LOOPBACK)
        with ThreadPoolExecutor(8) as pool:
            found = list(pool.map(lambda _: logins(exchange.host), range(16)))
        assert len(exchange.forms) == 1
        assert exchange.forms[0] == {
            "grant_type": "access_token",
            "service": exchange.host,
            "access_token": "entra-token",
        }
        first = found[0]
        assert {(c.username, c.password) for c in found} == {(ACR_USER, first.password)}
        clock.now += 2 * 3600 - 1  # three hours of life, the last hour of it not used
        assert logins(exchange.host) == first
        clock.now += 1
        second = logins(exchange.host)
        assert len(exchange.forms) == 2 and second.password != first.password
    finally:
        exchange.close()


def test_an_acr_login_refused_names_the_registry_and_the_role_it_needs(clock):
    exchange = Exchange(clock, accepted="entra-token")
    try:
        with pytest.raises(SecretUnavailable, match=rf"registry {exchange.host} refused .*HTTP 401.*AcrPull"):
            AcrLogins(NodeIdentity("someone-else"), clock=clock, scheme="http", servers=LOOPBACK)(exchange.host)
    finally:
        exchange.close()

    class NoIdentity:
        def get_token(self, *scopes: str) -> SimpleNamespace:
            raise RuntimeError("no managed identity endpoint")

    with pytest.raises(SecretUnavailable, match=r"registry lab\.azurecr\.io: the node identity gave no access token"):
        AcrLogins(NoIdentity(), clock=clock)("lab.azurecr.io")


def test_an_ecr_token_whose_refresh_fails_is_used_until_it_expires(moto_endpoint, caplog):
    """ECR out of reach at the refresh point: the token held (valid for hours yet) is used, the
    refresh tried again at each use, until a few minutes before it expires; then the failure shows."""
    clock = Clock(EXPIRES - 12 * 3600)
    logins = EcrLogins(endpoint_url=moto_endpoint, clock=clock)
    held = logins(SERVER)
    reachable = logins._client("eu-west-1")
    closed = boto3.client("ecr", region_name="eu-west-1", endpoint_url=f"http://127.0.0.1:{free_port()}")
    logins._clients["eu-west-1"] = closed  # ECR out of reach from here on
    clock.now = EXPIRES - 3 * 3600  # past the refresh point, three hours of life left
    assert logins(SERVER) == held
    assert any("ECR token could not be renewed" in r.getMessage() and SERVER in r.getMessage() for r in caplog.records)
    clock.now = EXPIRES - ecr.EXPIRY_MARGIN_SECONDS
    with pytest.raises(SecretUnavailable, match=rf"registry {SERVER}: cannot reach ECR"):
        logins(SERVER)
    logins._clients["eu-west-1"] = reachable  # back: the next use fetches a token
    calls = counted(logins, "eu-west-1")
    assert logins(SERVER) == held and calls == ["123456789012"]


def test_an_acr_refresh_token_whose_renewal_fails_is_used_until_it_expires(clock):
    exchange = Exchange(clock, accepted="entra-token")  # three hours of life
    logins = AcrLogins(NodeIdentity("entra-token"), clock=clock, scheme="http", servers=LOOPBACK)
    try:
        first = logins(exchange.host)
    finally:
        exchange.close()  # the registry's exchange out of reach from here on
    clock.now += 2 * 3600
    assert logins(exchange.host) == first
    clock.now += 3600 - ecr.EXPIRY_MARGIN_SECONDS  # a few minutes before it is over
    with pytest.raises(SecretUnavailable, match="cannot reach its token exchange"):
        logins(exchange.host)


@pytest.mark.parametrize("server", ["registry.example.com", "lab.azurecr.io.example.com", "azurecr.io", "LOOPBACK"])
def test_the_node_identitys_token_goes_to_acr_hosts_only(clock, server):
    exchange = Exchange(clock, accepted="entra-token")
    identity = NodeIdentity("entra-token")
    server = exchange.host if server == "LOOPBACK" else server
    try:
        with pytest.raises(SecretUnavailable, match=rf"registry {re.escape(server)}: not an ACR registry"):
            AcrLogins(identity, clock=clock, scheme="http")(server)
    finally:
        exchange.close()
    assert identity.scopes == [] and exchange.forms == []  # no token asked for, none sent


def test_an_acr_token_exchange_that_redirects_is_not_followed(clock):
    elsewhere = Exchange(clock, accepted="entra-token")
    redirecting = Exchange(clock, accepted="entra-token", redirect_to=elsewhere.host)
    try:
        logins = AcrLogins(NodeIdentity("entra-token"), clock=clock, scheme="http", servers=LOOPBACK)
        with pytest.raises(SecretUnavailable, match=r"answered a redirect \(HTTP 307\), not followed"):
            logins(redirecting.host)
        assert len(redirecting.forms) == 1 and elsewhere.forms == []  # the token went nowhere else
    finally:
        redirecting.close()
        elsewhere.close()
