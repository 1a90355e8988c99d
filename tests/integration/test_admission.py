"""Admission under quotas, on the real stores (moto's DynamoDB and Azurite's Table storage):
caps and budgets reserved at claim by conditional writes on usage records, released and settled
when attempts end, healed when an attempt ends without its worker, and refused at submit when a
run alone can never fit. Racing reserves run on dynalite and Azurite (see ``racing_stack``)."""

import calendar
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from runplane.bootstrap import make_ports
from runplane.domain.asks import Resources
from runplane.domain.errors import InvalidRequest
from runplane.domain.quotas import Quota, hold_key
from runplane.domain.runs import RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.domain.workers import Worker
from runplane.services import admission, lifecycle
from runplane.services.admission import heal, refuse_alone, release, reserve
from runplane.services.dispatch import explain_wait
from runplane.services.reap import reap
from runplane.services.runs import submit_run

IMPLEMENTATIONS = ["aws-moto", "azure-azurite"]
_STACKS = {"aws-moto": "aws_stack", "azure-azurite": "azure_stack"}
RACING_IMPLEMENTATIONS = ["aws-dynalite", "azure-azurite"]
_RACING_STACKS = {"aws-dynalite": "aws_dynalite_stack", "azure-azurite": "azure_stack"}

NOW = float(calendar.timegm((2026, 11, 30, 12, 0, 0)))  # a Monday, the last day of a month
HOUR = 3600.0


@pytest.fixture(params=IMPLEMENTATIONS)
def stack(request):
    return request.getfixturevalue(_STACKS[request.param])


@pytest.fixture(params=RACING_IMPLEMENTATIONS)
def racing_stack(request):
    return request.getfixturevalue(_RACING_STACKS[request.param])


ALICE = Principal(user="alice", scopes=["runs:read", "runs:write"])


def user(name, groups=()):
    return Principal(user=name, scopes=["runs:read", "runs:write"], groups=list(groups))


def quota(kind, name, **limits):
    return Quota(kind=kind, name=name, updated_at=NOW, updated_by="admin", **limits)


def submit(stack, principal=ALICE, queue="parked", cpus=1.0, gpus=0, seconds=HOUR, group=None, quotas=None):
    spec = RunSpec(command="true", queue=queue, resources=Resources(cpus=cpus, gpus=gpus, time=seconds), group=group)
    return submit_run(make_ports(stack, lambda: NOW), principal, spec, None).run


def claim(stack, run, worker="w1", now=NOW, lease=60.0):
    return lifecycle.claim(stack.store, run, run.attempt, worker, lease, now)


def finish(stack, run, now):
    for state in (RunState.RUNNING, RunState.UPLOADING, RunState.SUCCEEDED):
        run = lifecycle.advance(stack.store, run, state, now, str(state))
    return run


def drain(stack, pool="parked"):
    """Every hint now in ``pool``'s queue, deleted: (run id, attempt) pairs."""
    seen = []
    for _ in range(3):
        got = stack.queue.receive(pool, 10, 1, 30)
        for delivery in got:
            seen.append((delivery.message.run_id, delivery.message.attempt))
            stack.queue.delete(pool, delivery)
    return seen


# -- caps -----------------------------------------------------------------------------------------


def test_max_running_holds_the_cap_and_release_returns_the_waiting_run(stack):
    q = stack.quotas
    q.put(quota("user", "alice", max_running=1))
    first, second = submit(stack), submit(stack)
    assert reserve(q, first, 1, NOW) is None
    assert reserve(q, second, 1, NOW) == "quota: alice runs 1 of at most 1 run(s) at once"
    record = q.usage("user", "alice")
    assert list(record.holds) == [hold_key(first.id, 1)]
    assert record.blocked == {second.id: 0}
    # the run that waits is remembered once, however often its hint comes back
    version = record.version
    assert reserve(q, second, 1, NOW) is not None
    assert q.usage("user", "alice").version == version
    assert release(q, first, 1, NOW + 10) == {second.id: 0}
    after = q.usage("user", "alice")
    assert (after.running, after.blocked) == (0, {})
    assert reserve(q, second, 1, NOW + 10) is None
    assert list(q.usage("user", "alice").holds) == [hold_key(second.id, 1)]


def test_max_gpus_binds_gpu_runs_only(stack):
    q = stack.quotas
    q.put(quota("user", "alice", max_gpus=2))
    two, one = submit(stack, queue="big", gpus=2), submit(stack, queue="big", gpus=1)
    cpu_only = submit(stack)
    assert reserve(q, two, 1, NOW) is None
    assert reserve(q, one, 1, NOW) == "quota: alice uses 2 of 2 GPUs"
    assert reserve(q, cpu_only, 1, NOW) is None
    assert q.usage("user", "alice").gpus == 2
    # lowered below what is held: GPU runs wait, CPU-only runs still start
    q.put(quota("user", "alice", max_gpus=1))
    assert reserve(q, submit(stack, queue="big", gpus=1), 1, NOW) == "quota: alice uses 2 of 1 GPUs"
    assert reserve(q, submit(stack), 1, NOW) is None


def test_max_cpus(stack):
    q = stack.quotas
    q.put(quota("user", "alice", max_cpus=3))
    first, second, small = submit(stack, cpus=2), submit(stack, cpus=2), submit(stack, cpus=1)
    assert reserve(q, first, 1, NOW) is None
    assert reserve(q, second, 1, NOW) == "quota: alice uses 2 of 3 CPUs"
    assert reserve(q, small, 1, NOW) is None  # 3 of 3: exactly the cap
    assert q.usage("user", "alice").cpus == 3


def test_a_full_group_gives_back_the_hold_its_member_took(stack):
    q = stack.quotas
    carol, dave = user("carol", ["vision"]), user("dave", ["vision"])
    q.put(quota("group", "vision", max_running=1))
    q.put(quota("user", "dave", max_running=5))
    mine = submit(stack, carol)
    theirs = submit(stack, dave)
    assert (mine.group, theirs.group) == ("vision", "vision")
    assert reserve(q, mine, 1, NOW) is None
    # a run of dave's that waits for dave's own room
    q.save_usage(q.usage("user", "dave").model_copy(update={"blocked": {"r-waiting": 0}}))
    assert reserve(q, theirs, 1, NOW) == "quota: group vision runs 1 of at most 1 run(s) at once"
    dave_use = q.usage("user", "dave")
    assert dave_use.holds == {}  # taken for dave, given back: the group had no room
    assert dave_use.blocked == {"r-waiting": 0}  # no room was made for it: it still waits
    assert q.usage("group", "vision").blocked == {theirs.id: 0}
    # a user without a quota holds nothing of their own
    assert q.usage("user", "carol").version == 0


def test_a_duplicate_hint_reserves_the_same_hold_and_gives_back_only_its_own(stack):
    q = stack.quotas
    carol = user("carol", ["vision"])
    q.put(quota("user", "carol", max_running=1))
    q.put(quota("group", "vision", max_running=1))
    run = submit(stack, carol)
    assert reserve(q, run, 1, NOW) is None
    assert reserve(q, run, 1, NOW) is None  # a second worker with the same hint: no second hold
    assert list(q.usage("user", "carol").holds) == [hold_key(run.id, 1)]
    # the group filled meanwhile: the second worker waits, and leaves the first one's hold alone
    q.save_usage(q.usage("group", "vision").model_copy(update={"holds": {}}))
    other = submit(stack, user("dave", ["vision"]))
    assert reserve(q, other, 1, NOW) is None
    assert reserve(q, run, 1, NOW) == "quota: group vision runs 1 of at most 1 run(s) at once"
    assert list(q.usage("user", "carol").holds) == [hold_key(run.id, 1)]


def test_no_quota_no_hold(stack):
    run = submit(stack)
    assert reserve(stack.quotas, run, 1, NOW) is None
    assert stack.quotas.usage("user", "alice").version == 0
    assert release(stack.quotas, run, 1, NOW) == {}


# -- budgets --------------------------------------------------------------------------------------


def test_budget_reserves_the_worst_case_and_settles_what_was_used(stack):
    q = stack.quotas
    carol = user("carol", ["vision"])
    q.put(quota("group", "vision", gpu_hours=2))
    runs = [submit(stack, carol, queue="big", gpus=1, seconds=HOUR) for _ in range(3)]
    assert reserve(q, runs[0], 1, NOW) is None
    assert reserve(q, runs[1], 1, NOW) is None
    assert (
        reserve(q, runs[2], 1, NOW) == "budget: group vision has 0 of 2 GPU-hours left this month, this run may need 1"
    )
    # half an hour used of the hour reserved: 0.5 settled, 1 still reserved by the other
    release(q, runs[0], 1, NOW + HOUR / 2)
    record = q.usage("group", "vision")
    assert (record.period, record.gpu_seconds) == ("month:2026-11", HOUR / 2)
    assert (
        reserve(q, runs[2], 1, NOW + HOUR / 2)
        == "budget: group vision has 0.5 of 2 GPU-hours left this month, this run may need 1"
    )
    # a quarter of an hour: 0.75 settled, and the third fits
    release(q, runs[1], 1, NOW + HOUR / 4)
    assert q.usage("group", "vision").gpu_seconds == HOUR * 0.75
    assert reserve(q, runs[2], 1, NOW + HOUR / 2) is None


def test_use_is_charged_at_most_what_was_reserved(stack):
    q = stack.quotas
    q.put(quota("user", "alice", cpu_hours=100))
    run = submit(stack, cpus=2, seconds=HOUR)
    assert reserve(q, run, 1, NOW) is None
    release(q, run, 1, NOW + 10 * HOUR)  # ran (or was charged) far past its limit
    assert q.usage("user", "alice").cpu_seconds == 2 * HOUR


def test_a_new_period_starts_at_zero(stack):
    q = stack.quotas
    q.put(quota("user", "alice", cpu_hours=1.5, period="day"))
    first, second = submit(stack, seconds=HOUR), submit(stack, seconds=HOUR)
    assert reserve(q, first, 1, NOW) is None
    release(q, first, 1, NOW + HOUR)
    assert reserve(q, second, 1, NOW + HOUR) == (
        "budget: alice has 0.5 of 1.5 CPU-hours left today, this run may need 1"
    )
    tomorrow = NOW + 13 * HOUR  # 01:00 on the first of the next month
    assert reserve(q, second, 1, tomorrow) is None
    release(q, second, 1, tomorrow + HOUR / 2)
    record = q.usage("user", "alice")
    assert (record.period, record.cpu_seconds) == ("day:2026-12-01", HOUR / 2)


def test_a_week_is_an_iso_week_in_utc_from_monday(stack):
    """A weekly budget goes on across the end of a month and of a year (2026's ISO week 53 runs
    from Monday 28 December to Sunday 3 January) and starts at zero on Monday 00:00 UTC."""
    q = stack.quotas
    q.put(quota("user", "alice", cpu_hours=1.5, period="week"))
    first, second = submit(stack, seconds=HOUR), submit(stack, seconds=HOUR)
    thursday = float(calendar.timegm((2026, 12, 31, 10, 0, 0)))
    assert reserve(q, first, 1, thursday) is None
    release(q, first, 1, thursday + HOUR)
    assert q.usage("user", "alice").period == "week:2026-W53"
    new_year, sunday_night = (
        float(calendar.timegm((2027, 1, 1, 10, 0, 0))),
        float(calendar.timegm((2027, 1, 3, 23, 59, 59))),
    )
    for still_that_week in (new_year, sunday_night):
        assert reserve(q, second, 1, still_that_week) == (
            "budget: alice has 0.5 of 1.5 CPU-hours left this week, this run may need 1"
        )
    monday = sunday_night + 1
    assert reserve(q, second, 1, monday) is None
    release(q, second, 1, monday + HOUR / 2)
    record = q.usage("user", "alice")
    assert (record.period, record.cpu_seconds) == ("week:2027-W01", HOUR / 2)


def test_budget_messages_name_the_period(stack):
    q = stack.quotas
    q.put(quota("user", "alice", cpu_hours=0.5, period="week"))
    run = submit(stack, seconds=HOUR / 2)
    other = submit(stack, seconds=HOUR / 2)
    assert reserve(q, run, 1, NOW) is None
    assert reserve(q, other, 1, NOW) == "budget: alice has 0 of 0.5 CPU-hours left this week, this run may need 0.5"


# -- release --------------------------------------------------------------------------------------


def test_release_is_idempotent(stack):
    q = stack.quotas
    q.put(quota("user", "alice", max_running=1, cpu_hours=10))
    first, second = submit(stack), submit(stack)
    assert reserve(q, first, 1, NOW) is None
    assert reserve(q, second, 1, NOW) is not None
    assert release(q, first, 1, NOW + 60) == {second.id: 0}
    settled = q.usage("user", "alice")
    assert settled.cpu_seconds == 60
    assert release(q, first, 1, NOW + 120) == {}
    again = q.usage("user", "alice")
    assert (again.version, again.cpu_seconds) == (settled.version, 60)
    # another attempt's release leaves the hold of this one alone
    assert reserve(q, second, 1, NOW) is None
    assert release(q, second, 2, NOW) == {}
    assert list(q.usage("user", "alice").holds) == [hold_key(second.id, 1)]


def test_release_frees_holds_of_a_quota_removed_meanwhile(stack):
    q = stack.quotas
    q.put(quota("user", "alice", max_running=1))
    run = submit(stack)
    assert reserve(q, run, 1, NOW) is None
    assert q.delete("user", "alice")
    release(q, run, 1, NOW + 5)
    assert q.usage("user", "alice").holds == {}


# -- heal -----------------------------------------------------------------------------------------


def test_heal_releases_stale_holds_only_after_the_grace(stack):
    q = stack.quotas
    q.put(quota("user", "alice", max_running=2))
    crashed, alive, waiting = submit(stack), submit(stack), submit(stack)
    assert reserve(q, crashed, 1, NOW) is None  # its worker died before it claimed
    assert reserve(q, alive, 1, NOW) is None
    claim(stack, alive)
    assert reserve(q, waiting, 1, NOW) is not None
    drain(stack)
    assert heal(stack, NOW + 30, grace=60) == []
    assert heal(stack, NOW + 61, grace=60) == [hold_key(crashed.id, 1)]
    record = q.usage("user", "alice")
    assert list(record.holds) == [hold_key(alive.id, 1)]  # active at its attempt: kept
    assert record.blocked == {}
    assert drain(stack) == [(waiting.id, 0)]  # the run that waited got its hint back
    assert heal(stack, NOW + 600, grace=60) == []


def test_heal_charges_an_ended_run_until_its_end(stack):
    q = stack.quotas
    q.put(quota("user", "alice", cpu_hours=10))
    run = submit(stack, cpus=2)
    assert reserve(q, run, 1, NOW) is None
    finish(stack, claim(stack, run), NOW + 100)  # ended; its worker never released the hold
    assert heal(stack, NOW + 1000) == [hold_key(run.id, 1)]
    assert q.usage("user", "alice").cpu_seconds == pytest.approx(200)


def test_the_reaper_releases_the_hold_of_a_run_it_requeues(stack):
    q = stack.quotas
    q.put(quota("user", "alice", max_running=1))
    run = submit(stack, queue="default")
    assert reserve(q, run, 1, NOW) is None
    claim(stack, run, lease=10)
    # the lease lapsed: re-queued; the hold goes once it is older than the grace
    report = reap(make_ports(stack, lambda: NOW + 30), rehint_after=HOUR)
    assert report.requeued == [run.id]
    assert report.released == []
    assert list(q.usage("user", "alice").holds) == [hold_key(run.id, 1)]
    report = reap(make_ports(stack, lambda: NOW + 61), rehint_after=HOUR)
    assert report.released == [hold_key(run.id, 1)]
    assert q.usage("user", "alice").holds == {}
    requeued = stack.store.get(run.id)
    assert (requeued.state, requeued.attempt) == (RunState.QUEUED, 1)
    assert reserve(q, requeued, 2, NOW + 61) is None


# -- submit ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "kind", "resources", "message"),
    [
        ({"max_gpus": 1}, "group", {"queue": "big", "gpus": 2}, "quota: group vision allows at most 1 GPUs at once; "
         "this run asks 2"),
        ({"max_cpus": 1.5}, "user", {"cpus": 2}, "quota: carol allows at most 1.5 CPUs at once; this run asks 2"),
        ({"max_running": 0}, "user", {}, "quota: carol allows no runs at once (max_running 0)"),
        ({"gpu_hours": 1}, "group", {"queue": "big", "gpus": 2, "seconds": HOUR}, "budget: group vision has 1 "
         "GPU-hours a month; this run may need 2 (its GPUs times its time limit)"),
        ({"cpu_hours": 1, "period": "day"}, "user", {"cpus": 1, "seconds": 2 * HOUR}, "budget: carol has 1 "
         "CPU-hours a day; this run may need 2 (its CPUs times its time limit)"),
    ],
)  # fmt: skip
def test_submit_refuses_a_run_that_alone_can_never_fit(stack, limits, kind, resources, message):
    carol = user("carol", ["vision"])
    stack.quotas.put(quota(kind, "carol" if kind == "user" else "vision", **limits))
    with pytest.raises(InvalidRequest) as info:
        submit(stack, carol, quotas=stack.quotas, **resources)
    assert info.value.message == message
    assert stack.store.count(resources.get("queue", "parked"), RunState.QUEUED) == 0


def test_submit_admits_what_fits_alone(stack):
    carol = user("carol", ["vision"])
    stack.quotas.put(quota("group", "vision", max_gpus=2, gpu_hours=2, max_running=1))
    run = submit(stack, carol, queue="big", gpus=2, seconds=HOUR, quotas=stack.quotas)
    assert stack.store.get(run.id).state == RunState.QUEUED
    # a quota of a group the run is not charged to does not apply
    refuse_alone(stack.quotas, "carol", None, Resources(cpus=1, gpus=4, time=HOUR))


def test_group_resolution_at_submit(stack):
    carol = user("carol", ["vision"])
    both = user("erin", ["vision", "audio"])
    assert submit(stack, carol).group == "vision"  # the only group
    assert stack.store.get(submit(stack, carol).id).group == "vision"
    with pytest.raises(InvalidRequest, match=r"^you are in several groups \(audio, vision\): name the one to charge"):
        submit(stack, both)  # more than one: named, or the default an administrator set
    assert submit(stack, both.model_copy(update={"default_group": "audio"})).group == "audio"
    assert submit(stack, both, group="audio").group == "audio"
    assert submit(stack, ALICE).group is None
    with pytest.raises(InvalidRequest, match=r"^you are not in group vision$"):
        submit(stack, ALICE, group="vision")
    with pytest.raises(InvalidRequest, match=r"^you are not in group audio$"):
        submit(stack, carol, group="audio")


def test_a_run_charged_to_its_group_counts_against_both(stack):
    q = stack.quotas
    both = user("erin", ["vision", "audio"])
    q.put(quota("group", "audio", max_running=1))
    q.put(quota("group", "vision", max_running=1))
    audio = submit(stack, both, group="audio")
    assert reserve(q, audio, 1, NOW) is None
    assert reserve(q, submit(stack, both, group="vision"), 1, NOW) is None  # vision had room
    assert reserve(q, submit(stack, both, group="audio"), 1, NOW) == (
        "quota: group audio runs 1 of at most 1 run(s) at once"
    )


# -- why a run waits -----------------------------------------------------------------------------


def test_a_quota_reason_is_not_hidden_by_free_workers(stack):
    run = submit(stack, queue="manual")
    pool = stack.pools.get("manual")
    free = [Worker(id="w1", pool="manual", free_slots=1, started_at=NOW, heartbeat_at=NOW)]
    assert "free slot" in explain_wait(pool, free, run.waiting_reason, None, run)
    for reason in ("quota: alice runs 1 of at most 1 run(s) at once", "budget: alice has 0 of 1 CPU-hours left today"):
        assert explain_wait(pool, free, reason, None, run) == reason


# -- the cache ------------------------------------------------------------------------------------


def test_cached_quotas_read_quotas_once_per_ttl_but_usage_every_time(stack):
    ticks = [0.0]
    cached = admission.CachedQuotas(stack.quotas, ttl=4, clock=lambda: ticks[0])
    assert cached.get("user", "alice") is None
    stack.quotas.put(quota("user", "alice", max_running=1))  # behind the cache's back
    assert cached.get("user", "alice") is None
    ticks[0] = 4.5
    assert cached.get("user", "alice").max_running == 1
    cached.put(quota("user", "alice", max_running=3))  # through it: seen at once
    assert cached.get("user", "alice").max_running == 3
    run = submit(stack)
    assert reserve(cached, run, 1, NOW) is None
    assert cached.usage("user", "alice").running == 1


# -- races ----------------------------------------------------------------------------------------


def test_racing_reserves_never_both_take_the_last_of_a_cap(racing_stack):
    stack = racing_stack
    q = stack.quotas
    q.put(quota("user", "alice", max_running=2))
    n = 8
    runs = [submit(stack) for _ in range(n)]
    barrier = threading.Barrier(n)

    def one(i):
        barrier.wait(10)
        return reserve(q, runs[i], 1, NOW)

    with ThreadPoolExecutor(n) as pool:
        reasons = list(pool.map(one, range(n)))
    admitted = [run.id for run, reason in zip(runs, reasons, strict=True) if reason is None]
    assert len(admitted) == 2
    record = q.usage("user", "alice")
    assert sorted(record.holds) == sorted(hold_key(r, 1) for r in admitted)
    waiting = {run.id: 0 for run, reason in zip(runs, reasons, strict=True) if reason is not None}
    assert record.blocked == waiting  # every loser is remembered, none lost to a race
    assert release(q, runs[reasons.index(None)], 1, time.time()) == waiting
