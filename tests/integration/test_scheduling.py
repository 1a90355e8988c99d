"""Fair tags at submit (runplane/services/scheduling.py), on the real stores: a user's runs take
tags one after another from the pool's line, a newcomer's first run takes the line's own, a lead
halves every half-life, and submits of one user at once never share a tag. Racing submits run on
dynalite and Azurite (see ``racing_stack``)."""

import calendar
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from runplane.domain.models import Principal, RunSpec, RunState
from runplane.services import lifecycle
from runplane.services.runs import submit_run
from runplane.services.scheduling import fair_tag

IMPLEMENTATIONS = ["aws-moto", "azure-azurite"]
_STACKS = {"aws-moto": "aws_stack", "azure-azurite": "azure_stack"}
RACING_IMPLEMENTATIONS = ["aws-dynalite", "azure-azurite"]
_RACING_STACKS = {"aws-dynalite": "aws_dynalite_stack", "azure-azurite": "azure_stack"}

NOW = float(calendar.timegm((2026, 11, 30, 12, 0, 0)))
HALF_LIFE = 3600.0  # the pools' default fair_share_half_life


@pytest.fixture(params=IMPLEMENTATIONS)
def stack(request):
    return request.getfixturevalue(_STACKS[request.param])


@pytest.fixture(params=RACING_IMPLEMENTATIONS)
def racing_stack(request):
    return request.getfixturevalue(_RACING_STACKS[request.param])


def submit(stack, user, now=NOW, priority=50, quotas=True):
    spec = RunSpec(command="true", queue="parked", priority=priority)
    # above the pool's max_user_priority only an admin may submit
    scopes = ["runs:read", "runs:write"] + (["admin"] if priority > 50 else [])
    principal = Principal(user=user, scopes=scopes)
    store_quotas = stack.quotas if quotas else None
    return submit_run(
        stack.store, stack.queue, stack.pools, principal, spec, None, lambda: now, quotas=store_quotas
    ).run


def start(stack, run):
    return lifecycle.claim(stack.store, run, run.attempt, "w1", 60.0, NOW)


def line(stack, priority=None):
    return [(r.owner, r.fair_tag) for r in stack.store.head("parked", 20, priority)]


def test_a_newcomer_goes_ahead_of_a_backlog(stack):
    alice = [submit(stack, "alice", NOW + i / 1000) for i in range(6)]  # a lead decays: moments apart
    assert [r.fair_tag for r in alice] == pytest.approx([0, 1, 2, 3, 4, 5], abs=1e-5)
    bob = submit(stack, "bob", NOW + 0.01)
    assert bob.fair_tag == 0
    assert stack.store.get(bob.id).fair_tag == 0
    assert [owner for owner, _ in line(stack)[:3]] == ["alice", "bob", "alice"]
    # the line moved on: bob's next run comes after alice's next, not after all of hers
    start(stack, alice[0])
    start(stack, bob)
    assert submit(stack, "bob", NOW + 0.02).fair_tag == pytest.approx(1, abs=1e-5)
    assert [owner for owner, _ in line(stack)[:3]] == ["alice", "bob", "alice"]


def test_without_a_quota_store_runs_start_in_the_order_they_came(stack):
    runs = [submit(stack, user, NOW + i, quotas=False) for i, user in enumerate(["alice"] * 3 + ["bob"])]
    assert {r.fair_tag for r in runs} == {0}
    assert [r.id for r in stack.store.head("parked", 10)] == [r.id for r in runs]


def test_a_lead_halves_every_half_life(stack):
    for run in [submit(stack, "alice", NOW) for _ in range(4)]:  # lane: tag 4, lead 4
        start(stack, run)
    # nothing waits: the line is at 0 again; half of alice's lead is left an hour on
    assert submit(stack, "alice", NOW + HALF_LIFE).fair_tag == pytest.approx(2.0)
    lane = stack.quotas.lane("parked", "alice")
    assert (lane.tag, lane.lead, lane.at) == (pytest.approx(3.0), pytest.approx(3.0), NOW + HALF_LIFE)
    # the line is at alice's run now: bob's first goes in line with it
    assert submit(stack, "bob", NOW + HALF_LIFE).fair_tag == pytest.approx(2.0)
    # a day on, alice's lead is gone: her next run too goes in line with the first waiting
    later = submit(stack, "alice", NOW + HALF_LIFE + 24 * HALF_LIFE)
    assert later.fair_tag == pytest.approx(2.0, abs=1e-5)


def test_a_lead_never_reaches_past_the_users_last_tag(stack):
    alice = [submit(stack, "alice", NOW) for _ in range(3)]  # tags 0, 1, 2; lane: tag 3, lead 3
    start(stack, alice[0])
    start(stack, alice[1])  # the line is at alice's 2 now
    assert submit(stack, "alice", NOW).fair_tag == 3  # 2 + min(3 - 2, 3), not 2 + 3
    assert submit(stack, "carol", NOW).fair_tag == 2


def test_each_priority_has_a_line_of_its_own(stack):
    for _ in range(3):
        submit(stack, "alice", NOW, priority=50)
    assert submit(stack, "bob", NOW, priority=50).fair_tag == 0
    urgent = submit(stack, "bob", NOW, priority=90)
    assert urgent.fair_tag == 1  # nothing waits at 90, and bob's lead is 1
    assert [r.id for r in stack.store.head("parked", 1)] == [urgent.id]
    assert line(stack, 90) == [("bob", 1)]
    owners = [owner for owner, _ in line(stack, 50)]  # one moment, one tag: the ids decide between them
    assert sorted(owners[:2]) == ["alice", "bob"] and owners[2:] == ["alice", "alice"]


def test_fair_tag_reads_the_line_of_the_pool_and_priority_once(stack):
    """What submit does: the tag of the first run of that pool and priority is the line's."""
    pool = stack.pools.get("parked")
    for user in ("alice", "alice", "bob"):
        submit(stack, user, NOW)
    start(stack, stack.store.head("parked", 1)[0])  # alice's first: bob's 0 is first now
    assert fair_tag(stack.store, stack.quotas, pool, "dave", 50, NOW) == 0
    assert fair_tag(stack.store, stack.quotas, pool, "dave", 50, NOW) == 1
    assert fair_tag(stack.store, stack.quotas, pool, "erin", 10, NOW) == 0
    assert stack.quotas.lane("parked", "dave").version == 2


def test_submits_of_one_user_at_once_never_share_a_tag(racing_stack):
    stack = racing_stack
    barrier = threading.Barrier(3)

    def one(_):
        barrier.wait()
        return submit(stack, "alice", NOW).fair_tag

    with ThreadPoolExecutor(3) as pool:
        tags = sorted(pool.map(one, range(3)))
    assert tags == [0, 1, 2]
    assert stack.quotas.lane("parked", "alice").version == 3
    assert stack.store.count("parked", RunState.QUEUED) == 3
