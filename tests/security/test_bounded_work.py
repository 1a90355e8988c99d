"""One tenant's flood of waiting runs or sweeps cannot starve the dispatcher for everyone, on both
clouds' stores (moto, Azurite) through the dispatcher's own entrypoints (the Lambda handler, the
Azure functions), every call to the stores and queues counted by a wrapper around the real
adapters: a scheduled pass dispatches the pools first and spends at most its budget on waiting runs
and open sweeps, going on where it stopped, so that passes reach them all and another user's with
them; the end of a run that many runs wait for is told in bounded chunks, one event each; an event
met too late in a batch fails alone. A user's waiting runs and unfinished sweeps have a cap, counted
exactly (test_waiting_caps.py: the same through the API on both fronts).

The dispatcher's entrypoints here use the process's stack (``bootstrap.stack()``), which an
in-process local stack's schedule and event threads use too: this module runs in a process with no
local stack (``make test`` runs it apart from the engine's tests), and refuses to run beside one."""

import base64
import json
import sys
import threading
import time
import types
import uuid
from pathlib import Path

import azure.functions as func
import pytest
from azure.functions.timer import TimerRequest

from runplane import bootstrap
from runplane.compute.local.compute import LocalCompute
from runplane.devstack.lambda_shim import LambdaContext
from runplane.domain.errors import BackendError, InvalidRequest, NotFound, RunplaneError
from runplane.domain.messages import DispatchEvent
from runplane.domain.runs import RunSpec
from runplane.domain.states import RunState
from runplane.domain.sweeps import OPEN, PENDING, Sweep, SweepSpec
from runplane.domain.tenancy import Principal
from runplane.handlers import PoolDispatcher
from runplane.services import lifecycle, sweep_advance
from runplane.services.budget import Budget, metered
from runplane.services.runs import submit_run
from runplane.services.sweeps import create_sweep, kill_sweep, retry_sweep
from runplane.settings import StackSettings

EVENTS = Path(__file__).resolve().parents[1] / "events"
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
POOLS = """
pools:
  - {name: default, backend: local, cpus: 2, memory: 2g, max_workers: 3, default_image: img}
  - {name: parked, backend: local, cpus: 2, memory: 4g, max_workers: 0, default_image: img}
  - {name: capped, backend: local, cpus: 2, memory: 3g, max_workers: 0, default_image: img}
"""
PASS_CALLS = 100
"""RUNPLANE_SCHEDULE_CALLS here: what one pass may spend on waiting runs and sweeps."""
EVENT_CALLS = 150
"""RUNPLANE_EVENT_CALLS here: what one event may spend on what waits for a run."""
POOL_CALLS = 21
"""docs/scheduling.md: the most calls one pool's dispatch makes (4 a try, 3 tries, 9 to record a launch)."""
RESOLVE_CALLS = 12 + 97
"""docs/scheduling.md: the most one waiting run's resolve makes (what a pass may overrun its budget by)."""
FLOOD = 150
OPEN_FLOOD = 105
"""More than the 100 oldest unfinished sweeps a pass lists."""
ADVANCE_CALLS = 606
"""docs/scheduling.md: the most one try of a sweep's advance makes (what a pass may overrun by)."""
MALLORY, BOB = Principal(user="mallory"), Principal(user="bob")


class Counting:
    """A port whose every call is recorded as (port, method, first argument) before it is made."""

    def __init__(self, port, name, calls):
        self._port, self._name, self._calls = port, name, calls

    def __getattr__(self, attr):
        found = getattr(self._port, attr)
        if not callable(found):
            return found

        def call(*args, **kwargs):
            self._calls.append((self._name, attr, args[0] if args else None))
            return found(*args, **kwargs)

        return call


@pytest.fixture(params=["aws", "azure"])
def counted(request, monkeypatch, tmp_path):
    """The process-wide stack the dispatcher's entrypoints use, on a fresh moto or Azurite stack,
    with small budgets, sleeping processes for workers, and its stores and queues counted:
    (stack, calls)."""
    if any(thread.name == "schedule" for thread in threading.enumerate()):
        pytest.skip("an in-process local stack runs here: its schedule would act on this test's stack")
    base = request.getfixturevalue(f"{request.param}_stack").settings
    settings = StackSettings(
        cloud=base.cloud,
        prefix=base.prefix,
        pools=POOLS,
        schedule_calls=PASS_CALLS,
        event_calls=EVENT_CALLS,
        azure_storage_connection_string=base.azure_storage_connection_string,
        aws_endpoint_url=base.aws_endpoint_url,
    )
    stack = bootstrap.build_stack(settings)
    before = bootstrap.use(stack)
    backend = LocalCompute(tmp_path / "workers", command=SLEEPER)
    stack.backends["local"] = backend
    calls = []
    for name in ("store", "sweeps", "queue", "quotas", "workers", "pool_states", "tokens"):
        setattr(stack, name, Counting(getattr(stack, name), name, calls))
    yield stack, calls
    pool = stack.pools.get("default")
    for job in backend.list(pool):
        backend.cancel(pool, job.id)
    bootstrap.use(before)


def scheduled_pass(stack):
    """One run of the dispatcher's schedule, as the cloud's host starts it."""
    if stack.settings.cloud == "aws":
        from functions.aws import dispatcher

        dispatcher.lambda_handler(json.loads((EVENTS / "schedule.json").read_text()), LambdaContext())
    else:
        from functions.azure import dispatcher

        dispatcher.dispatcher_schedule.build().get_user_function()(TimerRequest())


def deliver(stack, event):
    """One dispatcher event, as the cloud's host hands it over; returns what the AWS handler
    reports failed."""
    body = event.model_dump_json()
    if stack.settings.cloud == "aws":
        from functions.aws import dispatcher

        template = json.loads((EVENTS / "sqs_dispatch.json").read_text())["Records"][0]
        got = dispatcher.lambda_handler({"Records": [{**template, "messageId": "m-0", "body": body}]}, LambdaContext())
        return got["batchItemFailures"]
    from functions.azure import dispatcher

    dispatcher.dispatcher_events.build().get_user_function()(func.QueueMessage(id="m-0", body=body.encode()))
    return []


def sent_events(stack):
    """The dispatcher events waiting on the events queue (read off it, past the counting)."""
    queue = stack.queue._port
    found = []
    if stack.settings.cloud == "aws":
        from runplane.adapters.aws.sqs import events_queue_name

        url = queue._url(events_queue_name(stack.settings.prefix))
        while got := queue.client.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
            found += [DispatchEvent.model_validate_json(m["Body"]) for m in got]
            for m in got:
                queue.client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        return found
    from runplane.adapters.azure.queues import events_queue_name

    client = queue.client.get_queue_client(events_queue_name(stack.settings.prefix))
    while got := list(client.receive_messages(max_messages=32)):
        found += [DispatchEvent.model_validate_json(base64.b64decode(m.content)) for m in got]
        for m in got:
            client.delete_message(m)
    return found


def waiting_flood(stack, count):
    """An upstream run of mallory's that never starts, and ``count`` runs of hers waiting for it,
    stored directly (what ``count`` submits would store)."""
    up = submit_run(stack.ports, MALLORY, RunSpec(command="x", queue="parked"), None).run
    first = submit_run(stack.ports, MALLORY, RunSpec(command="x", queue="parked", after=[up.id]), None).run
    assert first.waiting_on == [up.id]
    flood = [first]
    for i in range(1, count):
        run = first.model_copy(update={"id": f"r-{uuid.uuid4().hex[:24]}", "created_at": first.created_at + i})
        flood.append(stack.store.create(run))
    return up, flood


def upstream_ended(stack, count):
    """``waiting_flood``'s upstream, followed by its ``count`` runs, run to success by a worker; the
    queue emptied of what came before (the submits' nudges): (upstream, flood)."""
    up, flood = waiting_flood(stack, count)
    for run in flood:
        stack.store.follow(up.id, run.id)
    held = lifecycle.claim(stack.store, stack.store.get(up.id), 0, "w1", 60.0, time.time())
    held = lifecycle.advance(stack.store, held, RunState.RUNNING, time.time(), "started")
    held = lifecycle.advance(stack.store, held, RunState.UPLOADING, time.time(), "uploading", exit_code=0)
    lifecycle.advance(stack.store, held, RunState.SUCCEEDED, time.time(), "done")
    sent_events(stack)
    return up, flood


def test_a_flood_of_waiting_runs_leaves_every_pass_bounded_and_other_pools_dispatched(counted):
    stack, calls = counted
    _, flood = waiting_flood(stack, FLOOD)
    bobs = submit_run(stack.ports, BOB, RunSpec(command="x"), None).run
    assert bobs.queue == "default"
    bound = PASS_CALLS + RESOLVE_CALLS + POOL_CALLS * len(stack.pools.pools) + 2  # + the pass's own record
    looked: set[str] = set()
    passes = []
    for _ in range(12):
        calls.clear()
        scheduled_pass(stack)
        passes.append(len(calls))
        assert len(calls) <= bound, f"a pass made {len(calls)} calls; at most {bound}"
        looked |= {arg for port, method, arg in calls if (port, method) == ("store", "get")}
        if len(passes) == 1:  # bob's run got its worker in the very first pass, mallory's flood or not
            default = stack.pools.get("default")
            assert len(stack.backend(default).list(default)) == 1
        if {r.id for r in flood} <= looked:
            break
    print(f"calls per pass over {FLOOD} waiting runs: {passes}")
    missed = {r.id for r in flood} - looked
    assert not missed, f"{len(missed)} waiting runs never looked at in {len(passes)} passes of {passes} calls"
    assert len(passes) > 1, "one pass looked at the whole flood: no bound was kept"


def test_the_end_of_a_run_many_runs_wait_for_is_told_in_bounded_chunks(counted):
    stack, calls = counted
    up, flood = upstream_ended(stack, 40)
    event = DispatchEvent(pool="parked", reason="run ended", upstream=up.id)
    chunks = []
    for _ in range(10):
        calls.clear()
        assert deliver(stack, event) == []
        chunks.append(len(calls))
        assert len(calls) <= EVENT_CALLS + RESOLVE_CALLS + POOL_CALLS, chunks
        released = [r for r in flood if not stack.store.get(r.id).waiting_on]
        more = [e for e in sent_events(stack) if e.upstream == up.id]
        if not more:
            break
        assert len(more) == 1 and more[0].skip == len(released), (more, len(released))
        event = more[0]
    print(f"calls per event telling {len(flood)} runs that waited: {chunks}")
    assert len(chunks) > 1, f"one event told all {len(flood)} runs that waited ({chunks[0]} calls)"
    assert all(stack.store.get(r.id).waiting_on == [] for r in flood), "a run that waited was never told"


class Running(LambdaContext):
    """An invocation whose time left is read off a list, one value a look."""

    def __init__(self, left_ms):
        super().__init__()
        self.left_ms = list(left_ms)

    def get_remaining_time_in_millis(self):
        return self.left_ms.pop(0) if len(self.left_ms) > 1 else self.left_ms[0]


def test_a_flood_of_open_sweeps_leaves_every_pass_bounded_and_another_users_sweep_moved_on(counted):
    stack, calls = counted
    up, _ = waiting_flood(stack, 1)
    template = SweepSpec(run=RunSpec(command="x", queue="parked", after=[up.id]), count=3)
    for i in range(OPEN_FLOOD):  # older than bob's, each waiting for a run that never starts
        stack.sweeps.create(
            Sweep(
                id=f"s-{uuid.uuid4().hex[:24]}",
                owner="mallory",
                spec=template,
                queue="parked",
                created_at=time.time() - 1000 + i,
                status=PENDING * 3,
                waiting_on=[up.id],
            )
        )
    bobs = create_sweep(stack.ports, BOB, SweepSpec(run=RunSpec(command="x", queue="parked")), None).sweep
    member = stack.store.get(bobs.member_id(0))
    held = lifecycle.claim(stack.store, member, 0, "w1", 60.0, time.time())
    held = lifecycle.advance(stack.store, held, RunState.RUNNING, time.time(), "started")
    held = lifecycle.advance(stack.store, held, RunState.UPLOADING, time.time(), "uploading", exit_code=0)
    lifecycle.advance(stack.store, held, RunState.SUCCEEDED, time.time(), "done")  # its event was lost
    bound = PASS_CALLS + ADVANCE_CALLS + POOL_CALLS * len(stack.pools.pools) + 2
    passes = []
    for _ in range(12):
        calls.clear()
        scheduled_pass(stack)
        passes.append(len(calls))
        assert len(calls) <= bound, f"a pass made {len(calls)} calls; at most {bound}"
        if stack.sweeps.get(bobs.id).finished_at is not None:
            break
    print(f"calls per pass over {OPEN_FLOOD} open sweeps of another user: {passes}")
    assert stack.sweeps.get(bobs.id).finished_at is not None, f"bob's sweep never moved on in {passes}"
    assert len(passes) > 1, "one pass moved every sweep on: no bound was kept"


# an Azure queue message is an invocation of its own (batchSize 1 in host.json): there is no batch
@pytest.mark.parametrize("counted", ["aws"], indirect=True)
def test_an_event_met_too_late_in_a_batch_fails_alone_and_the_others_are_done(counted):
    stack, _ = counted
    from functions.aws import dispatcher

    submit_run(stack.ports, BOB, RunSpec(command="x"), None)
    template = json.loads((EVENTS / "sqs_dispatch.json").read_text())["Records"][0]
    body = DispatchEvent(pool="default").model_dump_json()
    batch = {"Records": [{**template, "messageId": f"m-{i}", "body": body} for i in range(2)]}
    # the first record is met with a minute left, the second with 5 s: too late to start it
    got = dispatcher.lambda_handler(batch, Running([60_000, 5_000]))
    assert got == {"batchItemFailures": [{"itemIdentifier": "m-1"}]}
    default = stack.pools.get("default")
    assert len(stack.backend(default).list(default)) == 1  # the first was done


@pytest.fixture(params=["aws", "azure"])
def stores(request):
    """A fresh stack on moto's or Azurite's stores, nothing counted."""
    return request.getfixturevalue(f"{request.param}_stack")


def test_the_waiting_cap_counts_waiting_runs_however_many_plain_runs_are_newer(stores):
    stack = stores

    def submit(**more):
        spec = RunSpec(command="x", queue="capped", **more)
        return submit_run(stack.ports, MALLORY, spec, None).run

    up = submit()
    assert [submit(after=[up.id]).waiting_on for _ in range(2)] == [[up.id]] * 2  # the cap: 2
    for _ in range(3):  # newer than the waiting ones: a count of the newest queued runs sees none waiting
        submit()
    with pytest.raises(InvalidRequest, match="at most 2 may wait"):
        submit(after=[up.id])
    assert len(stack.store.waiting("capped").runs) == 2


def test_a_retry_that_opens_a_finished_sweep_again_counts_against_the_open_cap(stores):
    ports = stores.ports
    spec = SweepSpec(run=RunSpec(command="x", queue="capped"), count=2, max_parallel=1)
    first = create_sweep(ports, MALLORY, spec, None).sweep
    kill_sweep(ports, MALLORY, first.id)
    second = create_sweep(ports, MALLORY, spec, None).sweep  # the cap (1) allows it: the first ended
    kill_sweep(ports, MALLORY, second.id)
    assert retry_sweep(ports, MALLORY, first.id)[1] == 2  # open again: 1 open, the cap
    with pytest.raises(InvalidRequest, match="at most 1 may be open"):
        retry_sweep(ports, MALLORY, second.id)
    assert stores.sweeps.get(second.id).finished_at is not None


class FailingPool:
    """The pool-state store, failing every read and write of one pool's record."""

    def __init__(self, port, pool):
        self._port, self._pool = port, pool

    def __getattr__(self, attr):
        return getattr(self._port, attr)

    def get(self, pool):
        if pool == self._pool:
            raise BackendError(f"read pool record {pool} failed")
        return self._port.get(pool)

    def save(self, record):
        if record.pool == self._pool:
            raise BackendError(f"write pool record {record.pool} failed")
        return self._port.save(record)


def test_a_continuation_is_sent_once_when_the_pools_dispatch_fails_after_it(counted):
    stack, _ = counted
    up, flood = upstream_ended(stack, 40)
    stack.pool_states = FailingPool(stack.pool_states, "parked")
    record = types.SimpleNamespace(
        body=DispatchEvent(pool="parked", reason="run ended", upstream=up.id).model_dump_json()
    )
    tries = 0
    while tries < 3:  # the host delivers a record again while handling it fails
        tries += 1
        try:
            PoolDispatcher(stack.ports).record_handler()(record)
            break
        except RunplaneError:
            continue
    more = [e for e in sent_events(stack) if e.upstream == up.id]
    assert (tries, len(more)) == (1, 1), f"{len(more)} continuations after {tries} tries"
    assert 0 < more[0].skip < len(flood)


def test_a_killed_sweeps_members_out_with_no_run_are_ended_within_the_budget(stores):
    stack = stores
    size = 60
    killed = Sweep(
        id=f"s-{uuid.uuid4().hex[:24]}",
        owner="mallory",
        spec=SweepSpec(run=RunSpec(command="x", queue="parked"), count=size),
        queue="parked",
        created_at=time.time(),
        status=OPEN * size,  # released by writes whose runs were never made
        killed=True,
    )
    stack.sweeps.create(killed)
    allowed = 80  # its look (about 64 calls here), then a few of its members
    ended = []
    for _ in range(20):
        budget = Budget(allowed)
        sweep_advance.advance(metered(stack.ports, budget), killed.id, None, budget)
        assert budget.used <= allowed + sweep_advance.BURY_CALLS, (
            f"an advance made {budget.used} calls; at most {allowed}"
        )
        ended.append(sum(1 for i in range(size) if _exists(stack.store, killed.member_id(i))))
        if stack.sweeps.get(killed.id).finished_at is not None:
            break
    assert len(ended) > 1 and ended[0] < size, f"members ended per advance: {ended}"
    assert stack.sweeps.get(killed.id).finished_at is not None, f"the killed sweep never ended: {ended}"
    assert all(stack.store.get(killed.member_id(i)).state == RunState.KILLED for i in range(size))


def _exists(store, run_id):
    try:
        store.get(run_id)
    except NotFound:
        return False
    return True


def test_the_schedules_visits_of_a_big_sweep_read_a_new_window_of_its_members_each_round(counted):
    stack, calls = counted
    stack.clock = lambda: 6_000_000.0  # one minute throughout: a window moved by the period stays put
    size = 150  # more open members than one advance reads (100)
    big = Sweep(
        id=f"s-{uuid.uuid4().hex[:24]}",
        owner="mallory",
        spec=SweepSpec(run=RunSpec(command="x", queue="parked"), count=size),
        queue="parked",
        created_at=time.time(),
        status=OPEN * size,
    )
    stack.sweeps.create(big)
    members = {big.member_id(i) for i in range(size)}
    for i in range(size):
        stack.store.create(sweep_advance.member_run(big, i, time.time()))
    read = []
    for _ in range(2):  # the only unfinished sweep: each pass is a round of its own
        calls.clear()
        scheduled_pass(stack)
        read.append({arg for port, method, arg in calls if port == "store" and method == "get" and arg in members})
    assert [len(r) for r in read] == [100, 100]
    assert read[0] | read[1] == members, f"{len(members - read[0] - read[1])} open members never read"
