"""Sessions into live runs against a hostile second user, on both clouds' local stacks: another user's
run (an administrator's asking too, unless the pool has ``allow_admin_exec``) answers on every
sessions route exactly as a run that does not exist; bad bodies are a 422 (a 413, a 400) with a
message and store nothing; a run that is not running is a 409; a pool's ``allow_exec: false`` and
its full slots a 422 that names the setting; a ticket is shown once, never stored (its hash is) and
never listed. Pool settings and the reaper's expiry are shown on the services over a one-machine
stack of the test's own.

Every test makes users of its own, so nothing here meets another test's runs.
"""

import asyncio
import dataclasses
import json
import socket
import threading
import time
import uuid

import pytest

from runplane import bootstrap
from runplane.adapters.local.relay import FrontSessionRelay
from runplane.bootstrap import build_stack, make_ports
from runplane.cli import sessions as cli_sessions
from runplane.client import AsyncClient, Client, InvalidRequest
from runplane.client import Conflict as ApiConflict
from runplane.client.sessions import LOST, NotJoined
from runplane.devstack.relay import RelayHub
from runplane.domain.errors import Conflict, NotAllowed, NotFound
from runplane.domain.expect import Expect
from runplane.domain.pools import PoolConfig
from runplane.domain.runs import RunSpec
from runplane.domain.sessions import (
    REQUEST_SECONDS,
    Asked,
    Session,
    SessionKind,
    new_secret,
    secret_hash,
    session_id,
)
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.services import lifecycle, sessions
from runplane.services.reap import reap
from runplane.services.runs import submit_run
from runplane.settings import StackSettings
from tests.security.conftest import Caller

PARKED = {"command": "echo hi", "queue": "parked"}
EXEC = {"kind": "exec", "command": ["sh", "-c", "echo hi; exit 3"], "stdin": True}


@pytest.fixture(scope="module")
def front_stack(front):
    """The stores behind ``front``, in this process: the embedded stack's own, or Azurite's."""
    config = front.config
    if config.azure_connection_string is None:
        return bootstrap.stack()
    settings = StackSettings(
        cloud="azure",
        prefix=config.prefix,
        azure_storage_connection_string=config.azure_connection_string,
        pools=config.pools_file,
    )
    return build_stack(settings)


@pytest.fixture
def people(front):
    """``people()``: a Caller with a token of a new user; ``people.admin``: the admin's."""
    admin = Caller(front, "admin-token", "admin")

    def make():
        name = f"x-{uuid.uuid4().hex[:8]}"
        status, made = admin("POST", "/v1/tokens", {"user": name})
        assert status == 201, made
        return Caller(front, made["token"], name)

    make.admin = admin
    return make


@pytest.fixture
def running(front_stack):
    """``running(caller)``: the id of a run of the caller's, queued on "parked" and moved to running
    as its worker would."""

    def make(caller):
        status, made = caller("POST", "/v1/runs", PARKED)
        assert status == 201, made
        store = front_stack.store
        run = store.get(made["id"])
        held = lifecycle.claim(store, run, run.attempt, "w-sessions", 60.0, time.time())
        lifecycle.advance(store, held, RunState.RUNNING, time.time(), "started")
        return made["id"]

    return make


def test_another_users_run_answers_as_one_that_does_not_exist_on_every_route(people, running, front_stack):
    alice, bob = people(), people()
    run_id = running(alice)
    status, opened = alice("POST", f"/v1/runs/{run_id}/sessions", EXEC)
    assert status == 201, opened
    sid = opened["id"]
    missing = "r-" + uuid.uuid4().hex[:24]

    def routes(run, session):
        base = f"/v1/runs/{run}/sessions"
        return [("POST", base, EXEC), ("GET", base, None), ("POST", f"{base}/{session}/ticket", None),
                ("DELETE", f"{base}/{session}", None)]  # fmt: skip

    for caller in (bob, people.admin):  # "parked" leaves allow_admin_exec at false
        for (method, path, body), (_, gone, _) in zip(
            routes(run_id, sid), routes(missing, f"{missing}.0.0123abcd"), strict=True
        ):
            status, answer = caller(method, path, body)
            assert (status, answer["error"]["code"]) == (404, "not_found"), (caller.name, method, path, answer)
            assert answer == json.loads(json.dumps(caller(method, gone, body)[1]).replace(missing, run_id))
    # untouched: still requested, the owner's ticket still the one stored
    listed = alice("GET", f"/v1/runs/{run_id}/sessions")[1]["sessions"]
    assert [(s["id"], s["state"]) for s in listed] == [(sid, "requested")]
    assert front_stack.sessions.get(sid).client_secret_hash == secret_hash(opened["ticket"].rsplit(".", 1)[1])


def test_bad_bodies_are_refused_with_a_message_and_store_nothing(people, running, front_stack):
    alice = people()
    run_id = running(alice)
    path = f"/v1/runs/{run_id}/sessions"
    refused = {
        "unknown field": ({**EXEC, "privileged": True}, "privileged: Extra inputs are not permitted"),
        "NUL": ({"kind": "exec", "command": ["sh", "-c", "a\0b"]}, "cannot hold the NUL character"),
        "too many args": ({"kind": "exec", "command": ["x"] * 257}, "command: List should have at most 256"),
        "no args": ({"kind": "exec", "command": []}, "command: List should have at least 1"),
        "port 0": ({"kind": "port_forward", "port": 0}, "port: Input should be greater than or equal to 1"),
        "port 70000": ({"kind": "port_forward", "port": 70000}, "port: Input should be less than or equal to 65535"),
        "port as text": ({"kind": "port_forward", "port": "80"}, "port: Input should be a valid integer"),
        "unknown kind": ({"kind": "debug"}, "kind: Input should be 'exec', 'shell', 'port_forward' or 'attach'"),
        "exec without command": ({"kind": "exec"}, "exec needs a command"),
        "shell with a command": ({"kind": "shell", "command": ["rm", "-rf", "/"]}, "shell takes no command"),
        "forward without port": ({"kind": "port_forward"}, "port_forward needs a port"),
        "forward with a tty": ({"kind": "port_forward", "port": 80, "tty": True}, "port_forward takes no tty"),
        "exec with a port": ({**EXEC, "port": 22}, "exec takes no port"),
        "bad TERM": ({"kind": "shell", "term": "xterm; rm -rf /"}, "term: String should match pattern"),
        "rows 0": ({"kind": "shell", "rows": 0}, "rows: Input should be greater than or equal to 1"),
        "attach with a tty": ({"kind": "attach", "tty": False}, "attach takes no tty or stdin: it has the run's"),
        "attach with a command": ({"kind": "attach", "command": ["sh"]}, "attach takes no command"),
    }
    for what, (body, message) in refused.items():
        status, answer = alice("POST", path, body)
        assert (status, answer["error"]["code"]) == (422, "invalid_request"), (what, answer)
        assert message in answer["error"]["message"], (what, answer)
    big = alice("POST", path, {"kind": "exec", "command": ["x" * 40_000, "y" * 40_000]})
    assert big == (413, {"error": {"code": "payload_too_large", "message": "command: 80000 bytes as UTF-8; a "
                                   "session's command holds at most 65536"}})  # fmt: skip
    assert alice("POST", path, data=b'{"kind": "exec",')[0] == 400
    assert alice("POST", path, data=b"[]")[0] == 400
    assert alice("GET", path) == (200, {"sessions": []})
    assert front_stack.store.get(run_id).sessions_asked == 0


def test_a_run_that_is_not_running_is_a_conflict(people):
    alice = people()
    status, queued = alice("POST", "/v1/runs", PARKED)
    assert status == 201
    path = f"/v1/runs/{queued['id']}/sessions"
    assert alice("POST", path, EXEC) == (
        409, {"error": {"code": "conflict", "message": f"run {queued['id']} is not running (queued)"}},
    )  # fmt: skip
    alice("POST", f"/v1/runs/{queued['id']}/kill")
    assert (
        alice("POST", path, {"kind": "shell"})[1]["error"]["message"] == f"run {queued['id']} is not running (killed)"
    )
    assert alice("GET", path) == (200, {"sessions": []})


def test_tickets_are_shown_once_stored_as_hashes_and_slots_are_capped(front, people, running, front_stack):
    alice = people()
    run_id = running(alice)
    client = Client(front.api_url, alice.token)  # the SDK's calls of the routes
    opened = [client.open_session(run_id, "port_forward", port=8000 + i) for i in range(4)]  # parked: 4 slots
    with pytest.raises(InvalidRequest, match="max_sessions_per_run") as full:
        client.open_session(run_id, SessionKind.SHELL)
    assert (full.value.status, full.value.code) == (422, "not_allowed")
    first = opened[0]
    secret = first.ticket.rsplit(".", 1)[1]
    record = front_stack.sessions.get(first.id)
    assert record.client_secret_hash == secret_hash(secret) and secret not in record.model_dump_json()
    if front.config.cloud == "azure":  # Web PubSub: the ticket in a header of its own, a connect-only token in the URL
        assert first.relay.headers == {"X-Runplane-Ticket": f"Bearer {first.ticket}"}
        assert "/client/hubs/runplane?" in first.relay.url and secret not in first.relay.url
    else:
        assert first.relay.headers == {"Authorization": f"Bearer {first.ticket}"}
        assert first.relay.url.endswith("/v1/relay")
    listed = client.sessions(run_id)
    assert [s.id for s in listed] == [o.id for o in opened] and {s.state for s in listed} == {"requested"}
    assert secret not in json.dumps(alice("GET", f"/v1/runs/{run_id}/sessions")[1])
    renewed = client.session_ticket(run_id, first.id)
    assert renewed.id == first.id and renewed.ticket != first.ticket
    assert front_stack.sessions.get(first.id).client_secret_hash == secret_hash(renewed.ticket.rsplit(".", 1)[1])
    closed = client.close_session(run_id, first.id)
    assert (closed.state, closed.end_reason, closed.ended_at is not None) == ("ended", "closed", True)
    assert client.close_session(run_id, first.id) == closed  # over: answered as it is
    with pytest.raises(ApiConflict, match="is ended"):
        client.session_ticket(run_id, first.id)
    with pytest.raises(TypeError, match="list of arguments"):
        client.open_session(run_id, "exec", command="ls -l")

    async def shell():  # the closed one's slot is free again; a shell has a terminal and input by default
        async with AsyncClient(front.api_url, alice.token) as later:
            made = await later.open_session(run_id, "shell", rows=40, cols=120)
            return made, await later.sessions(run_id)

    again, seen = asyncio.run(shell())
    assert again.id.startswith(f"{run_id}.0.") and (again.tty, again.stdin, again.kind) == (True, True, "shell")
    assert [s.id for s in seen] == [again.id] + [o.id for o in opened[1:]]
    events = [e.message for e in front_stack.store.get(run_id).events]
    assert f"port-forward asked by {alice.name}: port 8000" in events and f"shell asked by {alice.name}" in events


# ------------------------------------------------------------------------------------------------
# The services over a stack of the test's own: pool settings and the reaper.


def _ports(stack, **pool):
    """``stack``'s ports with one pool, "p", of the settings ``pool``."""
    shape = {"cpus": 1, "memory": "1g", "default_image": "busybox"}
    pools = PoolConfig.model_validate({"pools": [{"name": "p", "backend": "local", "max_workers": 0, **shape, **pool}]})
    return dataclasses.replace(make_ports(stack), pools=pools)


def _running(ports, owner):
    """A run of ``owner``'s on pool "p", moved to running as its worker would."""
    run = submit_run(ports, owner, RunSpec(command="true", queue="p"), None).run
    held = lifecycle.claim(ports.store, run, run.attempt, "w1", 600.0, time.time())
    return lifecycle.advance(ports.store, held, RunState.RUNNING, time.time(), "started")


def test_pool_settings_refuse_sessions_and_let_admins_in_only_where_allowed(local_stack):
    alice, admin = Principal(user="alice", scopes=["runs:write"]), Principal(user="root", scopes=["admin"])
    asked = Asked(kind=SessionKind.EXEC, command=["true"])
    for rules, who, refused, message in [
        ({"allow_exec": False}, alice, NotAllowed, "does not allow sessions (allow_exec: false)"),
        ({}, admin, NotFound, "not found"),
        # past the owner's check: no relay here, and the message names what a deployed stack sets for one
        ({"allow_admin_exec": True}, admin, NotAllowed, "(RUNPLANE_RELAY_URL), on Azure a Web PubSub resource"),
    ]:
        ports = _ports(local_stack, **rules)
        run = _running(ports, alice)
        with pytest.raises(refused) as e:
            sessions.open_session(ports, who, run.id, asked)
        assert message in e.value.message, rules


def test_the_reaper_expires_sessions_no_worker_took_in_time(local_stack):
    ports = _ports(local_stack)
    alice = Principal(user="alice", scopes=["runs:write"])
    run = _running(ports, alice)
    now = time.time()
    made = []
    for slot, age in ((0, REQUEST_SECONDS + 5), (1, 5)):  # one past its time, one not
        _, digest = new_secret()
        made.append(ports.sessions.create(Session(
            id=session_id(run.id, slot), run_id=run.id, slot=slot, attempt=run.attempt, owner="alice",
            asked_by="alice", kind=SessionKind.SHELL, relay="ws://127.0.0.1:1/v1/relay", client_secret_hash=digest,
            created_at=now - age, expires_at=now - age + REQUEST_SECONDS,
        )))  # fmt: skip
    assert reap(ports).expired_sessions == []  # the run was never asked: its sessions are not read
    ports.store.update(run, Expect(attempt=run.attempt), {"sessions_asked": 2})
    report = reap(ports)
    assert report.expired_sessions == [made[0].id]
    states = {s.id: s.state for s in ports.sessions.for_run(run.id)}
    assert states == {made[0].id: "expired", made[1].id: "requested"}
    assert reap(ports).expired_sessions == []
    with pytest.raises(Conflict, match="is expired"):  # no fresh ticket for it
        sessions.new_ticket(ports, alice, run.id, made[0].id)


def _relayed(ports):
    """``ports`` with the one-machine relay (nothing dials it here: its endpoints and hang-ups only)."""
    return dataclasses.replace(ports, relay=FrontSessionRelay("http://127.0.0.1:9", RelayHub(ports.sessions)))


def _taken(ports, session, state):
    """``session`` taken by a worker, as its agent would: accepted, or active."""
    changes = {
        "state": "accepted",
        "worker_id": "w1",
        "worker_secret_hash": new_secret()[1],
        "accepted_at": time.time(),
    }
    taken = ports.sessions.update(session, frozenset({session.state}), changes)
    return taken if state == "accepted" else ports.sessions.update(taken, frozenset({taken.state}), {"state": state})


def test_sessions_of_a_lost_attempt_are_over_for_the_next_one_the_list_and_the_reaper(local_stack):
    ports = _relayed(make_ports(local_stack))  # the test pools: re-queueing sends to a queue of theirs
    alice = Principal(user="alice", scopes=["runs:write"])
    run = submit_run(ports, alice, RunSpec(command="true", queue="parked"), None).run
    run = lifecycle.claim(ports.store, run, run.attempt, "w1", 600.0, time.time())
    run = lifecycle.advance(ports.store, run, RunState.RUNNING, time.time(), "started")
    asked = Asked(kind=SessionKind.EXEC, command=["true"])
    old = [sessions.open_session(ports, alice, run.id, asked).session for _ in range(4)]
    old = [_taken(ports, s, "accepted" if i % 2 else "active") for i, s in enumerate(old)]
    run = lifecycle.requeue(ports, ports.store.get(run.id), time.time(), "worker w1 went", charge=False)
    again = lifecycle.claim(ports.store, run, run.attempt, "w2", 600.0, time.time())
    run = lifecycle.advance(ports.store, again, RunState.RUNNING, time.time(), "started")
    assert run.attempt == old[0].attempt + 1
    new = [sessions.open_session(ports, alice, run.id, asked).session for _ in range(2)]  # in the old ones' slots
    assert [s.slot for s in new] == [0, 1] and {s.attempt for s in new} == {run.attempt}
    listed = sessions.list_sessions(ports, alice, run.id)
    assert [s.id for s in listed] == [new[0].id, new[1].id, old[2].id, old[3].id]
    assert [(s.state, s.end_reason) for s in listed[2:]] == [("ended", "worker_lost")] * 2
    assert ports.sessions.get(old[2].id).state == "ended"  # as stored, not only as shown
    new += [sessions.open_session(ports, alice, run.id, asked).session for _ in range(2)]
    with pytest.raises(NotAllowed, match="max_sessions_per_run"):  # the new attempt's own hold their slots
        sessions.open_session(ports, alice, run.id, asked)
    # the reaper: a run whose worker stopped renewing its lease is re-queued, its sessions end with it
    run = ports.store.update(run, Expect(attempt=run.attempt), {"lease_expires_at": time.time() - 1})
    _taken(ports, new[0], "active")
    report = reap(ports)
    assert report.requeued == [run.id] and sorted(report.expired_sessions) == sorted(s.id for s in new)
    ended = {s.id: (s.state, s.end_reason) for s in ports.sessions.for_run(run.id)}
    assert ended == {s.id: ("ended", "worker_lost") for s in new}


def test_the_sessions_of_a_run_that_ended_read_ended_with_it(local_stack):
    ports = _relayed(make_ports(local_stack))
    alice = Principal(user="alice", scopes=["runs:write"])
    run = submit_run(ports, alice, RunSpec(command="true", queue="parked"), None).run
    run = lifecycle.claim(ports.store, run, run.attempt, "w1", 600.0, time.time())
    run = lifecycle.advance(ports.store, run, RunState.RUNNING, time.time(), "started")
    live = _taken(ports, sessions.open_session(ports, alice, run.id, Asked(kind=SessionKind.SHELL)).session, "active")
    lifecycle.advance(ports.store, run, RunState.UPLOADING, time.time(), "uploading")  # its worker went quiet here
    assert [(s.id, s.state, s.end_reason) for s in sessions.list_sessions(ports, alice, run.id)] == [
        (live.id, "ended", "run_ended")
    ]


class _RefusedRelay(Client):
    """The API as it is, but every session's relay a loopback port nothing listens on."""

    def __init__(self, url, token, relay_url):
        super().__init__(url, token)
        self.relay_url = relay_url

    def open_session(self, run_id, kind, **fields):
        answer = super().open_session(run_id, kind, **fields)
        return answer.model_copy(update={"relay": answer.relay.model_copy(update={"url": self.relay_url})})


@pytest.mark.parametrize("front", ["local"], indirect=True)
def test_a_session_whose_relay_refuses_is_closed_not_left_holding_a_slot(front, people, running):
    alice = people()
    run_id = running(alice)
    with socket.socket() as unused:  # bound, never listening: a connection to it is refused
        unused.bind(("127.0.0.1", 0))
        client = _RefusedRelay(front.api_url, alice.token, f"ws://127.0.0.1:{unused.getsockname()[1]}/v1/relay")
        run = client.get(run_id)
        for _ in range(3):  # "parked" has 4 slots: tries that each kept one would be refused by the 5th
            with pytest.raises(NotJoined, match="cannot reach the session's relay"):
                run.exec(["true"])
            with pytest.raises(NotJoined):
                run.port_forward(8000)
        assert cli_sessions._interact(client, run_id, "exec", ["true"], False, False) == LOST  # the CLI's
    listed = client.sessions(run_id)
    assert {(s.state, s.end_reason) for s in listed} == {("ended", "closed")}, listed


@pytest.mark.parametrize("front", ["local"], indirect=True)
def test_the_sdks_wait_for_a_worker_ends_when_the_run_stops_running(front, people, running, front_stack):
    alice = people()
    store = front_stack.store
    client = Client(front.api_url, alice.token)

    def exec_as_it_moves_on(run_id, call):
        """``call()``'s NotJoined while run ``run_id`` (on "parked": no worker ever takes its
        sessions) moves on to uploading after a second, as its worker does once its command exited."""
        moved = threading.Timer(1.0, lambda: lifecycle.advance(store, store.get(run_id), RunState.UPLOADING, 0, "up"))
        moved.start()
        try:
            with pytest.raises(NotJoined, match="the run is uploading") as lost:
                call()
        finally:
            moved.join()
        # ended: closed by the SDK giving up, or found ended with its run first (the order is the machine's)
        ended = [(s.state, s.end_reason) for s in client.sessions(run_id)]
        assert len(ended) == 1 and ended[0] in {("ended", "closed"), ("ended", "run_ended")}, ended
        return lost.value.reason

    async def async_exec(run_id):
        async with AsyncClient(front.api_url, alice.token) as later:
            await (await later.get(run_id)).exec(["true"])

    first, second = running(alice), running(alice)
    # long before the relay's wait for a peer (REQUEST_SECONDS) is over
    assert exec_as_it_moves_on(first, lambda: client.get(first).exec(["true"])) == "run_ended"
    assert exec_as_it_moves_on(second, lambda: asyncio.run(async_exec(second))) == "run_ended"


def test_only_the_one_who_asked_for_a_session_gets_a_new_ticket_to_it(local_stack):
    ports = _relayed(_ports(local_stack, allow_admin_exec=True))
    alice, admin = Principal(user="alice", scopes=["runs:write"]), Principal(user="root", scopes=["admin"])
    run = _running(ports, alice)
    session = _taken(ports, sessions.open_session(ports, alice, run.id, Asked(kind=SessionKind.EXEC)).session, "active")
    before = ports.sessions.get(session.id).client_secret_hash
    with pytest.raises(NotFound, match="not found"):  # an admin let in may open sessions, not join alice's
        sessions.new_ticket(ports, admin, run.id, session.id)
    assert ports.sessions.get(session.id).client_secret_hash == before
    assert sessions.new_ticket(ports, alice, run.id, session.id).session.client_secret_hash != before
