"""The dispatcher on the real stores (moto server) with agents as real local processes:
concurrent invocations, failed launches, jobs that never register, and what the API shows."""

import dataclasses
import sys
import threading
import time

import pytest

from runplane.bootstrap import make_ports
from runplane.compute.local.compute import LocalCompute
from runplane.domain.errors import ConditionFailed
from runplane.domain.pools import Pool
from runplane.domain.runs import RunSpec
from runplane.domain.tenancy import Principal
from runplane.domain.workers import PoolRecord, Worker
from runplane.services.dispatch import (
    CLAIM_SECONDS,
    FIGURES_REFRESH_SECONDS,
    dispatch_pool,
    explain_wait,
)
from runplane.services.runs import submit_run
from tests.conftest import wait_for

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
BROKEN = ["sh", "-c", "echo 'error: cannot reach the run queue' >&2; exit 2", "agent"]


class Moment:
    """A clock the test moves."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def launching(stack, backend, clock=time.time):
    """The stack's ports, launching every pool's workers with ``backend``, reading ``clock``."""
    return make_ports(stack, clock, backend=lambda _pool: backend)


def queue_runs(stack, pool: str, n: int) -> None:
    for i in range(n):
        spec = RunSpec.model_validate({"command": f"echo {i}", "queue": pool})
        submit_run(stack.ports, Principal(user="alice"), spec, None)


@pytest.fixture
def pool(aws_stack) -> Pool:
    base = aws_stack.pools.get("default")
    return base.model_copy(update={"max_workers": 10, "min_workers": 0, "seconds_between_launches": 0})


@pytest.fixture
def backends(tmp_path):
    made = []

    def make(command=SLEEPER):
        backend = LocalCompute(tmp_path / "workers", command=command)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        for p in list((tmp_path / "workers").glob("*")):
            for job in backend.list(Pool(name=p.name, cpus=1, memory="1g", default_image="x")):
                backend.cancel(Pool(name=p.name, cpus=1, memory="1g", default_image="x"), job.id)


@pytest.mark.parametrize("stack_fixture", ["aws_dynalite_stack", "azure_stack"])
def test_concurrent_dispatchers_launch_the_backlog_once(stack_fixture, request, backends):
    """Eight dispatchers at once on one pool record: the AWS side on dynalite (moto's threaded
    server checks DynamoDB conditions without a lock, where DynamoDB serialises them), the Azure
    side on Azurite, whose ETag checks are atomic."""
    stack = request.getfixturevalue(stack_fixture)  # the dispatcher is cloud-agnostic: only the stores differ
    pool = stack.pools.get("default").model_copy(
        update={"max_workers": 10, "min_workers": 0, "seconds_between_launches": 0}
    )
    queue_runs(stack, pool.name, 3)
    start = threading.Barrier(8)
    decisions = []

    def dispatcher():
        ports = launching(stack, backends())
        start.wait()
        decisions.append(dispatch_pool(ports, pool))

    threads = [threading.Thread(target=dispatcher) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(decisions) == 8
    assert sum(d.launch for d in decisions) == 3, [d.reason for d in decisions]
    assert len(backends().list(pool)) == 3
    record = stack.pool_states.get(pool.name)
    assert record.launched == 3 and len(record.starting) == 3 and record.launching_since is None
    # a duplicate event later finds the three starting and launches nothing
    again = dispatch_pool(launching(stack, backends()), pool)
    assert (again.launch, again.reason) == (0, f"waiting for a worker: 3 starting in pool {pool.name}")


def test_a_stale_record_write_is_refused(aws_stack):
    states = aws_stack.pool_states
    fresh = states.get("default")
    assert fresh == PoolRecord(pool="default")
    stored = states.save(fresh.model_copy(update={"last_decision": "first"}))
    assert stored.version == 1 and states.get("default").last_decision == "first"
    with pytest.raises(ConditionFailed, match="pool default: record changed since version 0"):
        states.save(fresh.model_copy(update={"last_decision": "second"}))
    assert states.get("default").last_decision == "first"


def test_a_live_claim_keeps_other_dispatchers_off(aws_stack, pool, backends):
    queue_runs(aws_stack, pool.name, 2)
    now = time.time()
    aws_stack.pool_states.save(PoolRecord(pool=pool.name, launching_since=now - 5))
    at = Moment(now)
    ports = launching(aws_stack, backends(), at)
    decision = dispatch_pool(ports, pool)
    assert decision.launch == 0 and "another dispatcher is launching" in decision.reason
    # a claim older than CLAIM_SECONDS belongs to a dispatcher that died: it is taken over
    at.now = now + CLAIM_SECONDS
    assert dispatch_pool(ports, pool).launch == 2


def test_failed_launches_are_counted_and_disable_the_pool(aws_stack, pool, backends):
    pool = pool.model_copy(update={"max_failed_launches": 3, "retry_disabled_seconds": 600})
    queue_runs(aws_stack, pool.name, 2)
    backend = backends(BROKEN)
    t0 = time.time()
    at = Moment(t0)
    ports = launching(aws_stack, backend, at)
    assert dispatch_pool(ports, pool).launch == 2
    wait_for(lambda: backend.list(pool) == [], 30, 0.1, "the broken agents to exit")
    at.now = t0 + 1
    second = dispatch_pool(ports, pool)  # counts 2 failures, launches 2 again
    assert second.launch == 2
    record = aws_stack.pool_states.get(pool.name)
    assert record.failed_launches == 2 and record.disabled_reason is None
    assert record.last_error.endswith(
        "failed before its agent registered: agent exited with code 2: error: cannot reach the run queue"
    )
    wait_for(lambda: backend.list(pool) == [], 30, 0.1, "the broken agents to exit")
    at.now = t0 + 2
    third = dispatch_pool(ports, pool)
    assert third.launch == 0 and third.reason.startswith(f"pool {pool.name} is disabled (4 launches in a row failed")
    record = aws_stack.pool_states.get(pool.name)
    assert record.disabled_reason.startswith("4 launches in a row failed; last: job ")
    # what a user sees: the run's waiting reason and the pool's view
    from runplane.api.views import pool_view
    from runplane.domain.retention import Retention

    view = pool_view(pool, 2, {}, record, Retention()).model_dump(mode="json")
    assert view["disabled"] == record.disabled_reason
    assert view["launches"] == {
        "launched": 4,
        "failed": 4,
        "failed_in_a_row": 4,
        "last_launch_at": view["launches"]["last_launch_at"],
    }
    assert "cannot reach the run queue" in view["last_error"]
    assert explain_wait(pool, [], None, record).startswith(f"pool {pool.name} is disabled: 4 launches in a row failed")
    # after the retry period one trial worker is launched
    at.now = t0 + 2 + 600
    assert dispatch_pool(ports, pool).launch == 1


def test_a_job_whose_agent_never_registers_is_cancelled(aws_stack, pool, backends):
    pool = pool.model_copy(update={"start_timeout_seconds": 60})
    queue_runs(aws_stack, pool.name, 1)
    backend = backends(SLEEPER)  # starts and runs, but never registers
    t0 = time.time()
    at = Moment(t0)
    ports = launching(aws_stack, backend, at)
    assert dispatch_pool(ports, pool).launch == 1
    (job,) = backend.list(pool)
    at.now = t0 + 30
    assert dispatch_pool(ports, pool).launch == 0  # seen running: the timeout starts
    at.now = t0 + 90
    assert dispatch_pool(ports, pool).launch == 0  # 60 s: still within it
    assert [j.id for j in backend.list(pool)] == [job.id]
    at.now = t0 + 91
    decision = dispatch_pool(ports, pool)
    assert decision.launch == 1  # the stuck one is cancelled and replaced
    assert job.id not in {j.id for j in backend.list(pool)}
    record = aws_stack.pool_states.get(pool.name)
    assert record.last_error == (
        f"the agent of worker {job.worker_id} did not register within 60s of its job starting; job {job.id} cancelled"
    )


def test_a_pass_records_the_backlog_and_workers_it_counted_and_rewrites_them_only_when_needed(aws_stack, backends):
    """The pools view reads these figures instead of counting: a pass writes them when they
    changed, or once they are FIGURES_REFRESH_SECONDS old; a pass that saw the same writes nothing."""
    pool = aws_stack.pools.get("default").model_copy(update={"max_workers": 0, "min_workers": 0})
    queue_runs(aws_stack, pool.name, 3)
    now = time.time()
    at = Moment(now)
    ports = launching(aws_stack, backends(), at)
    aws_stack.workers.put(Worker(id="w-idle", pool=pool.name, started_at=now, heartbeat_at=now))
    aws_stack.workers.put(Worker(id="w-busy", pool=pool.name, status="busy", started_at=now, heartbeat_at=now))
    aws_stack.workers.put(Worker(id="w-gone", pool=pool.name, started_at=now - 999, heartbeat_at=now - 999))
    decision = dispatch_pool(ports, pool)
    first = aws_stack.pool_states.get(pool.name)
    assert (first.backlog, first.workers, first.counted_at) == (3, {"busy": 1, "idle": 1, "offline": 1}, now)
    assert decision.figures is not None and decision.figures.backlog == 3
    at.now = now + 1
    dispatch_pool(ports, pool)
    assert aws_stack.pool_states.get(pool.name).version == first.version  # nothing changed: no write
    queue_runs(aws_stack, pool.name, 1)
    at.now = now + 2
    dispatch_pool(ports, pool)
    second = aws_stack.pool_states.get(pool.name)
    assert (second.backlog, second.counted_at, second.version) == (4, now + 2, first.version + 1)
    at.now = now + 2 + FIGURES_REFRESH_SECONDS
    dispatch_pool(ports, pool)  # the same, but old: rewritten
    third = aws_stack.pool_states.get(pool.name)
    assert (third.backlog, third.counted_at) == (4, now + 2 + FIGURES_REFRESH_SECONDS)


def test_a_launch_that_loses_its_write_to_a_recount_looks_again_and_launches(aws_stack, pool, backends):
    """Another pass rewrote the record's figures between this pass's read and its launch claim:
    the claim fails, and this pass reads the record again and launches, instead of dropping the
    launch until the next event."""
    queue_runs(aws_stack, pool.name, 2)
    states = aws_stack.pool_states

    class RecountInBetween:
        raced = False

        def get(self, name):
            return states.get(name)

        def save(self, record):
            if not self.raced:  # the other pass's recount lands first
                self.raced = True
                states.save(states.get(record.pool).model_copy(update={"backlog": 99, "counted_at": time.time()}))
            return states.save(record)

    racy = RecountInBetween()
    backend = backends()
    decision = dispatch_pool(dataclasses.replace(launching(aws_stack, backend), pool_states=racy), pool)
    assert racy.raced and decision.launch == 2, decision.reason
    assert len(backend.list(pool)) == 2
    assert states.get(pool.name).backlog == 2  # and its own count replaced the other's
