"""Fair tags at submit (runplane/services/scheduling.py), on the real stores: a user's runs take
tags one after another from the pool's line, a newcomer's first run takes the line's own, a lead
halves every half-life, a user's lanes at two priorities are apart, a run moved to another
priority goes in line there like a run submitted now, and submits of one user at once never share
a tag. Racing submits run on dynalite and Azurite (see ``racing_stack``)."""

import calendar
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from runplane.adapters.aws.dynamodb import to_dynamo as dynamodb_value
from runplane.adapters.aws.provision import provision
from runplane.bootstrap import aws_clients, aws_names, make_ports
from runplane.domain.errors import RunplaneError
from runplane.domain.expect import Expect
from runplane.domain.runs import RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.domain.workers import Worker
from runplane.services import lifecycle
from runplane.services.runs import set_priority, submit_run
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


def principal_of(user, priority=50):
    # above the pool's max_user_priority only an admin may submit
    return Principal(user=user, scopes=["runs:read", "runs:write"] + (["admin"] if priority > 50 else []))


def submit(stack, user, now=NOW, priority=50, key=None):
    spec = RunSpec(command="true", queue="parked", priority=priority)
    return submit_run(make_ports(stack, lambda: now), principal_of(user, priority), spec, key).run


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


def test_a_lead_halves_every_half_life(stack):
    for run in [submit(stack, "alice", NOW) for _ in range(4)]:  # lane: tag 4, lead 4
        start(stack, run)
    # nothing waits: the line is at 0 again; half of alice's lead is left an hour on
    assert submit(stack, "alice", NOW + HALF_LIFE).fair_tag == pytest.approx(2.0)
    lane = stack.quotas.lane("parked", "alice", 50)
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
    assert urgent.fair_tag == 0  # nothing waits at 90, and bob has no lead there
    assert [r.id for r in stack.store.head("parked", 1)] == [urgent.id]
    assert line(stack, 90) == [("bob", 0)]
    owners = [owner for owner, _ in line(stack, 50)]  # one moment, one tag: the ids decide between them
    assert sorted(owners[:2]) == ["alice", "bob"] and owners[2:] == ["alice", "alice"]


def test_fair_tag_reads_the_line_of_the_pool_and_priority_once(stack):
    """What submit does: the tag of the first run of that pool and priority is the line's."""
    pool = stack.pools.get("parked")
    for user in ("alice", "alice", "bob"):
        submit(stack, user, NOW)
    start(stack, stack.store.head("parked", 1)[0])  # alice's first: bob's 0 is first now
    assert fair_tag(stack.ports, pool, "dave", 50, NOW) == 0
    assert fair_tag(stack.ports, pool, "dave", 50, NOW) == 1
    assert fair_tag(stack.ports, pool, "erin", 10, NOW) == 0
    assert stack.quotas.lane("parked", "dave", 50).version == 2
    assert stack.quotas.lane("parked", "erin", 10).version == 1


def test_a_submit_at_another_priority_leaves_the_users_lane_at_the_first(stack):
    for _ in range(3):
        submit(stack, "alice", NOW)  # tags 0, 1, 2 at 50
    assert submit(stack, "alice", NOW, priority=90).fair_tag == 0  # a line of its own, a lane of its own
    assert submit(stack, "alice", NOW).fair_tag == 3
    lanes = {p: stack.quotas.lane("parked", "alice", p) for p in (50, 90)}
    assert {p: (lane.tag, lane.version) for p, lane in lanes.items()} == {50: (4, 4), 90: (1, 1)}


def test_a_run_raised_to_a_busy_priority_goes_in_line_there_like_a_run_submitted_now(stack):
    """A backlog queued at a quiet priority, whose tags are low there, and then raised, goes
    behind the runs already waiting at the new priority, in turn with them: it cannot cut in."""
    bob = [submit(stack, "bob", NOW) for _ in range(5)]  # tags 0..4 at 50
    for run in bob[:3]:
        start(stack, run)  # the line at 50 is at bob's 3 now
    carol = submit(stack, "carol", NOW + 0.001)
    assert carol.fair_tag == 3
    alice = [submit(stack, "alice", NOW + 0.01, priority=20) for _ in range(3)]
    assert [r.fair_tag for r in alice] == [0, 1, 2]  # nothing else waits at 20
    owner = principal_of("alice")
    raised = [set_priority(make_ports(stack, lambda: NOW + 0.02), owner, r.id, 50) for r in alice]
    assert [r.fair_tag for r in raised] == [3, 4, 5]
    assert [r.fair_tag for r in map(stack.store.get, [r.id for r in alice])] == [3, 4, 5]
    assert [who for who, _ in line(stack, 50)] == ["bob", "carol", "alice", "bob", "alice", "alice"]
    assert line(stack, 20) == []
    assert stack.quotas.lane("parked", "alice", 50).tag == 6


def test_the_line_is_read_past_runs_that_came_back_or_wait_for_a_quota(stack):
    """A run handed back to the queue keeps its old, low tag, and a run held back by a quota may
    wait long: neither sets the line's virtual time, which would go back for everyone after."""
    alice = [submit(stack, "alice", NOW) for _ in range(4)]  # tags 0..3
    back = start(stack, alice[0])
    start(stack, alice[1])
    lifecycle.requeue(stack, back, NOW, "worker lost", charge=False)  # tag 0, attempt 1
    held = stack.store.get(alice[2].id)
    stack.store.update(
        held,
        Expect(states=frozenset({RunState.QUEUED}), attempt=held.attempt),
        {"waiting_reason": "quota: user alice runs 1 of at most 1 run(s) at once"},
    )
    assert [tag for _, tag in line(stack)] == [0, 2, 3]
    assert submit(stack, "bob", NOW).fair_tag == 3  # alice's 3, not the re-queued 0 nor the held 2
    # when only such runs wait, the first of them is the line's
    for run in stack.store.head("parked", 10):
        if run.fair_tag >= 3:
            start(stack, run)
    assert submit(stack, "carol", NOW).fair_tag == 0


def test_a_replayed_submit_leaves_the_lane_as_it_was(stack):
    first = submit(stack, "alice", NOW, key="k1")
    lane = stack.quotas.lane("parked", "alice", 50)
    again = submit(stack, "alice", NOW + 1, key="k1")
    assert (again.id, again.fair_tag) == (first.id, first.fair_tag)
    assert stack.quotas.lane("parked", "alice", 50) == lane
    assert submit(stack, "alice", NOW, key="k2").fair_tag == 1


def test_submits_of_one_user_at_once_never_share_a_tag(racing_stack):
    stack = racing_stack
    barrier = threading.Barrier(3)

    def one(_):
        barrier.wait()
        return submit(stack, "alice", NOW).fair_tag

    with ThreadPoolExecutor(3) as pool:
        tags = sorted(pool.map(one, range(3)))
    assert tags == [0, 1, 2]
    assert stack.quotas.lane("parked", "alice", 50).version == 3
    assert stack.store.count("parked", RunState.QUEUED) == 3


def test_a_line_that_cannot_be_read_costs_fairness_not_the_submit(aws_stack):
    """A stack upgraded in place builds its by_rank index for a while: queries of it fail. Submits
    go on, tagged from the start of the line (0) plus the user's lead."""
    stack = aws_stack
    dynamodb = stack.store.client
    dynamodb.update_table(
        TableName=stack.store.table, GlobalSecondaryIndexUpdates=[{"Delete": {"IndexName": "by_rank"}}]
    )
    with pytest.raises(RunplaneError):
        stack.store.head("parked", 1)
    assert [submit(stack, "alice", NOW).fair_tag for _ in range(2)] == [0, 1]
    assert stack.store.count("parked", RunState.QUEUED) == 2


def test_provision_gives_a_table_of_an_earlier_version_its_line(aws_stack):
    """A runs table made before lines existed (no by_rank index): provisioning the stack again,
    as runplane dev or a LocalStack init hook does, adds the index, and the queued runs written
    since read in order."""
    stack = aws_stack
    dynamodb = stack.store.client
    dynamodb.update_table(
        TableName=stack.store.table, GlobalSecondaryIndexUpdates=[{"Delete": {"IndexName": "by_rank"}}]
    )
    names = aws_names(stack.settings)
    clients = aws_clients(stack.settings)
    provision(names, [p.name for p in stack.pools.pools], clients["dynamodb"], clients["sqs"], clients["s3"])
    indexes = dynamodb.describe_table(TableName=stack.store.table)["Table"]["GlobalSecondaryIndexes"]
    assert "by_rank" in {i["IndexName"] for i in indexes}
    first, second = submit(stack, "alice", NOW), submit(stack, "bob", NOW + 1)
    assert [r.id for r in stack.store.head("parked", 10)] == [first.id, second.id]
    provision(
        names, [p.name for p in stack.pools.pools], clients["dynamodb"], clients["sqs"], clients["s3"]
    )  # again: nothing to add


def test_provision_gives_a_workers_table_of_an_earlier_version_its_pool_index(aws_stack):
    """A workers table made before the by_pool index: provisioning again adds it, and a pool's
    workers (written before and after) are read through it, none of another pool's."""
    stack = aws_stack
    dynamodb = stack.store.client
    table = aws_names(stack.settings).workers_table
    dynamodb.update_table(TableName=table, GlobalSecondaryIndexUpdates=[{"Delete": {"IndexName": "by_pool"}}])
    stack.workers.put(Worker(id="w-a", pool="default", started_at=NOW, heartbeat_at=NOW))
    names, clients = aws_names(stack.settings), aws_clients(stack.settings)
    provision(names, [p.name for p in stack.pools.pools], clients["dynamodb"], clients["sqs"], clients["s3"])
    indexes = dynamodb.describe_table(TableName=table)["Table"]["GlobalSecondaryIndexes"]
    assert [i["IndexName"] for i in indexes] == ["by_pool"]
    for worker_id, pool in (("w-b", "default"), ("w-c", "parked")):
        stack.workers.put(Worker(id=worker_id, pool=pool, started_at=NOW, heartbeat_at=NOW))
    assert [w.id for w in stack.workers.list("default")] == ["w-a", "w-b"]
    assert [w.id for w in stack.workers.list()] == ["w-a", "w-b", "w-c"]


def test_workers_written_one_attribute_a_field_are_still_read(aws_stack):
    """Items written before the record became one document (an older agent's heartbeat) read
    back the same, by id, in a pool's listing and on a page."""
    stack = aws_stack
    old = Worker(
        id="w-old",
        pool="default",
        slots=2,
        free_slots=1,
        runs=["r-1"],
        run_owners={"r-1": "alice"},
        gpu_ids=["0"],
        started_at=NOW,
        heartbeat_at=NOW,
    )
    item = {k: dynamodb_value(v) for k, v in old.model_dump(mode="json").items()}
    item["expires_at"] = {"N": str(int(NOW) + 3600)}
    stack.store.client.put_item(TableName=aws_names(stack.settings).workers_table, Item=item)
    stack.workers.put(Worker(id="w-new", pool="default", started_at=NOW, heartbeat_at=NOW))
    assert stack.workers.get("w-old") == old
    assert [w for w in stack.workers.list("default") if w.id == "w-old"] == [old]
    assert {w.id for w in stack.workers.page("default", 10)[0]} == {"w-old", "w-new"}
