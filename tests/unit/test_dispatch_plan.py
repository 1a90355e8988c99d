from runplane.backend import BackendJob
from runplane.domain.pools import Pool
from runplane.domain.workers import PoolRecord, StartingJob, Worker
from runplane.services.dispatch import LIST_GRACE_SECONDS, PoolFacts, count_failures, plan_launches, reconcile


def pool(**kw):
    base = {"name": "p", "cpus": 2, "memory": "4g", "default_image": "x", "max_workers": 10}
    return Pool.model_validate({**base, **kw})


def worker(i, free=1, slots=1):
    return Worker(id=f"w{i}", pool="p", slots=slots, free_slots=free, started_at=0, heartbeat_at=0)


def job(i, created=0.0, state="running", reason=None):
    detail = {"reason": reason} if reason else {}
    return BackendJob(id=f"j{i}", pool="p", state=state, worker_id=f"w{i}", created_at=created, detail=detail)


def record(**kw):
    return PoolRecord(pool="p", **kw)


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


def test_a_burst_grows_with_the_backlog_and_stops_at_max():
    p = pool(max_workers=50)
    assert [plan_launches(p, PoolFacts(backlog=n, workers=[], jobs=[], now=0)).launch for n in (1, 7, 500)] == [
        1,
        7,
        50,
    ]
    # the next pass, with those 50 starting, launches nothing more and says why
    starting = [job(i) for i in range(50)]
    decision = plan_launches(p, PoolFacts(backlog=500, workers=[], jobs=starting, now=1))
    assert (decision.launch, decision.reason) == (0, "pool p at max_workers=50")


def test_launched_but_not_yet_listed_jobs_count_as_starting():
    decision = plan_launches(pool(), PoolFacts(backlog=3, workers=[], jobs=[], now=100, unlisted=3))
    assert (decision.launch, decision.reason) == (0, "waiting for a worker: 3 starting in pool p")
    assert plan_launches(pool(), PoolFacts(backlog=5, workers=[], jobs=[], now=100, unlisted=3)).launch == 2


def test_max_launches_per_cycle_caps_one_pass():
    assert plan_launches(pool(max_launches_per_cycle=4), PoolFacts(backlog=9, workers=[], jobs=[], now=0)).launch == 4


def test_pacing_also_counts_the_recorded_last_launch():
    p = pool(seconds_between_launches=30)
    facts = PoolFacts(backlog=5, workers=[], jobs=[], now=100, last_launch_at=90)
    assert plan_launches(p, facts).reason == "pacing: next launch in 20s"
    assert plan_launches(p, PoolFacts(backlog=5, workers=[], jobs=[], now=121, last_launch_at=90)).launch == 5


def test_min_workers_are_not_paced():
    p = pool(min_workers=3, seconds_between_launches=600)
    assert plan_launches(p, PoolFacts(backlog=0, workers=[], jobs=[job(1, created=99)], now=100)).launch == 2


def test_a_disabled_pool_waits_then_tries_one_worker():
    p = pool()
    facts = {"backlog": 9, "workers": [], "jobs": [], "disabled": "3 launches in a row failed", "retry_at": 700}
    waiting = plan_launches(p, PoolFacts(now=100, **facts))
    assert waiting.launch == 0
    assert waiting.reason == "pool p is disabled (3 launches in a row failed); next try in 600s"
    trial = plan_launches(p, PoolFacts(now=700, **facts))
    assert trial.launch == 1 and "trying one launch" in trial.reason
    pending_trial = plan_launches(p, PoolFacts(now=800, **{**facts, "jobs": [job(1)]}))
    assert pending_trial.launch == 0 and "waiting for its trial worker" in pending_trial.reason


def test_reconcile_counts_a_registered_worker_as_success_and_enables_the_pool():
    rec = record(
        starting={"j1": StartingJob(worker_id="w1", launched_at=10)},
        consecutive_failures=3,
        disabled_reason="3 launches in a row failed",
        disabled_at=5,
    )
    out = reconcile(pool(), rec, {"w1"}, [job(1)], {}, now=20)
    assert out.record.starting == {} and out.cancel == []
    assert (out.record.consecutive_failures, out.record.disabled_reason, out.record.disabled_at) == (0, None, None)
    assert rec.starting  # the input is left as it was


def test_reconcile_counts_jobs_that_ended_before_registering():
    rec = record(
        starting={
            "j1": StartingJob(worker_id="w1", launched_at=10),
            "j2": StartingJob(worker_id="w2", launched_at=10),
            "j3": StartingJob(worker_id="w3", launched_at=10),
            "j4": StartingJob(worker_id="w4", launched_at=10),
        }
    )
    ended = {
        "j1": job(1, state="failed", reason="CannotPullContainerError: no such image"),
        "j2": None,  # the engine does not know it (yet)
        "j3": job(3, state="pending"),  # listed late
        "j4": job(4, state="finished"),
    }
    soon = reconcile(pool(), rec, set(), [], ended, now=10 + LIST_GRACE_SECONDS - 1)
    assert set(soon.record.starting) == {"j2", "j3"}
    assert soon.record.failed_launches == 2
    assert soon.record.last_error == "job j4 of worker w4 finished before its agent registered"
    assert soon.record.disabled_reason is None  # 2 < max_failed_launches (3)
    later = reconcile(pool(), soon.record, set(), [], {"j2": None, "j3": job(3, state="pending")}, now=100)
    assert set(later.record.starting) == {"j3"}
    assert later.record.consecutive_failures == 3
    assert later.record.disabled_reason == (
        "3 launches in a row failed; last: job j2 of worker w2 vanished before its agent registered"
    )
    assert later.record.disabled_at == 100


def test_reconcile_cancels_a_running_job_whose_agent_never_registered():
    p = pool(start_timeout_seconds=300)
    rec = record(starting={"j1": StartingJob(worker_id="w1", launched_at=0)})
    jobs = [
        job(1, state="running"),
        job(2, state="pending", created=0),
        job(3, state="running", created=0),
        job(4, state="running", created=0),  # not launched by this record: another stack's, maybe
    ]
    first = reconcile(p, rec, {"w3"}, jobs, {}, now=1000)  # j1 waited 1000 s in the engine's queue
    assert first.cancel == [] and first.record.starting["j1"].running_since == 1000
    early = reconcile(p, first.record, {"w3"}, jobs, {}, now=1300)
    assert early.cancel == [] and early.record.failed_launches == 0
    late = reconcile(p, first.record, {"w3"}, jobs, {}, now=1301)
    # j1 ran 301 s without registering; j2 waits in the engine's queue (not the agent's fault);
    # j3's worker registered; j4 is not this record's to cancel
    assert late.cancel == ["j1"]
    assert late.record.starting == {}
    assert late.record.last_error == (
        "the agent of worker w1 did not register within 300s of its job starting; job j1 cancelled"
    )


def test_a_failed_trial_keeps_the_pool_disabled_for_another_period():
    p = pool(max_failed_launches=2)
    rec = record()
    count_failures(p, rec, ["boom", "boom"], now=10)
    assert rec.disabled_at == 10 and rec.disabled_reason == "2 launches in a row failed; last: boom"
    count_failures(p, rec, ["still boom"], now=700)
    assert rec.disabled_at == 700 and rec.failed_launches == 3 and rec.last_error == "still boom"
    assert rec.disabled_reason.startswith("2 launches in a row failed")


def test_explain_wait_reads_the_pool_record():
    from runplane.services.dispatch import explain_wait

    p = pool(max_workers=2)
    disabled = record(disabled_reason="3 launches in a row failed; last: no such image")
    assert explain_wait(p, [], None, disabled) == (
        "pool p is disabled: 3 launches in a row failed; last: no such image"
    )
    starting = record(starting={"j1": StartingJob(worker_id="w9", launched_at=0)})
    assert explain_wait(p, [], None, starting) == "waiting for a worker: 1 starting in pool p"
    failing = record(last_error="launch failed: quota exceeded")
    assert explain_wait(p, [worker(1, free=0)], None, failing).endswith(
        "(last launch error: launch failed: quota exceeded)"
    )


def test_a_groups_own_or_tag_exclusive_workers_are_no_room_for_the_backlog():
    own = Worker(id="w1", pool="p", free_slots=4, slots=4, started_at=0, heartbeat_at=0, group="vision")
    exclusive = Worker(
        id="w2", pool="p", free_slots=2, slots=2, started_at=0, heartbeat_at=0, tag="box", tag_exclusive=True
    )
    decision = plan_launches(pool(), PoolFacts(backlog=3, workers=[own, exclusive], jobs=[job(1), job(2)], now=0))
    assert decision.launch == 3  # their 6 free slots do not count
    shared = worker(3, free=3, slots=3)
    assert plan_launches(pool(), PoolFacts(backlog=3, workers=[own, shared], jobs=[], now=0)).launch == 0


def test_why_no_live_worker_takes_a_run():
    from runplane.domain.runs import Run, RunSpec
    from runplane.services.dispatch import explain_wait

    def run(tag=None):
        spec = RunSpec.model_validate({"command": "x", **({"tag": tag} if tag else {})})
        return Run(id="r", owner="ann", spec=spec, queue="p", created_at=0)

    plain = worker(1)
    reserved = Worker(id="w9", pool="p", started_at=0, heartbeat_at=0, tag="box", group="vision")
    assert explain_wait(pool(), [plain], None, None, run(tag="gpu")) == (
        "no live worker of pool p takes tag gpu: start one with runplane-agent --pool p --tag gpu"
    )
    assert explain_wait(pool(), [plain, reserved], None, None, run(tag="box")) == (
        "no live worker of pool p takes this run: this worker serves group vision only and ann is not in it"
    )
    assert explain_wait(pool(), [plain, reserved], None, None, run()).startswith("1 free slot(s) on 1 worker(s)")


def test_a_countdown_alone_is_not_a_change():
    from runplane.services.dispatch import _gist

    assert _gist("pacing: next launch in 20s") == _gist("pacing: next launch in 7s")
    assert _gist("pacing: next launch in 20s") != _gist("no backlog")


def test_reconcile_counts_a_worker_registered_refused_as_a_failed_launch():
    """A launched worker whose agent the version window refused registered all the same (its item
    says why): the pool's image holds an agent this stack does not allow, so it is a failed launch,
    and enough of them in a row disable the pool, with the reason, instead of relaunching forever."""
    why = "agent 0.0.1 is older than this stack allows (>= 0.1)"
    starting = {f"j{i}": StartingJob(worker_id=f"w{i}", launched_at=10) for i in (1, 2, 3)}
    rec = record(starting=starting, consecutive_failures=0)
    out = reconcile(
        pool(), rec, {"w1", "w2", "w3"}, [job(1), job(2), job(3)], {}, now=20, refused={"w2": why, "w3": why}
    )
    assert out.record.starting == {} and out.cancel == []
    assert (out.record.failed_launches, out.record.consecutive_failures) == (2, 2)
    assert out.record.last_error == f"the agent of worker w3 (job j3) was refused: {why}"
    rec = record(starting={"j4": StartingJob(worker_id="w4", launched_at=30)}, consecutive_failures=2)
    again = reconcile(pool(), rec, {"w4"}, [job(4)], {}, now=40, refused={"w4": why})
    assert (
        again.record.disabled_reason
        == f"3 launches in a row failed; last: the agent of worker w4 (job j4) was refused: {why}"
    )
