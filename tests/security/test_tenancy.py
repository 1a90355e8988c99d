"""A second user tries to cross into another's runs, tokens and data; a token tries to do more
than its scopes allow. On both clouds' local stacks."""

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest

from runplane.bootstrap import build_stack, make_ports
from runplane.client import Client, LastAdminToken
from runplane.client.errors import error_from_answer
from runplane.devstack.process import DevStackProcess
from runplane.devstack.stack import DevConfig, free_port
from runplane.domain.errors import LastAdmin, NotFound
from runplane.services import tenancy
from runplane.settings import StackSettings
from tests.conftest import DATASETS, POOLS_FILE, TERMINAL, VISION_DATA, api_status, wait_for, wait_state
from tests.security.conftest import bearer, raw

PARKED = {"command": "echo hi", "queue": "parked"}


def _stack_of(front):
    """The stores behind ``front``, as a second API instance would build them."""
    config = front.config
    if config.cloud == "local":
        settings = StackSettings(
            cloud="local",
            prefix=config.prefix,
            state_dir=str(front.state_dir),
            public_url=front.public_url,
            pools=config.pools_file,
        )
    elif config.cloud == "aws":
        settings = StackSettings(
            prefix=config.prefix, aws_endpoint_url=config.aws_endpoint_url, pools=config.pools_file
        )
    else:
        settings = StackSettings(
            cloud="azure",
            prefix=config.prefix,
            azure_storage_connection_string=config.azure_connection_string,
            pools=config.pools_file,
        )
    return build_stack(settings)


def own_bucket(front):
    return _stack_of(front).data_bucket


# ---- users, groups, tokens ---------------------------------------------------------------


def test_an_admin_makes_lists_and_revokes_tokens(front, user):
    admin = user("admin")
    made = admin.request("POST", "/v1/tokens", {"user": "dora", "groups": ["vision", "nlp"], "expires_in": "30d"})
    assert made["id"].startswith("tok-") and made["token"].startswith("rp_")
    assert (made["user"], made["groups"], made["scopes"]) == ("dora", ["nlp", "vision"], ["runs:read", "runs:write"])
    assert made["created_by"] == "admin" and made["expires_at"] > made["created_at"]
    dora = Client(front.api_url, made["token"])
    me = dora.request("GET", "/v1/me")
    assert me == {
        "user": "dora",
        "groups": ["nlp", "vision"],
        "scopes": ["runs:read", "runs:write"],
        "token_id": made["id"],
        "default_group": None,
    }
    listed = admin.request("GET", "/v1/tokens", query={"user": "dora"})["tokens"]
    assert [t["id"] for t in listed] == [made["id"]]
    everything = json.dumps(admin.request("GET", "/v1/tokens"))
    assert made["token"] not in everything  # the secret is shown once, never listed
    assert hashlib.sha256(made["token"].encode()).hexdigest() not in everything
    assert "token" not in listed[0]
    assert admin.request("DELETE", f"/v1/tokens/{made['id']}") is None
    assert api_status(lambda: dora.request("GET", "/v1/me"))[:2] == (401, "unauthorized")
    assert api_status(lambda: admin.request("DELETE", f"/v1/tokens/{made['id']}"))[:2] == (404, "not_found")
    assert admin.request("GET", "/v1/tokens", query={"user": "dora"})["tokens"] == []


def test_the_last_admin_token_cannot_be_revoked(own_front):
    """A stack must not lock its administrators out: the only admin token is refused (409
    ``last_admin``, saying what to do), through its own or any admin's call, until another exists."""
    root = own_front("GET", "/v1/me", "root-token")[1]["token_id"]
    status, refused = own_front("DELETE", f"/v1/tokens/{root}", "root-token")
    assert (status, refused["error"]["code"]) == (409, "last_admin")
    assert "make another admin token first" in refused["error"]["message"]
    assert isinstance(error_from_answer(status, json.dumps(refused).encode()), LastAdminToken)  # the SDK's
    assert own_front("GET", "/v1/me", "root-token")[0] == 200  # still there
    _, user = own_front("POST", "/v1/tokens", "root-token", {"user": "dora"})
    assert own_front("DELETE", f"/v1/tokens/{user['id']}", "root-token")[0] == 204  # a user's: as always
    _, ops = own_front("POST", "/v1/tokens", "root-token", {"user": "ops", "scopes": ["admin"]})
    assert own_front("DELETE", f"/v1/tokens/{root}", "root-token")[0] == 204  # another admin exists now
    assert own_front("GET", "/v1/me", "root-token")[0] == 401
    status, refused = own_front("DELETE", f"/v1/tokens/{ops['id']}", ops["token"])
    assert (status, refused["error"]["code"]) == (409, "last_admin")
    assert [t["id"] for t in own_front("GET", "/v1/tokens", ops["token"])[1]["tokens"]] == [ops["id"]]


def test_only_an_admin_token_that_lasts_counts_as_one_that_remains(local_stack):
    """The last-admin check at service level, with a clock the test moves: an admin token that
    expires within a day is no administrator that remains (the stack would lock its administrators
    out when it expires), one that lasts longer is; an expired admin token may always go."""
    now = [1_800_000_000.0]
    ports = make_ports(local_stack, clock=lambda: now[0])
    root = tenancy.create_token(ports, user="root", scopes=["admin"], created_by="test").token
    brief = tenancy.create_token(ports, user="ops", scopes=["admin"], expires_in="1h", created_by="test").token
    reader = tenancy.create_token(ports, user="ops", scopes=["runs:read"], created_by="test").token
    tenancy.revoke_token(ports, reader.id)  # a token that is not an admin's never counts
    with pytest.raises(LastAdmin, match=r"valid for more than a day.*make another admin token first"):
        tenancy.revoke_token(ports, root.id)  # brief is an admin's for an hour more only
    week = tenancy.create_token(ports, user="ops", scopes=["admin"], expires_in="7d", created_by="test").token
    now[0] += 3600  # brief has expired
    tenancy.revoke_token(ports, root.id)  # week lasts
    with pytest.raises(LastAdmin):
        tenancy.revoke_token(ports, week.id)
    tenancy.revoke_token(ports, brief.id)  # an expired admin token may always go
    now[0] += 6 * 86_400 + 1  # week has less than a day left
    root = tenancy.create_token(ports, user="root", scopes=["admin"], created_by="test").token
    tenancy.revoke_token(ports, week.id)  # a short-lived one may go while a lasting one remains
    with pytest.raises(LastAdmin):
        tenancy.revoke_token(ports, root.id)
    assert [t.id for t in tenancy.list_tokens(ports)] == [root.id]
    with pytest.raises(NotFound):
        tenancy.revoke_token(ports, brief.id)


def test_a_token_stops_working_when_it_expires(front, user):
    admin = user("admin")
    lasting = admin.request("POST", "/v1/tokens", {"user": "temp", "expires_in": "1h"})
    assert lasting["expires_at"]
    assert Client(front.api_url, lasting["token"]).request("GET", "/v1/me")["user"] == "temp"  # until it expires
    made = admin.request("POST", "/v1/tokens", {"user": "temp", "expires_in": 1})
    temp = Client(front.api_url, made["token"])
    expires_at = datetime.fromisoformat(made["expires_at"]).timestamp() + 0.001  # shown to the millisecond
    wait_for(lambda: time.time() > expires_at, 30, 0.05, "the token's expiry")
    status, code, message = api_status(lambda: temp.request("GET", "/v1/me"))
    assert (status, code) == (401, "unauthorized") and "expired" in message


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"user": "bad user"}, "user: String should match pattern"),
        ({"user": "x", "groups": ["Not A Group"]}, "groups.0: String should match pattern"),
        ({"user": "x", "scopes": ["root"]}, "scopes.0: Input should be 'runs:read', 'runs:write' or 'admin'"),
        ({"user": "x", "scopes": []}, "scopes: List should have at least 1 item"),
        ({"user": "x", "expires_in": "forever"}, "cannot read duration 'forever'"),
        ({"user": "x", "expires_in": 0}, "expires_in"),
        ({"user": "x", "expires_in": "100000d"}, "cannot exceed"),
        ({"user": "x", "token": "mine"}, "token: Extra inputs are not permitted"),
    ],
)
def test_bad_token_requests_are_422(user, body, fragment):
    admin = user("admin")
    before = len(admin.request("GET", "/v1/tokens")["tokens"])
    status, code, message = api_status(lambda: admin.request("POST", "/v1/tokens", body))
    assert (status, code) == (422, "invalid_request")
    assert fragment in message
    assert len(admin.request("GET", "/v1/tokens")["tokens"]) == before


@pytest.mark.parametrize("who", ["alice", "reader", "writer", "empty"])
def test_only_admins_touch_tokens(front, user, who):
    admin = user("admin")
    victim = admin.request("POST", "/v1/tokens", {"user": "victim"})
    before = [t["id"] for t in admin.request("GET", "/v1/tokens")["tokens"]]
    mallory = user(who)
    for method, path, body in [
        ("POST", "/v1/tokens", {"user": who, "scopes": ["admin"]}),
        ("GET", "/v1/tokens", None),
        ("DELETE", f"/v1/tokens/{victim['id']}", None),
    ]:
        status, code, message = api_status(lambda: mallory.request(method, path, body))  # noqa: B023
        assert (status, code) == (403, "forbidden"), (method, path)
        assert "'admin'" in message
    assert Client(front.api_url, victim["token"]).request("GET", "/v1/me")["user"] == "victim"
    assert [t["id"] for t in admin.request("GET", "/v1/tokens")["tokens"]] == before  # none made, none revoked


def test_a_revoked_token_is_refused_by_every_api_instance_after_the_cache_ttl(devstack):
    """A second API instance (its own token cache, the same store) that has just let the token in
    keeps it for at most the cache's TTL after the first instance revoked it, then refuses it. The
    cache's clock is injected, so a stalled machine cannot change the outcome."""
    from runplane.domain.errors import Unauthorized
    from runplane.services.auth import CACHE_SECONDS, CachedTokens, authenticate

    admin = Client(devstack.api_url, "admin-token")
    made = admin.request("POST", "/v1/tokens", {"user": "leaver"})
    other = _stack_of(devstack)
    assert isinstance(other.tokens, CachedTokens)
    now = [1000.0]
    other.tokens.clock = lambda: now[0]
    header = f"Bearer {made['token']}"
    assert authenticate(other.tokens, header, now=time.time()).user == "leaver"  # now in that instance's cache
    admin.request("DELETE", f"/v1/tokens/{made['id']}")
    # what README and docs/security.md promise is this very TTL
    root = Path(__file__).resolve().parents[2]
    promised = f"within {CACHE_SECONDS:g} s"
    assert promised in (root / "README.md").read_text()
    assert promised in (root / "docs" / "security.md").read_text()
    now[0] += CACHE_SECONDS - 0.5
    assert authenticate(other.tokens, header, now=time.time()).user == "leaver"  # still inside the TTL: cached
    now[0] += 0.5
    with pytest.raises(Unauthorized, match="token is not valid"):
        authenticate(other.tokens, header, now=time.time())
    now[0] -= CACHE_SECONDS  # a refusal is never cached as a hit: the token stays refused
    with pytest.raises(Unauthorized, match="token is not valid"):
        authenticate(other.tokens, header, now=time.time())


def test_the_cli_makes_the_first_admin_token_with_cloud_credentials(aws_devstack, tmp_path):
    """A deployed stack has no token yet: the operator writes one to the token store with their
    cloud credentials and the stack's settings (here: moto's server and the AWS local stack's prefix)."""
    devstack = aws_devstack
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RUNPLANE_")},
        "HOME": str(tmp_path),
        "RUNPLANE_AWS_ENDPOINT_URL": devstack.config.aws_endpoint_url,
        "RUNPLANE_PREFIX": devstack.config.prefix,
        "RUNPLANE_POOLS": devstack.config.pools_file,
    }
    cmd = [sys.executable, "-m", "runplane.cli", "token", "create", "ops", "--scope", "admin", "--direct"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    secret = done.stdout.strip()
    assert "shown only now" in done.stderr
    me = Client(devstack.api_url, secret).request("GET", "/v1/me")
    assert (me["user"], me["scopes"]) == ("ops", ["admin"])
    bad = subprocess.run(
        [*cmd[:-1], "--direct"],
        env={**env, "RUNPLANE_INPUT_BUCKETS": "{nope"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and len(bad.stderr.strip().splitlines()) == 1


def _runplane(*args, home, env=None, prefix=()):
    """``runplane ARGS`` as a process with none of this process's RUNPLANE_* settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RUNPLANE_")}
    cmd = [*prefix, str(Path(sys.executable).with_name("runplane")), *args]
    return subprocess.run(cmd, env={**clean, "HOME": str(home), **(env or {})}, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def _one_error_line(done, code):
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr.strip()


def test_the_operator_of_one_machine_gets_back_in_with_local_access_alone(tmp_path):
    """``runplane token create --state-dir DIR`` writes an admin token into the database of the
    stack on this machine with no token and no API, and that stack's API takes it at once; through
    it the operator revokes the old admin token, and the CLI refuses, in one line, to revoke the
    last one."""
    port = free_port()
    dev = DevStackProcess(
        DevConfig(port=port, token="first-admin", user="admin", pools_file=str(POOLS_FILE), state_dir=tmp_path / "dev",
                  write_dev_file=False),
        tmp_path / "dev.log",
    )  # fmt: skip
    dev.start(timeout=120)
    try:
        made = _runplane(
            "token", "create", "ops", "--scope", "admin", "--state-dir", str(tmp_path / "dev" / str(port)), "--json",
            home=tmp_path,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        ops = json.loads(made.stdout)
        assert (ops["user"], ops["scopes"]) == ("ops", ["admin"])
        assert "(runplane token create --direct)" in ops["created_by"]
        as_ops = {"RUNPLANE_API_URL": dev.api_url, "RUNPLANE_TOKEN": ops["token"]}
        me = json.loads(_runplane("whoami", "--json", home=tmp_path, env=as_ops).stdout)
        assert (me["user"], me["scopes"], me["token_id"]) == ("ops", ["admin"], ops["id"])
        first = Client(dev.api_url, "first-admin").me().token_id
        assert _runplane("token", "revoke", first, home=tmp_path, env=as_ops).returncode == 0
        refused = _one_error_line(_runplane("token", "revoke", ops["id"], home=tmp_path, env=as_ops), 3)
        assert f"{ops['id']} is the last admin token" in refused and "make another admin token first" in refused
        assert Client(dev.api_url, ops["token"]).me().user == "ops"
    finally:
        dev.stop()


def test_a_token_is_written_only_into_a_stacks_database_that_this_user_may_write(tmp_path, local_stack):
    """``--state-dir`` of no stack is one line and creates nothing: a directory that does not exist,
    one with no database, a file that is no runplane database, a file in place of the directory.
    A stack's directory this user cannot read and write (another user's, 0700) is one line that says
    who can."""
    missing, empty, foreign, plain = (tmp_path / name for name in ("missing", "empty", "foreign", "plain"))
    empty.mkdir()
    foreign.mkdir()
    (foreign / "state.db").write_bytes(b"not a database")
    plain.write_text("")
    for state_dir, why in [
        (missing, "does not exist"),
        (empty, "holds no runplane database (state.db)"),
        (foreign, "is not a runplane stack's database"),
        (plain, "is not a directory"),
    ]:
        before = sorted(p.name for p in tmp_path.rglob("*"))
        line = _one_error_line(_runplane("token", "create", "ops", "--state-dir", str(state_dir), home=tmp_path), 2)
        assert f"{state_dir}" in line and why in line and "runplane serve's --state-dir" in line
        assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing created
    state = Path(local_stack.settings.state_dir)
    if os.geteuid() == 0:  # root reads anything: another user's directory, read by root without that power
        for path in [state, *state.rglob("*")]:
            os.chown(path, 65534, 65534)
        prefix = [
            "setpriv",
            "--inh-caps=-dac_override,-dac_read_search",
            "--bounding-set=-dac_override,-dac_read_search",
        ]
    else:
        state.chmod(0)
        prefix = []
    try:
        denied = _runplane("token", "create", "ops", "--state-dir", str(state), home=tmp_path, prefix=prefix)
        line = _one_error_line(denied, 2)
        assert f"cannot read and write {state}: run as the service's user or root" in line
    finally:
        state.chmod(0o700)
    assert local_stack.tokens.list() == []


def test_init_makes_the_database_of_a_first_install(tmp_path):
    """``--init``: an install makes its first admin token before the service first starts, into a
    database made then (0700); ``--init`` names a state directory or is refused."""
    assert "give its --state-dir" in _one_error_line(_runplane("token", "create", "ops", "--init", home=tmp_path), 2)
    state = tmp_path / "var" / "runplane"
    made = _runplane(
        "token", "create", "ops", "--scope", "admin", "--state-dir", str(state), "--init", "--json", home=tmp_path
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert state.stat().st_mode & 0o777 == 0o700
    settings = StackSettings(
        cloud="local", state_dir=str(state), public_url="http://127.0.0.1:9", pools=str(POOLS_FILE)
    )
    assert [t.id for t in build_stack(settings).tokens.list()] == [json.loads(made.stdout)["id"]]


# ---- scopes fail closed --------------------------------------------------------------------


def test_a_token_with_no_scopes_can_do_nothing(front, user):
    victim = user("alice").request("POST", "/v1/runs", PARKED)
    empty = user("empty")
    assert empty.request("GET", "/v1/me") == {
        "user": "eve",
        "groups": [],
        "scopes": [],
        "token_id": empty.request("GET", "/v1/me")["token_id"],
        "default_group": None,
    }
    for method, path in [
        ("POST", "/v1/runs"),
        ("GET", "/v1/runs"),
        ("GET", f"/v1/runs/{victim['id']}"),
        ("POST", f"/v1/runs/{victim['id']}/kill"),
        ("GET", f"/v1/runs/{victim['id']}/logs"),
        ("GET", f"/v1/runs/{victim['id']}/outputs"),
        ("GET", "/v1/pools"),
        ("GET", "/v1/workers"),
    ]:
        status, code, _ = api_status(lambda: empty.request(method, path, PARKED if method == "POST" else None))  # noqa: B023
        assert (status, code) == (403, "forbidden"), (method, path)


def test_reading_needs_runs_read_and_writing_runs_write(user):
    writer, reader = user("writer"), user("reader")
    run = writer.request("POST", "/v1/runs", PARKED)  # runs:write alone may submit...
    for path in (f"/v1/runs/{run['id']}", "/v1/runs", f"/v1/runs/{run['id']}/logs", "/v1/pools", "/v1/workers"):
        status, _, message = api_status(lambda: writer.request("GET", path))  # noqa: B023
        assert status == 403 and "runs:read" in message, path  # ...but not read
    assert reader.request("GET", f"/v1/runs/{run['id']}")["id"] == run["id"]
    assert api_status(lambda: reader.request("POST", f"/v1/runs/{run['id']}/kill"))[0] == 403
    assert api_status(lambda: reader.request("POST", "/v1/runs", PARKED))[0] == 403
    assert reader.request("GET", f"/v1/runs/{run['id']}")["state"] == "queued"


# ---- tenant isolation ----------------------------------------------------------------------


def test_another_users_run_looks_exactly_like_a_missing_one(front, user):
    alices = user("alice").request("POST", "/v1/runs", PARKED)
    missing = "r-" + uuid.uuid4().hex[:24]
    for method, suffix in [("GET", ""), ("POST", "/kill"), ("GET", "/logs"), ("GET", "/outputs")]:
        theirs = raw(front, method, f"/v1/runs/{alices['id']}{suffix}", headers=bearer("bob"))
        absent = raw(front, method, f"/v1/runs/{missing}{suffix}", headers=bearer("bob"))
        assert theirs[0] == absent[0] == 404, (method, suffix)
        assert json.dumps(theirs[2]).replace(alices["id"], "ID") == json.dumps(absent[2]).replace(missing, "ID")
    as_input = {**PARKED, "inputs": {"m": f"run:{alices['id']}"}}
    theirs = raw(front, "POST", "/v1/runs", json.dumps(as_input).encode(), bearer("bob"))
    absent = raw(
        front, "POST", "/v1/runs", json.dumps({**as_input, "inputs": {"m": f"run:{missing}"}}).encode(), bearer("bob")
    )
    assert theirs[0] == absent[0] == 404
    assert json.dumps(theirs[2]).replace(alices["id"], "ID") == json.dumps(absent[2]).replace(missing, "ID")
    assert user("alice").request("GET", f"/v1/runs/{alices['id']}")["state"] == "queued"  # untouched


def test_admins_see_everyones_runs_and_users_only_their_own(user):
    bobs = user("bob").request("POST", "/v1/runs", PARKED)
    assert user("admin").request("GET", f"/v1/runs/{bobs['id']}")["owner"] == "bob"
    listed = user("admin").request("GET", "/v1/runs", query={"owner": "bob", "limit": 500})["runs"]
    assert bobs["id"] in [r["id"] for r in listed]
    status, code, _ = api_status(lambda: user("alice").request("GET", "/v1/runs", query={"owner": "bob"}))
    assert (status, code) == (403, "forbidden")
    assert bobs["id"] not in json.dumps(user("alice").request("GET", "/v1/runs", query={"limit": 500}))


@pytest.mark.docker
def test_workers_show_only_the_callers_run_ids(front, user, docker_client):
    run = user("alice").request("POST", "/v1/runs", {"command": "sleep 600", "queue": "default"})  # killed below
    wait_state(user("alice"), run["id"], {"running"}, timeout=90)

    def holding(client):
        return [w for w in client.request("GET", "/v1/workers")["workers"] if run["id"] in w["runs"]]

    wait_for(lambda: holding(user("alice")), 30, 0.2, "the worker to report the run")
    assert run["id"] in json.dumps(user("admin").request("GET", "/v1/workers"))
    bobs_view = json.dumps(user("bob").request("GET", "/v1/workers"))
    assert run["id"] not in bobs_view
    assert holding(user("alice"))[0]["run_owners"] == {run["id"]: "alice"}
    user("alice").request("POST", f"/v1/runs/{run['id']}/kill")
    wait_state(user("alice"), run["id"], TERMINAL, timeout=60)


def test_workers_come_a_page_at_a_time_and_bad_paging_is_refused(front, user):
    """Five workers of a pool of their own, two a page: every worker once, alice sees her run ids
    only on every page; a bad pool, cursor or limit is a 4xx with a message."""
    from runplane.domain.workers import Worker

    pool, now = f"pg-{uuid.uuid4().hex[:8]}", time.time()
    workers = _stack_of(front).workers
    for i in range(5):
        owner = ("alice", "bob")[i % 2]
        held = f"r-{pool}-{i}"
        workers.put(
            Worker(
                id=f"w-{pool}-{i}", pool=pool, started_at=now, heartbeat_at=now, runs=[held], run_owners={held: owner}
            )
        )
    seen, cursor, pages = [], None, 0
    while True:
        page = user("alice").request("GET", "/v1/workers", query={"pool": pool, "limit": 2, "cursor": cursor})
        pages += 1
        assert len(page["workers"]) <= 2 and {w["pool"] for w in page["workers"]} <= {pool}
        for w in page["workers"]:
            assert set(w["run_owners"].values()) <= {"alice"} and all(r in w["run_owners"] for r in w["runs"])
        seen += [w["id"] for w in page["workers"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == [f"w-{pool}-{i}" for i in range(5)] and pages == 3
    for query, status, needle in (
        ({"pool": "../etc"}, 422, "pool must be a pool name"),
        ({"pool": "A" * 300}, 422, "pool must be a pool name"),
        ({"cursor": "not a cursor!"}, 400, "cursor must be the next_cursor"),
        ({"cursor": "AA"}, 400, "cursor must be the next_cursor"),  # decodes to a NUL byte
        ({"cursor": "x" * 400}, 400, "cursor must be the next_cursor"),
        ({"limit": 0}, 422, "limit must be between 1 and 500"),
        ({"limit": "ten"}, 400, "limit must be an integer"),
    ):
        got = api_status(lambda q=query: user("alice").request("GET", "/v1/workers", query=q))
        assert (got[0], needle in got[2]) == (status, True), (query, got)
    for i in range(5):
        workers.delete(f"w-{pool}-{i}")


def test_run_ids_cannot_be_computed_from_an_idempotency_key(devstack, azure_devstack):
    """The same user and key give different ids on two stacks (each keys the derivation with its own
    secret), and neither is the plain hash anyone could compute."""
    key = f"train-{uuid.uuid4().hex[:6]}"
    ids = [
        Client(s.api_url, "alice-token").request("POST", "/v1/runs", PARKED, headers={"Idempotency-Key": key})["id"]
        for s in (devstack, azure_devstack)
    ]
    assert ids[0] != ids[1]
    guessable = "r-" + hashlib.sha256(f"alice\0{key}".encode()).hexdigest()[:24]
    assert guessable not in ids
    again = Client(devstack.api_url, "alice-token").request(
        "POST", "/v1/runs", PARKED, headers={"Idempotency-Key": key}
    )
    assert again["id"] == ids[0]  # still idempotent


# ---- inputs from buckets -------------------------------------------------------------------


def test_inputs_may_not_name_the_stacks_own_bucket(front, user):
    own = own_bucket(front)
    for source in (f"s3://{own}/runs/", f"s3://{own}/runs/r-0/outputs/1/secret.txt"):
        status, code, message = api_status(
            lambda: user("alice").request("POST", "/v1/runs", {**PARKED, "inputs": {"all": source}})  # noqa: B023
        )
        assert (status, code) == (422, "not_allowed")
        assert "the stack's own bucket cannot be an input" in message


@pytest.mark.parametrize(
    ("who", "source", "refused", "fragment"),
    [
        ("alice", "s3://someone-elses-bucket/data.csv", "not_allowed", "is not one the operator allows"),
        ("alice", f"s3://{VISION_DATA}/images/", "not_allowed", "is not one the operator allows"),  # vision's
        ("alice", f"s3://{DATASETS}/", "invalid_request", "source must be 's3://bucket/key'"),  # the whole bucket
        ("alice", f"s3://{DATASETS}/a/../b", "invalid_request", "may not hold '.', '..'"),
        ("alice", "run:r-x/../../r-y/outputs", "invalid_request", "may not hold '.', '..'"),
    ],
)
def test_inputs_outside_the_operators_allow_list_are_422(user, who, source, refused, fragment):
    """A bucket the operator does not allow is a policy refusal (not_allowed); a source of the wrong
    form, a refusal for the request's shape (invalid_request)."""
    status, code, message = api_status(
        lambda: user(who).request("POST", "/v1/runs", {**PARKED, "inputs": {"data": source}})
    )
    assert (status, code) == (422, refused)
    assert fragment in message


def test_allowed_inputs_are_accepted_per_group(user):
    assert user("alice").request("POST", "/v1/runs", {**PARKED, "inputs": {"d": f"s3://{DATASETS}/x.csv"}})
    carols = user("carol").request("POST", "/v1/runs", {**PARKED, "inputs": {"d": f"s3://{VISION_DATA}/img/"}})
    assert carols["spec"]["inputs"] == {"d": f"s3://{VISION_DATA}/img/"}


@pytest.mark.docker
def test_the_worker_refuses_a_stored_run_that_names_the_stacks_bucket(devstack, alice, docker_client):
    """A run that reached the store without the API's check (an older API, a hand-written record)
    still cannot read other users' outputs: the agent checks again and fails it."""
    from runplane import bootstrap
    from runplane.domain.messages import RunMessage
    from runplane.domain.runs import Run, RunSpec

    stack = bootstrap.stack()
    stack.objects.put_bytes("runs/r-victim/outputs/1/secret.txt", b"private")
    spec = RunSpec(
        command="cat /inputs/all/*",
        image="runplane/test-busybox:1",
        queue="default",
        inputs={"all": f"s3://{stack.data_bucket}/runs/r-victim/outputs/1/"},
    )
    spec = spec.model_copy(update={"resources": stack.pools.get("default").with_defaults(spec.resources)})
    run = stack.store.create(
        Run(id="r-" + uuid.uuid4().hex[:24], owner="alice", spec=spec, queue="default", created_at=time.time())
    )
    stack.queue.send("default", RunMessage(run_id=run.id, attempt=0))
    done = wait_state(alice, run.id, TERMINAL, timeout=90)
    assert (done["state"], done["failure"]["reason"]) == ("failed", "input_unavailable")
    assert "the stack's own bucket cannot be an input" in done["failure"]["message"]
    assert "private" not in alice.request("GET", f"/v1/runs/{run.id}/logs")["data"]
