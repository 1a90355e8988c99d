"""The retention sweep (runplane/services/retention.py) on every store, with a clock the test moves:
a pool's finished runs lose their outputs (and checkpoints), then their logs, then every object and their record, each
at its date; a run its owner keeps loses nothing until let go; a pool with no retention keeps all; a
retried run is dated from its last end; an upload not used for the stack's ``uploads`` retention goes
while one a submit named (and so touched) stays. The budget of a pass: bounded runs and objects, the
rest at the next pass."""

import base64
import dataclasses
import hashlib
import time

import pytest

from runplane.adapters.azure import run_rows
from runplane.api.views import retention_view
from runplane.bootstrap import make_ports
from runplane.domain.errors import BackendError, NotFound
from runplane.domain.expect import Expect
from runplane.domain.pools import PoolConfig
from runplane.domain.retention import Retention, RunRetention, purge_due
from runplane.domain.runs import Event, Run, RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.domain.tenancy import Principal
from runplane.domain.uploads import upload_key
from runplane.handlers import run_reaper
from runplane.services import lifecycle, uploads
from runplane.services.retention import keep, shown, sweep

STACKS = {"aws-moto": "aws_stack", "azure-azurite": "azure_stack", "local-sqlite": "local_stack"}
DAY = 86400.0
T0 = 1_000_000.0  # when the runs end
ALICE = Principal(user="alice", scopes=["runs:read", "runs:write"])
MALLORY = Principal(user="mallory", scopes=["runs:read", "runs:write"])
KINDS = ("outputs/1/model.bin", "outputs/2/live/metrics.json", "logs/1/stdout/0000", "logs/2/stderr/0000")


@pytest.fixture(params=list(STACKS))
def stack(request):
    return request.getfixturevalue(STACKS[request.param])


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def ports_of(stack, clock, pools=None, stack_retention=""):
    """The stack's ports read by ``clock``, with ``pools`` (name -> retention) set on its pools."""
    ports = make_ports(stack, clock)
    changed = [
        p.model_copy(update={"retention": Retention.model_validate(pools[p.name])}) if p.name in (pools or {}) else p
        for p in stack.pools.pools
    ]
    settings = stack.settings.model_copy(update={"retention": stack_retention})
    return dataclasses.replace(ports, pools=PoolConfig(pools=changed), settings=settings)


def finished(stack, name, queue="default", at=T0, kept=False):
    run = stack.store.create(
        Run(
            id=f"r-{name}",
            owner="alice",
            queue=queue,
            spec=RunSpec(command="true"),
            created_at=at - 100,
            events=[Event(at=at - 100, state=RunState.QUEUED, message="submitted")],
        )
    )
    run = stack.store.update(run, Expect(), {"state": RunState.RUNNING, "attempt": 2, "worker_id": "w1"})
    run = stack.store.update(run, Expect(), {"state": RunState.SUCCEEDED, "finished_at": at, "kept": kept})
    for kind in KINDS:
        stack.objects.put_bytes(f"runs/{run.id}/{kind}", b"x")
    stack.objects.put_bytes(f"runs/{run.id}/manifest.json", b"{}")
    return run


def keys(stack, run):
    return sorted(o.key.removeprefix(f"runs/{run.id}/") for o in stack.objects.list(f"runs/{run.id}/"))


CHECKPOINTS = ["checkpoints/00000001/manifest.json", f"checkpoints/blobs/{'0' * 64}"]
ALL = sorted([*KINDS, "manifest.json"])
LOGS_AND_REST = sorted([KINDS[2], KINDS[3], "manifest.json"])


def test_outputs_logs_and_record_go_each_at_its_date_and_a_kept_run_stays(stack):
    clock = Clock(T0 + 1 * DAY)
    ports = ports_of(stack, clock, pools={"default": {"outputs": "2d", "logs": "3d", "runs": "10d"}})
    gone, kept, other = finished(stack, "gone"), finished(stack, "kept", kept=True), finished(stack, "other", "parked")
    stack.objects.put_bytes(f"runs/{gone.id}x/outputs/1/f", b"neighbour")  # a run id with the same start
    for key in CHECKPOINTS:  # its checkpoints go with its outputs, not with its record
        stack.objects.put_bytes(f"runs/{gone.id}/{key}", b"x")

    shown_before = shown(ports, gone)  # what a view shows before the sweep looks: the settings' dates
    assert (shown_before.outputs_at, shown_before.record_at) == (T0 + 2 * DAY, T0 + 10 * DAY)
    assert shown(ports, other).record_at is None and shown(ports, other).outputs_at is None

    report = sweep(ports)  # day 1: dated, nothing deleted
    assert report.dated == [gone.id] and report.objects == 0
    dated = stack.store.get(gone.id).retention
    assert (dated.outputs_at, dated.logs_at, dated.record_at) == (T0 + 2 * DAY, T0 + 3 * DAY, T0 + 10 * DAY)
    assert shown(ports, stack.store.get(gone.id)) == dated
    assert keys(stack, gone) == sorted([*ALL, *CHECKPOINTS])

    clock.now = T0 + 2 * DAY  # the reaper's pass runs the sweep after reaping
    assert run_reaper(ports).retention.outputs == [gone.id]
    assert keys(stack, gone) == LOGS_AND_REST
    assert stack.store.get(gone.id).retention.deleted == ["outputs"]

    clock.now = T0 + 3 * DAY
    assert sweep(ports).logs == [gone.id]
    assert keys(stack, gone) == ["manifest.json"]
    assert stack.store.get(gone.id).retention.deleted == ["outputs", "logs"]

    clock.now = T0 + 10 * DAY
    report = sweep(ports)
    assert report.records == [gone.id] and report.objects == 1
    assert keys(stack, gone) == []
    with pytest.raises(NotFound):
        stack.store.get(gone.id)
    assert gone.id not in [r.id for r in stack.store.list(owner="alice", limit=50).runs]
    assert stack.objects.get_bytes(f"runs/{gone.id}x/outputs/1/f") == b"neighbour"
    # the kept run and the run of a pool without retention lose nothing, and are not even dated
    for run in (kept, other):
        assert keys(stack, run) == ALL and stack.store.get(run.id).retention is None

    with pytest.raises(NotFound):  # another user's run reads as missing
        keep(ports, MALLORY, kept.id, False)
    assert stack.store.get(kept.id).kept
    assert not keep(ports, ALICE, kept.id, False).kept  # let go: the next pass sweeps it whole
    report = sweep(ports)
    assert report.records == [kept.id] and report.dated == [kept.id]
    assert keys(stack, kept) == []
    assert keys(stack, other) == ALL


def test_a_retried_run_is_dated_from_its_last_end(stack):
    clock = Clock(T0)
    ports = ports_of(stack, clock, pools={"default": {"outputs": "2d"}})
    run = stack.store.create(
        Run(id="r-again", owner="alice", queue="default", spec=RunSpec(command="true"), created_at=T0, max_attempts=2)
    )
    run = lifecycle.claim(stack.store, run, run.attempt, "w1", 60.0, T0)
    # a stale date on the held run (as a record of another writer might carry) goes with the retry
    run = stack.store.update(run, Expect(), {"retention": RunRetention(checked_at=T0, outputs_at=T0)})
    run = lifecycle.retry(ports, run, FailureReason.NONZERO_EXIT, "exit 1", "retried", T0)
    assert run.state == RunState.QUEUED and run.retention is None
    run = lifecycle.claim(stack.store, run, run.attempt, "w2", 60.0, T0 + 5 * DAY)
    for state in (RunState.RUNNING, RunState.UPLOADING, RunState.SUCCEEDED):
        run = lifecycle.advance(stack.store, run, state, T0 + 5 * DAY, str(state))
    stack.objects.put_bytes(f"runs/{run.id}/outputs/2/f", b"x")

    clock.now = T0 + 6 * DAY  # 2 days after the first attempt, but 1 after the run's end
    assert sweep(ports).dated == [run.id]
    assert stack.store.get(run.id).retention.outputs_at == T0 + 7 * DAY
    assert [o.key for o in stack.objects.list(f"runs/{run.id}/")] == [f"runs/{run.id}/outputs/2/f"]
    clock.now = T0 + 7 * DAY
    assert sweep(ports).outputs == [run.id]
    assert stack.objects.list(f"runs/{run.id}/") == []
    assert purge_due(stack.store.get(run.id)) is None  # kept for good otherwise: out of the index
    assert stack.store.due("default", clock.now + 1000 * DAY) == []  # and never rewritten again


def test_an_upload_unused_past_its_retention_goes_and_one_a_submit_named_stays(stack):
    named, unused = upload_key("alice", "a" * 64), upload_key("alice", "b" * 64)
    stack.objects.put_bytes(unused, b"old")
    stack.objects.put_bytes(named, b"used")
    stack.objects.put_bytes("runs/r-x/outputs/1/f", b"not an upload")
    written = stack.objects.head(named).modified
    time.sleep(1.1)  # stores keep whole seconds
    clock = Clock(time.time() + 2 * DAY)  # a submit two days on names the upload: it is marked used
    ports = ports_of(stack, clock, stack_retention='{"uploads": "1h"}')
    uploads.check_run(ports, ALICE, RunSpec(command="true", inputs={"code": "upload:" + "a" * 64}))
    touched = stack.objects.head(named).modified
    assert touched > written

    clock.now = (written + touched) / 2 + 3600  # an hour after a time between the two
    assert sweep(ports, uploads=1).uploads == 0  # one upload a pass: the one in use, first in key order
    assert sweep(ports, uploads=1).uploads == 1  # the next pass goes on after it
    assert stack.objects.head(unused) is None
    assert stack.objects.get_bytes(named) == b"used"
    assert stack.objects.get_bytes("runs/r-x/outputs/1/f") == b"not an upload"


def test_a_pass_does_bounded_work_and_the_next_goes_on(local_stack):
    stack = local_stack
    clock = Clock(T0 + DAY)
    ports = ports_of(stack, clock, pools={"default": {"runs": "1d"}})
    runs = [finished(stack, f"b{i}", at=T0 + i) for i in range(3)]
    clock.now = T0 + DAY + 10

    assert not sweep(ports, out_of_time=lambda: True)  # a host's invocation nearly over: nothing begun
    report = sweep(ports, runs=2, objects=7)  # 5 objects each: the second run's are not all gone
    assert report.records == [runs[0].id] and report.objects == 7
    assert len(keys(stack, runs[1])) == 3 and keys(stack, runs[2]) == ALL
    report = sweep(ports, runs=2, objects=100)
    assert sorted(report.records) == [runs[1].id, runs[2].id]
    assert stack.store.due("default", clock.now + 100 * DAY) == []


class FailingFor:
    """The real store, but reading one run fails as a store's outage would."""

    def __init__(self, store, run_id):
        self.store, self.run_id = store, run_id

    def get(self, run_id):
        if run_id == self.run_id:
            raise BackendError("the store is down")
        return self.store.get(run_id)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_an_error_on_one_run_leaves_the_others_and_the_reapers_report(local_stack):
    stack = local_stack
    clock = Clock(T0 + 2 * DAY)
    runs = [finished(stack, f"e{i}", at=T0 + i) for i in range(2)]
    ports = ports_of(stack, clock, pools={"default": {"runs": "1d"}})
    report = sweep(dataclasses.replace(ports, store=FailingFor(stack.store, runs[0].id)))
    assert report.failed == [runs[0].id] and report.records == [runs[1].id]
    assert keys(stack, runs[0]) == ALL  # due still: the next pass takes it
    assert [r.id for r in stack.store.due("default", clock.now)] == [runs[0].id]

    broken = dataclasses.replace(ports, settings=ports.settings.model_copy(update={"retention": "{not json"}))
    report = run_reaper(broken)  # the sweep fails whole; the reaper's own report still comes back
    assert report.retention is None and keys(stack, runs[0]) == ALL


def _unindex(stack, request, run):
    """Take ``run`` out of its store's purge index, as a run that ended under an earlier release is."""
    kind = request.node.callspec.params["stack"]
    if kind == "local-sqlite":
        with stack.store.db.write() as c:
            c.execute("DELETE FROM run_purges WHERE run_id = ?", (run.id,))
    elif kind == "aws-moto":
        stack.store.client.update_item(
            TableName=stack.store.table, Key={"id": {"S": run.id}}, UpdateExpression="REMOVE pq, pd"
        )
    else:
        stack.store.table.delete_entity(run_rows.partition(run.queue), run_rows.purge_key(run))
    assert run.id not in [r.id for r in stack.store.due(run.queue, 1e12)]


def test_runs_that_ended_before_the_index_are_dated_and_then_swept(stack, request):
    clock = Clock(T0 + 20 * DAY)
    ports = ports_of(stack, clock, pools={"default": {"outputs": "2d", "runs": "10d"}})
    old = finished(stack, "old")
    _unindex(stack, request, old)
    report = sweep(ports, backfill=10)  # a few runs read a pass: found, dated, and so filed in the index
    assert report.dated == [old.id] and report.records == []
    assert stack.store.get(old.id).retention.record_at == T0 + 10 * DAY
    assert [r.id for r in stack.store.due("default", clock.now)] == [old.id]
    report = sweep(ports)
    assert report.records == [old.id] and keys(stack, old) == []
    assert sweep(ports).dated == []  # every earlier run is dated: nothing more is read


def _agents(stack, pool, versions):
    """Record ``pool``'s live agents by version, as a dispatcher's count does."""
    record = stack.pool_states.get(pool)
    stack.pool_states.save(record.model_copy(update={"agent_versions": versions}))


def test_runs_ended_by_agents_before_the_index_are_found_while_they_serve_and_once_after(stack, request):
    clock = Clock(T0 + 20 * DAY)
    ports = ports_of(stack, clock, pools={"default": {"runs": "10d"}})
    _agents(stack, "default", {"0.2.1": 1, "0.3.0": 2})
    assert sweep(ports).dated == []  # every ended run read: over again while a 0.2 agent serves
    late = finished(stack, "late")  # ended by that agent: filed in no index
    _unindex(stack, request, late)
    assert sweep(ports).dated == [late.id]
    assert [r.id for r in stack.store.due("default", clock.now)] == [late.id]

    _agents(stack, "default", {"0.3.0": 2})  # the last one left, just after ending a run
    later = finished(stack, "later")
    _unindex(stack, request, later)
    assert sweep(ports).dated == [later.id]  # the round it was in
    last = finished(stack, "last")
    _unindex(stack, request, last)
    assert sweep(ports).dated == [last.id]  # one more round after it left
    after = finished(stack, "after")
    _unindex(stack, request, after)
    assert sweep(ports).dated == []  # then done: nothing more is read
    assert stack.store.get(after.id).retention is None


def _raw_ttl(stack, request, run_id):
    if request.node.callspec.params["stack"] != "aws-moto":
        return None
    item = stack.store.client.get_item(TableName=stack.store.table, Key={"id": {"S": run_id}})["Item"]
    return item.get("ttl")


def test_a_changed_retention_dates_ended_runs_afresh_and_keeping_all_takes_them_out(stack, request):
    clock = Clock(T0 + DAY)
    run = finished(stack, "redate")
    ports = ports_of(stack, clock, pools={"default": {"outputs": "2d", "runs": "10d"}})
    assert sweep(ports).dated == [run.id]
    assert stack.store.get(run.id).retention.record_at == T0 + 10 * DAY
    assert stack.store.due("default", 1e12) != []

    forever = {"outputs": "forever", "logs": "forever", "runs": "forever"}
    assert sweep(ports_of(stack, clock, pools={"default": forever})).dated == [run.id]
    dated = stack.store.get(run.id).retention
    assert (dated.outputs_at, dated.record_at) == (None, None)
    assert stack.store.due("default", 1e12) == [] and _raw_ttl(stack, request, run.id) is None  # no expiry left
    assert sweep(ports_of(stack, clock, pools={"default": forever})).dated == []

    clock.now = T0 + 2 * DAY
    shorter = ports_of(stack, clock, pools={"default": {"outputs": "1d", "runs": "5d"}})
    assert sweep(shorter).dated == [run.id]  # back in the index, dated by the new settings
    assert stack.store.get(run.id).retention.record_at == T0 + 5 * DAY
    assert sweep(shorter).outputs == [run.id]
    longer = ports_of(stack, clock, pools={"default": {"outputs": "1d", "runs": "20d"}})
    assert sweep(longer).dated == [run.id]
    dated = stack.store.get(run.id).retention
    assert (dated.record_at, dated.deleted) == (T0 + 20 * DAY, ["outputs"])  # what went stays said


class PinnedMidway:
    """The real object store, answering pages of two objects, whose first delete is followed by the
    owner pinning the run (as a ``keep`` arriving while the sweep deletes it)."""

    def __init__(self, objects, pin):
        self.objects, self.pin, self.deletes = objects, pin, 0

    def list_page(self, prefix, cursor, limit):
        return self.objects.list_page(prefix, cursor, min(limit, 2))

    def delete(self, keys):
        self.objects.delete(keys)
        self.deletes += 1
        if self.deletes == 1:
            self.pin()

    def __getattr__(self, name):
        return getattr(self.objects, name)


def test_a_pin_during_a_purge_stops_it_and_the_record_says_what_went(local_stack):
    stack = local_stack
    clock = Clock(T0 + 11 * DAY)
    run = finished(stack, "pinned")
    ports = ports_of(stack, clock, pools={"default": {"runs": "10d"}})
    objects = PinnedMidway(stack.objects, lambda: keep(ports, ALICE, run.id, True))
    report = sweep(dataclasses.replace(ports, objects=objects))
    assert report.records == [] and report.objects == 2  # the first page (its logs), then it was pinned
    assert keys(stack, run) == ["manifest.json", KINDS[0], KINDS[1]]
    kept = stack.store.get(run.id)
    assert kept.kept and kept.retention.deleted == ["logs"]

    # the pin arrives once every object is gone: the record stays, saying its outputs and logs went
    other = finished(stack, "pinned-late")
    objects = PinnedMidway(stack.objects, lambda: None)
    objects.delete = lambda keys: (stack.objects.delete(keys), keep(ports, ALICE, other.id, True))
    objects.list_page = stack.objects.list_page
    assert sweep(dataclasses.replace(ports, objects=objects)).records == []
    assert keys(stack, other) == []
    assert sorted(stack.store.get(other.id).retention.deleted) == ["logs", "outputs"]


def test_time_is_checked_a_page_at_a_time_and_the_uploads_cursor_kept_each_page(local_stack):
    stack = local_stack
    for sha in "abc":
        stack.objects.put_bytes(upload_key("alice", sha * 64), b"old")
    run = finished(stack, "slow")
    clock = Clock(time.time() + 20 * DAY)
    ports = ports_of(stack, clock, pools={"default": {"runs": "10d"}}, stack_retention='{"uploads": "1d"}')
    left = [100.0]
    objects = PinnedMidway(stack.objects, lambda: left.__setitem__(0, 5.0))  # time runs out with the first delete
    report = sweep(dataclasses.replace(ports, objects=objects), out_of_time=lambda: left[0] < 15)
    assert report.objects == 2 and report.uploads == 0 and len(keys(stack, run)) == 3

    only_uploads = ports_of(stack, clock, stack_retention='{"uploads": "1d"}')

    class OneByOne(PinnedMidway):
        def list_page(self, prefix, cursor, limit):
            self.pages = getattr(self, "pages", 0) + 1
            if self.pages > 1 and self.fail:
                raise BackendError("the store is down")
            return self.objects.list_page(prefix, cursor, 1)

    left[0] = 100.0
    objects = OneByOne(stack.objects, lambda: left.__setitem__(0, 5.0))
    objects.fail = False
    assert sweep(dataclasses.replace(only_uploads, objects=objects), out_of_time=lambda: left[0] < 15).uploads == 1
    first = stack.pool_states.get("@retention").resume.get("uploads")
    assert first  # where it stopped is kept
    objects = OneByOne(stack.objects, lambda: None)
    objects.fail = True
    assert sweep(dataclasses.replace(only_uploads, objects=objects)).uploads == 1  # then the store fails
    assert stack.pool_states.get("@retention").resume.get("uploads") not in (None, first)  # the page done is kept
    assert sweep(only_uploads).uploads == 1
    assert stack.objects.list("uploads/") == []


def test_each_pass_another_pool_goes_first(local_stack):
    stack = local_stack
    clock = Clock(T0 + 11 * DAY)
    names = [p.name for p in stack.pools.pools][:2]
    ports = ports_of(stack, clock, pools={name: {"runs": "10d"} for name in names})
    runs = [finished(stack, f"turn{i}", queue=name) for i, name in enumerate(names)]
    clock.now = (clock.now // 120) * 120  # a minute whose turn is the first pool's
    assert sweep(ports, runs=1).records == [runs[0].id]
    runs[0] = finished(stack, "turn0b", queue=names[0])
    clock.now += 60
    assert sweep(ports, runs=1).records == [runs[1].id]


def test_a_damaged_record_of_the_sweep_reads_as_empty(aws_stack):
    stack = aws_stack
    stack.pool_states.client.put_item(
        TableName=stack.pool_states.table,
        Item={"pool": {"S": "@retention"}, "version": {"N": "3"}, "doc": {"S": '{"pool": 7'}},
    )
    stack.objects.put_bytes(upload_key("alice", "d" * 64), b"old")
    clock = Clock(time.time() + 2 * DAY)
    ports = ports_of(stack, clock, pools={"default": {"runs": "10d"}}, stack_retention='{"uploads": "1d"}')
    report = run_reaper(ports).retention
    assert report is not None and report.uploads == 1


def test_an_upload_offered_as_there_is_marked_used_only_while_uploads_expire(local_stack):
    stack = local_stack
    data = b"archive"
    sha, md5 = hashlib.sha256(data).hexdigest(), base64.b64encode(hashlib.md5(data).digest()).decode()
    stack.objects.put_bytes(upload_key("alice", sha), data)
    written = stack.objects.head(upload_key("alice", sha)).modified
    time.sleep(1.1)  # stores keep whole seconds
    clock = Clock(time.time() + 2 * DAY)
    assert uploads.offer(ports_of(stack, clock), ALICE, sha, len(data), md5).present
    assert stack.objects.head(upload_key("alice", sha)).modified == written  # kept for good: no new version
    expiring = ports_of(stack, clock, stack_retention='{"uploads": "7d"}')
    assert uploads.offer(expiring, ALICE, sha, len(data), md5).present
    assert stack.objects.head(upload_key("alice", sha)).modified > written


def test_a_run_let_go_keeps_what_is_gone_and_is_looked_at_anew(local_stack):
    clock = Clock(T0 + 5 * DAY)
    ports = ports_of(local_stack, clock, pools={"default": {"outputs": "2d", "runs": "10d"}})
    run = finished(local_stack, "pinned")
    sweep(ports)  # dated, and its outputs deleted
    assert local_stack.store.get(run.id).retention.deleted == ["outputs"]
    keep(ports, ALICE, run.id, True)
    clock.now = T0 + 40 * DAY
    let_go = keep(ports, ALICE, run.id, False)
    assert let_go.retention.deleted == ["outputs"] and let_go.retention.checked_at == clock.now
    assert purge_due(let_go) == T0 + 10 * DAY  # past: the next pass deletes the rest
    assert sweep(ports).records == [run.id]


def test_a_kept_runs_view_says_when_each_part_would_go_once_let_go(local_stack):
    clock = Clock(T0 + 5 * DAY)
    ports = ports_of(local_stack, clock, pools={"default": {"outputs": "2d", "runs": "10d"}})
    run = finished(local_stack, "shown")
    sweep(ports)  # dated, and its outputs deleted
    kept = retention_view(ports, keep(ports, ALICE, run.id, True))
    assert kept is not None and kept.kept and kept.deleted == ["outputs"]
    dates = (kept.outputs_until, kept.logs_until, kept.record_until)
    assert [d.timestamp() for d in dates] == [T0 + 2 * DAY, T0 + 10 * DAY, T0 + 10 * DAY]
    let_go = retention_view(ports, keep(ports, ALICE, run.id, False))
    assert (
        let_go is not None
        and not let_go.kept
        and (let_go.outputs_until, let_go.logs_until, let_go.record_until) == dates
    )
    parked = local_stack.store.create(
        Run(id="r-parked", owner="alice", queue="default", spec=RunSpec(command="true"), created_at=T0)
    )
    ahead = retention_view(ports, keep(ports, ALICE, parked.id, True))  # not ended: nothing dated yet
    assert (
        ahead is not None
        and ahead.kept
        and (ahead.outputs_until, ahead.record_until, ahead.deleted) == (None, None, [])
    )
