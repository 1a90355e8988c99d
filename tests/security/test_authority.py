"""Authority is checked when it is used, not when a run or a sweep was made. A user removed from a
group cannot retry or widen a sweep charged to it, nor move a queued run of it, nor retry members
that read a bucket only that group may read; and what is released later with no caller in the
request (a waiting run whose upstream succeeded, a sweep member as room frees) is checked against
the owner's tokens as the token store holds them then: what they no longer allow ends
``not_permitted``, never runs charged to a group its owner left. Runs already out are not touched.

Through the real API and dispatcher on both clouds' local stacks (``front``), and the dispatcher's
own handling of an upstream's end on both clouds' stores. Every test makes users and groups of its
own."""

import time
import uuid

import pytest

from runplane.client import Client
from runplane.domain.errors import InvalidRequest
from runplane.domain.runs import RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.domain.sweeps import SweepSpec
from runplane.domain.tenancy import Principal
from runplane.handlers import PoolDispatcher
from runplane.services import lifecycle, sweeps
from runplane.services.auth import authenticate, register_token
from runplane.services.authority import Owners
from runplane.services.runs import submit_run
from runplane.services.tenancy import set_default_group
from tests.conftest import VISION_DATA, api_status, wait_for

PARKED = {"command": "echo hi", "queue": "parked"}


def fresh(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def tokens(front, user):
    """``tokens(name, groups)``: a new token of user ``name`` with those groups, as (client, its id)."""
    admin = user("admin")

    def make(name, groups):
        made = admin.request("POST", "/v1/tokens", {"user": name, "groups": list(groups)})
        return Client(front.api_url, made["token"]), made["id"]

    return make


def removed(user, tokens, name, token_id, groups):
    """``name`` taken out of a group: the token that carried it revoked, one of ``groups`` made."""
    user("admin").request("DELETE", f"/v1/tokens/{token_id}")
    return tokens(name, groups)[0]


def test_a_user_removed_from_a_group_cannot_retry_widen_or_move_what_is_charged_to_it(user, tokens):
    group, other, name = fresh("g"), fresh("g"), fresh("u")
    owner, token_id = tokens(name, [group])
    made = owner.request("POST", "/v1/sweeps", {"run": PARKED, "count": 2, "max_parallel": 1})
    queued = owner.request("POST", "/v1/runs", PARKED)
    (member,) = owner.request("GET", f"/v1/runs?sweep={made['id']}")["runs"]
    assert member["group"] == queued["group"] == group
    owner.request("POST", f"/v1/sweeps/{made['id']}/kill")

    moved = removed(user, tokens, name, token_id, [other])
    for method, path, body in (
        ("POST", f"/v1/sweeps/{made['id']}/retry", None),
        ("PATCH", f"/v1/sweeps/{made['id']}", {"max_parallel": 2}),
        ("POST", f"/v1/runs/{queued['id']}/priority", {"priority": 60}),
    ):
        status, code, message = api_status(lambda m=method, p=path, b=body: moved.request(m, p, b))
        assert (status, code) == (403, "forbidden"), (path, status, message)
        assert f"{name} is no longer in group {group}" in message, message
    # an administrator retrying it for them is held to the owner's groups now, not the admin's
    status, code, message = api_status(lambda: user("admin").request("POST", f"/v1/sweeps/{made['id']}/retry"))
    assert (status, code) == (403, "forbidden") and f"{name} is no longer in group {group}" in message, message
    sweep = moved.request("GET", f"/v1/sweeps/{made['id']}")
    assert (sweep["counts"], sweep["waiting"], sweep["max_parallel"]) == ({"killed": 2}, 0, 1)
    assert moved.request("GET", f"/v1/runs?sweep={made['id']}&state=queued")["runs"] == []
    assert moved.request("GET", f"/v1/runs/{queued['id']}")["spec"]["priority"] == queued["spec"]["priority"]
    moved.request("POST", f"/v1/runs/{queued['id']}/kill")  # a kill is never refused

    back, _ = tokens(name, [group])  # back in the group: the same requests go through
    again = back.request("POST", f"/v1/sweeps/{made['id']}/retry")
    assert (again["retried"], again["group"]) == (2, group)
    back.request("POST", f"/v1/sweeps/{made['id']}/kill")


def test_retrying_members_that_read_a_group_only_bucket_needs_the_group_still(user, tokens):
    """A sweep charged to the user's own group reads a bucket the operator allows only to vision:
    once the user is out of vision, its members are not released again."""
    mine, name = fresh("g"), fresh("u")
    owner, token_id = tokens(name, ["vision", mine])
    template = {**PARKED, "group": mine, "inputs": {"data": f"s3://{VISION_DATA}/set/"}}
    made = owner.request("POST", "/v1/sweeps", {"run": template, "count": 1})
    owner.request("POST", f"/v1/sweeps/{made['id']}/kill")

    moved = removed(user, tokens, name, token_id, [mine])
    status, code, message = api_status(lambda: moved.request("POST", f"/v1/sweeps/{made['id']}/retry"))
    assert (status, code) == (403, "forbidden") and f"bucket {VISION_DATA}" in message, message
    assert moved.request("GET", f"/v1/sweeps/{made['id']}")["counts"] == {"killed": 1}


def test_a_member_released_after_its_owner_left_the_group_ends_not_permitted(user, tokens):
    """Nobody asks for the release: the dispatcher makes it when a member ends and room frees."""
    group, other, name = fresh("g"), fresh("g"), fresh("u")
    owner, token_id = tokens(name, [group])
    made = owner.request("POST", "/v1/sweeps", {"run": PARKED, "count": 2, "max_parallel": 1})
    (first,) = owner.request("GET", f"/v1/runs?sweep={made['id']}")["runs"]
    assert first["state"] == "queued" and first["group"] == group  # out before: not touched

    moved = removed(user, tokens, name, token_id, [other])
    moved.request("POST", f"/v1/runs/{first['id']}/kill")  # room frees: the next member is released

    def finished():
        sweep = moved.request("GET", f"/v1/sweeps/{made['id']}")
        return sweep if sweep["finished_at"] else None

    sweep = wait_for(finished, 60, 0.2, "the sweep to finish")
    assert sweep["failures"] == {"killed": 1, "not_permitted": 1}
    second = next(r for r in moved.request("GET", f"/v1/runs?sweep={made['id']}")["runs"] if r["id"] != first["id"])
    assert (second["state"], second["failure"]["reason"], second["worker_id"]) == ("failed", "not_permitted", None)
    assert f"{name} is no longer in group {group}" in second["failure"]["message"]


@pytest.fixture(params=["aws_stack", "azure_stack"])
def stack(request):
    return request.getfixturevalue(request.param)


def end_well(stack, run):
    """What a worker does with a run that succeeds; the end tells the dispatcher."""
    held = lifecycle.claim(stack.store, run, run.attempt, "w1", 60.0, time.time())
    held = lifecycle.advance(stack.store, held, RunState.RUNNING, time.time(), "started")
    held = lifecycle.advance(stack.store, held, RunState.UPLOADING, time.time(), "uploading", exit_code=0)
    return lifecycle.advance(stack.store, held, RunState.SUCCEEDED, time.time(), "done")


def test_a_waiting_run_released_after_its_owner_left_the_group_is_not_run_charged_to_it(stack):
    group, other = fresh("g"), fresh("g")
    register_token(stack.tokens, "leaver-1", "leaver", groups=[group], now=time.time())
    register_token(stack.tokens, "stayer-1", "stayer", groups=[group], now=time.time())
    now = time.time()
    leaver = authenticate(stack.tokens, "Bearer leaver-1", now=now)
    stayer = authenticate(stack.tokens, "Bearer stayer-1", now=now)

    def submit(who, **spec):
        spec = RunSpec.model_validate({**PARKED, **spec})
        return submit_run(stack.ports, who, spec, None).run

    upstream, other_upstream = submit(leaver), submit(stayer)
    waiting = submit(leaver, after=[upstream.id])
    control = submit(stayer, after=[other_upstream.id])
    assert waiting.group == control.group == group and waiting.waiting_on == [upstream.id]

    (held,) = [t for t in stack.tokens.list() if t.user == "leaver"]
    stack.tokens.delete(held.id)  # leaver leaves the group
    register_token(stack.tokens, "leaver-2", "leaver", groups=[other], now=time.time())
    dispatcher = PoolDispatcher(stack.ports)
    for done in (end_well(stack, stack.store.get(upstream.id)), end_well(stack, stack.store.get(other_upstream.id))):
        dispatcher.upstream(done.id)

    refused = stack.store.get(waiting.id)
    assert (refused.state, refused.worker_id) == (RunState.FAILED, None)
    assert refused.failure is not None and refused.failure.reason == FailureReason.NOT_PERMITTED
    assert f"leaver is no longer in group {group}" in refused.failure.message
    released = stack.store.get(control.id)  # its owner is still in the group: released as ever
    assert (released.state, released.waiting_on, released.owner_groups) == (RunState.QUEUED, [], [group])
    assert {d.message.run_id for d in stack.queue.receive("parked", 10, 1, 30)} >= {control.id}


def swap_token(stack, name, groups):
    """``name``'s groups changed: every token of theirs revoked, one of ``groups`` made; returns it."""
    for held in [t for t in stack.tokens.list() if t.user == name]:
        stack.tokens.delete(held.id)
    secret = f"{name}-{uuid.uuid4().hex[:6]}"
    register_token(stack.tokens, secret, name, groups=list(groups), now=time.time())
    return authenticate(stack.tokens, f"Bearer {secret}", now=time.time())


def test_a_replayed_submit_releases_a_waiting_run_only_as_the_callers_token_allows_now(stack):
    """A submit retried with its Idempotency-Key after its upstream succeeded, before the
    dispatcher heard of it, finishes the release: with the caller's token as it is now."""
    group, other = fresh("g"), fresh("g")
    leaver, stayer = fresh("u"), fresh("u")

    def submit(who, key=None, **spec):
        spec = RunSpec.model_validate({**PARKED, **spec})
        return submit_run(stack.ports, who, spec, key)

    made = {name: swap_token(stack, name, [group]) for name in (leaver, stayer)}
    ups = {name: submit(made[name]).run for name in made}
    firsts = {name: submit(made[name], "same-key", after=[ups[name].id]) for name in made}
    assert all(f.created and f.run.waiting_on == [ups[f.run.owner].id] for f in firsts.values())
    now = {leaver: swap_token(stack, leaver, [other]), stayer: swap_token(stack, stayer, [group, other])}
    for name in made:
        end_well(stack, stack.store.get(ups[name].id))  # the dispatcher has not heard of it yet

    again = {name: submit(now[name], "same-key", after=[ups[name].id]) for name in made}
    assert [(a.created, a.run.id) for a in again.values()] == [(False, f.run.id) for f in firsts.values()]
    kept = stack.store.get(firsts[leaver].run.id)  # out of the group: left for the dispatcher
    assert (kept.state, kept.waiting_on, kept.owner_groups) == (RunState.QUEUED, [ups[leaver].id], [group])
    released = stack.store.get(firsts[stayer].run.id)  # still in it: released with its groups now
    assert (released.state, released.waiting_on, released.group) == (RunState.QUEUED, [], group)
    assert released.owner_groups == sorted([group, other])
    hinted = {d.message.run_id for d in stack.queue.receive("parked", 10, 1, 30)}
    assert released.id in hinted and kept.id not in hinted

    PoolDispatcher(stack.ports).upstream(ups[leaver].id)
    refused = stack.store.get(kept.id)
    assert (refused.state, refused.worker_id) == (RunState.FAILED, None)
    assert refused.failure is not None and refused.failure.reason == FailureReason.NOT_PERMITTED
    assert f"{leaver} is no longer in group {group}" in refused.failure.message


def test_what_an_older_release_stored_charged_to_no_group_is_charged_as_a_submit_is_now(stack):
    """A run or a sweep stored charged to no group (as a release that charged a user in several
    groups to none did) is not released uncharged once its owner is in several groups: the
    dispatcher ends a waiting run ``not_permitted`` saying to name a group; a retry is refused
    with 422 naming the groups, and is charged to the default group once one is set."""
    one, two, name = fresh("g"), fresh("g"), fresh("u")
    alone = Principal(user=name)  # in no group: what it makes is charged to none

    upstream = submit_run(stack.ports, alone, RunSpec.model_validate(PARKED), None).run
    waiting = submit_run(stack.ports, alone, RunSpec.model_validate({**PARKED, "after": [upstream.id]}), None).run
    ports = stack.ports
    sweep = sweeps.create_sweep(ports, alone, SweepSpec.model_validate({"run": PARKED, "count": 1}), None).sweep
    sweeps.kill_sweep(ports, alone, sweep.id)
    assert waiting.group is None and sweep.group is None

    both = swap_token(stack, name, [one, two])
    PoolDispatcher(stack.ports).upstream(end_well(stack, stack.store.get(upstream.id)).id)
    refused = stack.store.get(waiting.id)
    assert refused.failure is not None and refused.failure.reason == FailureReason.NOT_PERMITTED
    assert f"in several groups ({', '.join(sorted([one, two]))})" in refused.failure.message
    assert "naming the group" in refused.failure.message

    with pytest.raises(InvalidRequest, match=rf"several groups \({', '.join(sorted([one, two]))}\)"):
        sweeps.retry_sweep(ports, both, sweep.id)
    assert ports.sweeps.get(sweep.id).group is None
    set_default_group(stack.ports, name, two, by="admin")
    _, retried = sweeps.retry_sweep(ports, swap_token(stack, name, [one, two]), sweep.id)
    (member,) = stack.store.list(owner=name, state=RunState.QUEUED, queue="parked", limit=10).runs
    assert (retried, ports.sweeps.get(sweep.id).group, member.group) == (1, two, two)


def test_a_refusal_reads_the_tokens_table_consistently(aws_stack):
    """What ``Owners.allows`` refuses on is a read that sees every token written before it: the
    DynamoDB scan behind it asks for a consistent read (Table storage's reads always are)."""
    client, asked = aws_stack.tokens.inner.client, []

    def note(params, **_):
        asked.append(dict(params))

    client.meta.events.register("provide-client-params.dynamodb.Scan", note)
    try:
        register_token(aws_stack.tokens, "someone-1", "someone", groups=["g"], now=time.time())
        owners = Owners(aws_stack.tokens, time.time)
        _, why = owners.allows("someone", RunSpec.model_validate(PARKED), "h", None)
        aws_stack.tokens.delete(aws_stack.tokens.list()[0].id)
    finally:
        client.meta.events.unregister("provide-client-params.dynamodb.Scan", note)
    assert why is not None and len(asked) >= 3  # the view refused on, a listing, a revoke
    assert all(params.get("ConsistentRead") is True for params in asked), asked
