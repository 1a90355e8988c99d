from runplane.domain.models import Pool, Worker
from runplane.ports import BackendJob
from runplane.services.dispatch import PoolFacts, plan_launches


def pool(**kw):
    base = {"name": "p", "cpus": 2, "memory": "4g", "default_image": "x", "max_workers": 10}
    return Pool.model_validate({**base, **kw})


def worker(i, free=1, slots=1):
    return Worker(id=f"w{i}", pool="p", slots=slots, free_slots=free, started_at=0, heartbeat_at=0)


def job(i, created=0.0):
    return BackendJob(id=f"w{i}", pool="p", state="running", worker_id=f"w{i}", created_at=created)


def test_burst_launches_for_the_whole_backlog_up_to_max():
    assert plan_launches(pool(), PoolFacts(backlog=500, workers=[], jobs=[], now=100)).launch == 10
    assert plan_launches(pool(), PoolFacts(backlog=3, workers=[], jobs=[], now=100)).launch == 3


def test_slots_divide_the_need():
    assert plan_launches(pool(slots=4), PoolFacts(backlog=9, workers=[], jobs=[], now=100)).launch == 3


def test_starting_workers_count_as_capacity():
    facts = PoolFacts(backlog=3, workers=[], jobs=[job(1), job(2)], now=100)
    assert plan_launches(pool(), facts).launch == 1


def test_idle_workers_absorb_backlog():
    facts = PoolFacts(backlog=2, workers=[worker(1), worker(2)], jobs=[job(1), job(2)], now=100)
    decision = plan_launches(pool(), facts)
    assert decision.launch == 0
    assert decision.reason == "enough workers"


def test_max_workers_caps_and_says_so():
    facts = PoolFacts(backlog=5, workers=[worker(1, free=0)], jobs=[job(1)], now=100)
    decision = plan_launches(pool(max_workers=1), facts)
    assert decision.launch == 0
    assert decision.reason == "pool p at max_workers=1"


def test_min_workers_kept_without_backlog():
    assert plan_launches(pool(min_workers=2), PoolFacts(backlog=0, workers=[], jobs=[job(1)], now=100)).launch == 1


def test_scale_to_zero_launches_nothing():
    decision = plan_launches(pool(), PoolFacts(backlog=0, workers=[], jobs=[], now=100))
    assert decision.launch == 0
    assert decision.reason == "no backlog"


def test_pacing_waits_after_the_newest_launch():
    facts = PoolFacts(backlog=5, workers=[], jobs=[job(1, created=95)], now=100)
    decision = plan_launches(pool(seconds_between_launches=30), facts)
    assert decision.launch == 0
    assert decision.reason.startswith("pacing")
    later = PoolFacts(backlog=5, workers=[], jobs=[job(1, created=60)], now=100)
    assert plan_launches(pool(seconds_between_launches=30), later).launch == 4


def test_explain_wait_says_why():
    from runplane.services.dispatch import explain_wait

    p = pool(max_workers=2)
    assert explain_wait(None, [], None) == "its pool is no longer configured; no worker will take it"
    assert explain_wait(p, [worker(1, free=1)], None).startswith("1 free slot(s) on 1 worker(s) of pool p")
    assert explain_wait(p, [worker(1, free=0), worker(2, free=0)], None) == (
        "pool p is at max_workers=2, all busy: waiting for a free slot"
    )
    assert explain_wait(p, [worker(1, free=0)], None) == (
        "waiting for a worker: 1 of at most 2 worker(s) of pool p up, more being started"
    )
    assert explain_wait(pool(max_workers=0), [], None).startswith("pool p has max_workers=0 and no worker")
    requeued = explain_wait(p, [], "re-queued after attempt 1: worker w stopped renewing its lease")
    assert requeued.startswith("re-queued after attempt 1: worker w stopped renewing its lease; waiting for a worker")
