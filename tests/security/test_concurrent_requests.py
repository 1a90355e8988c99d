"""Requests served side by side on both clouds' fronts never answer as another user: many
threads of two users (and a token that is no one's) interleave on one front, each gets its own
identity, its own runs and only its own errors."""

import threading
import uuid

import pytest

from runplane.client import Client
from tests.conftest import api_status

PARKED = {"command": "echo hi", "queue": "parked"}


def test_interleaved_requests_of_two_users_each_see_only_their_own(front):
    users = {"alice": Client(front.api_url, "alice-token"), "bob": Client(front.api_url, "bob-token")}
    stranger = Client(front.api_url, f"no-one-{uuid.uuid4().hex}")
    tag = uuid.uuid4().hex[:8]
    seen: list[tuple[str, str, object]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(16, timeout=30)

    def work(i: int) -> None:
        name = ("alice", "bob")[i % 2]
        client = users[name]
        try:
            start.wait()
            for round_ in range(2):
                seen.append((name, "me", client.request("GET", "/v1/me")["user"]))
                run = client.request("POST", "/v1/runs", {**PARKED, "name": f"{tag}-{name}-{i}-{round_}"})
                seen.append((name, "owner", client.request("GET", f"/v1/runs/{run['id']}")["owner"]))
                seen.append((name, "stranger", api_status(lambda: stranger.request("GET", "/v1/me"))[0]))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert len(seen) == 16 * 2 * 3
    for name, what, got in seen:
        assert got == (401 if what == "stranger" else name), (name, what, got)
    for name, client in users.items():
        mine = [r for r in client.request("GET", "/v1/runs", query={"limit": 200})["runs"]
                if (r["name"] or "").startswith(tag)]  # fmt: skip
        assert len(mine) == 8 * 2 and all(r["name"].startswith(f"{tag}-{name}-") for r in mine)
        for r in mine:
            client.request("POST", f"/v1/runs/{r['id']}/kill")


@pytest.mark.parametrize("front", ["local"], indirect=True)
def test_the_local_front_serves_requests_side_by_side(front, monkeypatch):
    """Two requests are inside the API at once (each waits for the other at the token check): a
    front that served one at a time would answer neither in time."""
    from runplane.services import auth

    meet = threading.Barrier(2, timeout=10)
    authenticate = auth.authenticate

    def slow_authenticate(*args, **kwargs):
        meet.wait()
        return authenticate(*args, **kwargs)

    monkeypatch.setattr(auth, "authenticate", slow_authenticate)
    answers: dict[str, object] = {}

    def call(name: str) -> None:
        try:
            answers[name] = Client(front.api_url, f"{name}-token").request("GET", "/v1/me")["user"]
        except Exception as e:
            answers[name] = repr(e)

    threads = [threading.Thread(target=call, args=(n,)) for n in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    monkeypatch.undo()
    assert answers == {"alice": "alice", "bob": "bob"}
