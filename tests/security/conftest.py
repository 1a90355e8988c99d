"""The hostile second user's tests run against the real local stacks: each case on two fronts (the
embedded default, `runplane dev` on SQLite and files, and the Azure HTTP function on Azurite), with
the users of ``tests.conftest.register_users``. The Lambda handler behind API Gateway v2 events is
fuzzed on moto (test_fuzz.py) and driven by ``own_front`` and the e2e suite's ``aws_devstack``."""

import json
import time
import urllib.error
import urllib.request
import uuid

import pytest

from runplane import bootstrap
from runplane.client import Client
from runplane.services.auth import register_token
from tests.security.api_instance import caller


@pytest.fixture(scope="module", params=["local", "azure"])
def front(request):
    return request.getfixturevalue("devstack" if request.param == "local" else "azure_devstack")


@pytest.fixture(scope="module")
def user(front):
    """``user("bob")``: a client with ``bob-token`` on this front."""
    return lambda name: Client(front.api_url, f"{name}-token")


@pytest.fixture(scope="module")
def mallory(front, user):
    """A user of this module's own, with no runs of any other test: (client, its token)."""
    made = user("admin").request("POST", "/v1/tokens", {"user": f"mallory-{uuid.uuid4().hex[:8]}"})
    return Client(front.api_url, made["token"]), made["token"]


@pytest.fixture
def people(front, user):
    """``people()``: (a client of a new user of this front, its bearer headers)."""

    def make():
        made = user("admin").request("POST", "/v1/tokens", {"user": f"p-{uuid.uuid4().hex[:8]}"})
        headers = {"Authorization": f"Bearer {made['token']}", "Content-Type": "application/json"}
        return Client(front.api_url, made["token"]), headers

    return make


@pytest.fixture(params=["aws", "azure"])
def own_front(request):
    """The cloud's API function called in this process, on a fresh stack of its own (moto's
    server, Azurite) whose one token is the administrator ``root-token``: for what the shared
    fronts cannot show, such as a stack with a single admin. ``own_front(method, path, token,
    body=None)`` -> (status, parsed body or None)."""
    stack = request.getfixturevalue("aws_stack" if request.param == "aws" else "azure_stack")
    register_token(stack.tokens, "root-token", "root", scopes=["admin"], now=time.time())
    before = bootstrap.use(stack)
    call = caller(request.param)

    def send(method, path, token, body=None):
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        status, data = call(method, path, headers, json.dumps(body).encode() if body is not None else b"")
        return status, json.loads(data) if data else None

    yield send
    bootstrap.use(before)


def raw(front, method, path, body=None, headers=None):
    """(status, headers, parsed body or None) of one request, whatever its status."""
    req = urllib.request.Request(front.api_url + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, data, got = resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as e:
        status, data, got = e.code, e.read(), dict(e.headers)
    return status, {k.lower(): v for k, v in got.items()}, json.loads(data) if data else None


class Caller:
    """One token's requests, answered as (status, parsed body or None), whatever the status."""

    def __init__(self, front, token, name=None):
        self.front, self.token, self.name = front, token, name

    def __call__(self, method, path, body=None, data=None):
        sent = data if data is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        status, _, answer = raw(self.front, method, path, sent, headers)
        return status, answer


def bearer(name):
    return {"Authorization": f"Bearer {name}-token", "Content-Type": "application/json"}
