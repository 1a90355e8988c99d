"""A run's record stays bounded whatever its owner does, so that a kill and a final state can
always be written: its spec is refused past ``MAX_SPEC_BYTES`` (413, naming the limit), its
timeline keeps its first event and the latest ones, and a worker whose claim the store refuses
gives back what it reserved and ends the run ``failed`` instead of meeting it again and again.

Through both clouds' local stacks (``front``) and on both clouds' stores (moto's DynamoDB, which
holds 400 KB an item, and Azurite's Table storage)."""

import contextlib
import time
import uuid

import pytest
from azure.data.tables import TableClient

from runplane.adapters.aws.runs import DynamoRunStore
from runplane.adapters.azure.runs import TableRunStore
from runplane.bootstrap import make_ports
from runplane.client import Client, Conflict
from runplane.domain.errors import BackendError, BadRequest, PayloadTooLarge
from runplane.domain.expect import Expect
from runplane.domain.messages import RunMessage
from runplane.domain.quotas import Quota
from runplane.domain.records import MAX_MESSAGE_CHARS, MAX_RUN_EVENTS, MAX_SPEC_BYTES, json_size, largest_run_bytes
from runplane.domain.runs import MAX_DEPENDENTS, MAX_INPUTS, MAX_UPSTREAMS, SWEEP_PREFIX, Event, Run, RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.domain.tenancy import Principal
from runplane.services import lifecycle, runs
from runplane.services.reap import reap
from tests.conftest import api_status
from worker_agent.agent import Agent
from worker_agent.executor import RunExecutor
from worker_agent.intake import RELEASE_DELAY_SECONDS, ClaimLater
from worker_agent.metrics import AgentMetrics, Gauges
from worker_agent.run_config import AgentConfig, AgentPorts

PARKED = {"command": "echo hi", "queue": "parked"}


@pytest.fixture
def owner(front, user):
    """A user of this test's own: (client, user name)."""
    name = f"b-{uuid.uuid4().hex[:8]}"
    made = user("admin").request("POST", "/v1/tokens", {"user": name})
    client = Client(front.api_url, made["token"])
    yield client, name
    for view in client.request("GET", "/v1/runs", query={"state": "queued"})["runs"]:
        with contextlib.suppress(Conflict):
            client.request("POST", f"/v1/runs/{view['id']}/kill")


def padded(body, size):
    """``body`` with an environment variable that makes its spec ``size`` bytes as JSON, as
    stored with the pool's defaults (the test pools' image and resources)."""
    spec = RunSpec.model_validate({**body, "env": {"PAD": ""}})
    base = json_size(spec.model_dump(mode="json"))
    return {**body, "env": {"PAD": "x" * (size - base)}}


def test_a_spec_past_the_limit_is_refused_with_the_limit(owner):
    client, _ = owner
    fits = padded(PARKED, MAX_SPEC_BYTES)
    assert client.request("POST", "/v1/runs", fits)["state"] == "queued"
    for body in (
        padded(PARKED, MAX_SPEC_BYTES + 1),
        {**PARKED, "command": "echo " + "\U0001f600" * 12_000},  # 48 KB of UTF-8, 144 KB escaped
    ):
        status, code, message = api_status(lambda body=body: client.request("POST", "/v1/runs", body))
        assert (status, code) == (413, "payload_too_large")
        assert f"at most {MAX_SPEC_BYTES}" in message and "the run's spec is" in message
    assert len(client.request("GET", "/v1/runs")["runs"]) == 1


def test_a_sweep_whose_members_could_pass_the_limit_is_refused(owner):
    client, _ = owner
    template = padded(PARKED, MAX_SPEC_BYTES - 20_000)
    sweep = {"run": template, "parameters": {f"P{i}": ["b" * 1000, "a"] if i < 3 else ["b" * 1000] for i in range(30)}}
    status, code, message = api_status(lambda: client.request("POST", "/v1/sweeps", sweep))
    assert (status, code) == (413, "payload_too_large")
    assert "a member's run spec is" in message and f"at most {MAX_SPEC_BYTES}" in message
    assert client.request("GET", "/v1/sweeps")["sweeps"] == []


def test_priority_changes_cannot_make_a_run_unkillable(owner):
    """The worst the API allows: the largest spec, a timeline filled by priority changes and
    more, then a kill (as the owner)."""
    client, name = owner
    run = client.request("POST", "/v1/runs", padded(PARKED, MAX_SPEC_BYTES))
    for i in range(MAX_RUN_EVENTS + 1):
        view = client.request("POST", f"/v1/runs/{run['id']}/priority", {"priority": 10 + i % 2})
    events = view["events"]
    assert len(events) == MAX_RUN_EVENTS
    assert events[0]["message"] == "submitted to pool parked"
    assert [e["message"] for e in events[-2:]] == [f"priority 10 -> 11 by {name}", f"priority 11 -> 10 by {name}"]
    killed = client.request("POST", f"/v1/runs/{run['id']}/kill")
    assert killed["state"] == "killed"
    assert len(killed["events"]) == MAX_RUN_EVENTS and killed["events"][-1]["state"] == "killed"
    assert killed["events"][0]["message"] == "submitted to pool parked"


# -- on the stores ----------------------------------------------------------------------------


@pytest.fixture(params=["aws", "azure"])
def stack(request):
    """The AWS adapters with their tables on dynalite, which sizes items as DynamoDB does, or the
    Azure ones on Azurite; ``moto`` (where ``runplane dev`` keeps its tables, counting an attribute
    that a write replaces twice, old and new) where a test asks for it."""
    return request.getfixturevalue({"aws": "aws_dynalite_stack", "moto": "aws_stack"}.get(request.param, "azure_stack"))


def _run(events, pad, queue="parked", state=RunState.QUEUED):
    spec = RunSpec(command="echo hi", queue=queue, image="runplane/test-busybox:1", env={"PAD": "x" * pad})
    return Run(id=f"r-{uuid.uuid4().hex[:24]}", owner="alice", spec=spec, queue=queue, created_at=time.time(),
               events=events, state=state)  # fmt: skip


def at_the_limit(store, events, queue="parked"):
    """A queued run with ``events``, stored past the API's checks (as a release before them could
    store it) and grown to within a few bytes of what its store holds. The runs that find the
    limit are stored killed (a state of as many letters), out of the pool's line."""
    low, high = 0, 500_000  # padding that fits, padding that does not
    while high - low > 8:
        middle = (low + high) // 2
        try:
            store.create(_run(events, middle, queue, RunState.KILLED))
        except (BadRequest, PayloadTooLarge):
            high = middle
        else:
            low = middle
    run = _run(events, low, queue)
    store.create(run)
    return run


def test_a_run_grown_to_its_stores_limit_is_still_killable(stack):
    """The timeline an older release let grow (thousands of priority changes) next to a large
    spec: a kill keeps the first event and the latest ones, and is written."""
    events = [Event(at=1.0 + i, message=f"priority {i % 2} -> {(i + 1) % 2} by alice") for i in range(2400)]
    run = at_the_limit(stack.store, events)
    killed = runs.kill_run(stack.ports, Principal(user="alice"), run.id)
    assert killed.state == RunState.KILLED
    stored = stack.store.get(run.id)
    assert stored.state == RunState.KILLED and len(stored.events) == MAX_RUN_EVENTS
    assert stored.events[0] == events[0] and stored.events[-2] == events[-1]
    assert stored.events[-1].message == "killed by alice while queued"


def test_a_full_timeline_written_from_a_stale_read_loses_no_event(stack):
    store = stack.store
    first = Event(at=1.0, state=RunState.QUEUED, message="submitted to pool parked")
    run = store.create(_run([first], 10))
    stale = run
    for i in range(MAX_RUN_EVENTS + 5):
        run = store.update(run, Expect(states=frozenset({RunState.QUEUED})), {}, Event(at=2.0 + i, message=f"e{i}"))
    assert len(run.events) == MAX_RUN_EVENTS
    # a writer that read the run before it filled up appends behind the latest event, not over it
    done = store.update(stale, Expect(states=frozenset({RunState.QUEUED})), {}, Event(at=500.0, message="late"))
    assert [e.message for e in done.events[-3:]] == [f"e{MAX_RUN_EVENTS + 3}", f"e{MAX_RUN_EVENTS + 4}", "late"]
    assert done.events[0] == first and len(done.events) == MAX_RUN_EVENTS
    assert store.get(run.id).events == done.events


def test_an_agent_whose_claim_is_refused_gives_back_and_the_run_ends_failed(stack, tmp_path):
    """A run the store cannot take one more event for (a large record of an older release): the
    claim is refused, the worker's cores and the owner's quota hold are given back, the run ends
    failed with a reason and no store text, and neither it nor the reaper offers it again."""
    stack.quotas.put(Quota(kind="user", name="alice", max_running=5, updated_at=time.time()))
    events = [Event(at=1.0, state=RunState.QUEUED, message="submitted to pool default")]
    events += [Event(at=2.0 + i, message="x" * 900) for i in range(MAX_RUN_EVENTS - 10)]
    run = at_the_limit(stack.store, events, queue="default")
    with pytest.raises((BadRequest, PayloadTooLarge)):  # what the claim would write does not fit
        stack.store.update(run, Expect(), {"worker_id": "w-refused"}, Event(at=3.0, message="claimed"))
    stack.queue.send("default", RunMessage(run_id=run.id, attempt=0))
    config = AgentConfig(pool="default", worker_id="w-refused", work_dir=tmp_path / "w", cpuset=(0, 1))
    ports = AgentPorts(stack.store, stack.queue, stack.objects, stack.quotas)
    agent = Agent(config, ports, registry=None, docker_client=None, clock=time.time)  # type: ignore[arg-type]
    (delivery,) = stack.queue.receive("default", 1, 5, visibility_seconds=30)

    agent.intake.take(delivery)

    ended = stack.store.get(run.id)
    assert (ended.state, ended.attempt, ended.worker_id) == (RunState.FAILED, 0, None)
    assert ended.failure is not None and ended.failure.reason == FailureReason.AGENT_ERROR
    assert ended.failure.message.startswith("worker w-refused could not claim it: ")
    for store_words in ("ValidationException", "Item size", "EntityTooLarge", "PropertyValueTooLarge"):
        assert store_words not in ended.failure.message
    assert agent.slots.allocator.free() == (2, 0) and agent.slots.active == {} and agent.slots.claimed == 0
    assert stack.quotas.usage("user", "alice").holds == {}
    reap(make_ports(stack, lambda: time.time() + 3600), rehint_after=0)
    assert stack.queue.receive("default", 10, 1, visibility_seconds=30) == []


def test_a_claim_the_store_fails_to_answer_is_given_back_and_offered_again(request, stack, tmp_path):
    """A store that fails (here: the worker's store names a table that is not there) is no
    refusal: the cores and the quota hold go back, the run stays queued as it was, and the agent
    hands its hint back (``ClaimLater``) for another try."""
    if request.node.callspec.params["stack"] == "aws":
        broken = DynamoRunStore("no-such-table", stack.store.client)
    else:
        connection = stack.settings.azure_storage_connection_string
        broken = TableRunStore(TableClient.from_connection_string(connection, "nosuchtable"))
    stack.quotas.put(Quota(kind="user", name="alice", max_running=5, updated_at=time.time()))
    run = stack.store.create(_run([Event(at=1.0, message="submitted")], 10, queue="default"))
    config = AgentConfig(pool="default", worker_id="w-failing", work_dir=tmp_path / "w", cpuset=(0, 1))
    ports = AgentPorts(broken, stack.queue, stack.objects, stack.quotas)  # type: ignore[arg-type]
    agent = Agent(config, ports, registry=None, docker_client=None, clock=time.time)  # type: ignore[arg-type]
    allocation = agent.slots.allocator.allocate(run.id, 1, 0)
    assert allocation is not None and agent.holds.reserve(run) is True
    assert list(stack.quotas.usage("user", "alice").holds) == [f"{run.id}#1"]

    with pytest.raises(ClaimLater):
        agent.intake.claim(run, allocation)

    assert agent.slots.allocator.free() == (2, 0) and agent.slots.claimed == 0
    assert stack.quotas.usage("user", "alice").holds == {}
    assert stack.store.get(run.id) == run


@pytest.mark.parametrize("stack", ["aws", "moto", "azure"], indirect=True)
def test_the_largest_record_the_api_allows_takes_a_kill_and_its_end(stack):
    """Everything of a run at the most the API lets it hold: a spec of ``MAX_SPEC_BYTES``, a full
    timeline of the longest messages, 1,000 runs and sweeps waiting for it, all it may wait for
    and 32 groups. It is claimed, runs, is asked to stop and ends, on both stores, and on moto's
    DynamoDB (``runplane dev``), which counts a full timeline a write replaces twice."""
    store = stack.store
    long = "m" * MAX_MESSAGE_CHARS
    spec = RunSpec(command="echo hi", queue="default", image="runplane/test-busybox:1", env={"PAD": ""})
    spec.env["PAD"] = "x" * (MAX_SPEC_BYTES - json_size(spec.model_dump(mode="json")))
    assert json_size(spec.model_dump(mode="json")) == MAX_SPEC_BYTES
    run = Run(
        id=f"r-{uuid.uuid4().hex[:24]}",
        owner="alice",
        owner_groups=[f"g{i:02d}" + "g" * 45 for i in range(32)],
        group="g00" + "g" * 45,
        spec=spec,
        queue="default",
        created_at=time.time(),
        dependents=[f"{SWEEP_PREFIX}s-{i:062d}" for i in range(MAX_DEPENDENTS)],
        events=[Event(at=1e9 + i, state=RunState.QUEUED, message=long) for i in range(MAX_RUN_EVENTS)],
        waiting_reason=long,
    )
    largest = json_size(run.model_dump(mode="json")) + len(run.id) * (MAX_UPSTREAMS + MAX_INPUTS + 1)
    assert largest_run_bytes() > largest
    store.create(run)
    now = time.time()
    run = lifecycle.claim(store, run, 0, "w-" + "w" * 62, 30, now)
    run = lifecycle.advance(store, run, RunState.RUNNING, now, long)
    run = runs.kill_run(stack.ports, Principal(user="alice"), run.id)
    assert run.kill_requested
    ended = lifecycle.fail(store, run, FailureReason.KILLED, long + long, now, usage=run.usage)
    stored = store.get(run.id)
    assert stored == ended and stored.state == RunState.KILLED and len(stored.events) == MAX_RUN_EVENTS
    assert stored.failure is not None and stored.failure.message.endswith("\u2026")
    assert MAX_MESSAGE_CHARS - 12 < json_size(stored.failure.message) - 2 <= MAX_MESSAGE_CHARS
    assert [e.state for e in stored.events[-3:]] == [RunState.RUNNING, None, RunState.KILLED]


@pytest.mark.parametrize("stack", ["aws"], indirect=True)
def test_time_to_running_is_read_from_the_record_when_the_timeline_has_dropped_the_start(stack, monkeypatch):
    """A run with more events after its start than its timeline keeps: its time to running (the
    dispatcher's end event, a worker's metric) is read from its record, not from its timeline."""
    store = stack.store
    run = store.create(_run([Event(at=1.0, state=RunState.QUEUED, message="submitted")], 10, queue="default"))
    run = lifecycle.claim(store, run, 0, "w-1", 60.0, run.created_at + 1)
    run = lifecycle.advance(store, run, RunState.RUNNING, run.created_at + 2, "started")
    for i in range(MAX_RUN_EVENTS):
        run = store.update(run, Expect(), {}, Event(at=run.created_at + 3 + i, message=f"note {i}"))
    done = lifecycle.fail(store, run, FailureReason.OUT_OF_MEMORY, "oom", run.created_at + 200)
    assert RunState.RUNNING not in [e.state for e in store.get(run.id).events]
    sent = []
    monkeypatch.setattr(stack.queue, "notify", sent.append)
    lifecycle.ended(stack.queue, done)
    [end] = sent
    assert end.ended.to_running == 2.0
    metrics = AgentMetrics("default", "w-1")
    metrics.run_ended(done, {})
    text = metrics.render(Gauges(slots=1, active=0, gpus=0))
    assert 'runplane_worker_seconds_to_running_sum{pool="default",worker="w-1"} 2\n' in text
    assert 'runplane_worker_seconds_to_running_count{pool="default",worker="w-1"} 1\n' in text


class _ClaimUnanswered:
    """A run store whose answer to the first claim (a write that sets a worker) is lost, as on a
    network that drops it: before the write reached the store, or (``landed``) after it was made.
    Everything else goes to the real store."""

    def __init__(self, store, landed):
        self.store, self.landed, self.lost = store, landed, False

    def __getattr__(self, name):
        return getattr(self.store, name)

    def update(self, run, expect, changes, event=None):
        if changes.get("worker_id") and not self.lost:
            self.lost = True
            if self.landed:
                self.store.update(run, expect, changes, event)
            raise BackendError("update run: the store did not answer")
        return self.store.update(run, expect, changes, event)


def _taking(stack, tmp_path, store=None):
    """A queued run of alice's under a quota, its hint as received, and an agent of two cores
    whose store is ``store`` (the stack's by default) on the stack's queue."""
    stack.quotas.put(Quota(kind="user", name="alice", max_running=5, updated_at=time.time()))
    run = stack.store.create(_run([Event(at=1.0, message="submitted")], 10, queue="default"))
    stack.queue.send("default", RunMessage(run_id=run.id, attempt=0))
    (delivery,) = stack.queue.receive("default", 1, 5, visibility_seconds=30)
    config = AgentConfig(pool="default", worker_id="w-taking", work_dir=tmp_path / "w", cpuset=(0, 1))
    ports = AgentPorts(store or stack.store, stack.queue, stack.objects, stack.quotas)
    agent = Agent(config, ports, registry=None, docker_client=None, clock=time.time)  # type: ignore[arg-type]
    return run, delivery, agent


@pytest.mark.parametrize("stack", ["aws"], indirect=True)
def test_a_claim_left_unanswered_gives_back_and_its_hint_is_offered_again(stack, tmp_path):
    """Through ``_take``: the claim's write never reached the store, so nothing was claimed; the
    cores and the quota hold go back and the hint comes back to the queue for another try."""
    store = _ClaimUnanswered(stack.store, landed=False)
    run, delivery, agent = _taking(stack, tmp_path, store)

    agent.intake.take(delivery)

    assert store.lost and stack.store.get(run.id) == run
    assert agent.slots.allocator.free() == (2, 0) and agent.slots.active == {} and agent.slots.claimed == 0
    assert stack.quotas.usage("user", "alice").holds == {}
    again = stack.queue.receive("default", 10, RELEASE_DELAY_SECONDS + 5, visibility_seconds=30)
    assert [(d.message.run_id, d.message.attempt) for d in again] == [(run.id, 0)]


@pytest.mark.parametrize("stack", ["aws"], indirect=True)
def test_a_claim_that_landed_though_its_answer_was_lost_is_run_here(stack, tmp_path):
    """Through ``_take``: the claim was written but its answer lost; the run, as stored, is this
    worker's, so it is started here and its hint is deleted, not offered to another worker."""
    store = _ClaimUnanswered(stack.store, landed=True)
    run, delivery, agent = _taking(stack, tmp_path, store)

    agent.intake.take(delivery)

    assert store.lost and agent.slots.claimed == 1
    executor = agent.slots.active.get(run.id)
    if executor is not None and executor.thread is not None:
        executor.thread.join(30)  # it fails here (this agent has no engine); what matters is who took it
    taken = stack.store.get(run.id)
    assert (taken.attempt, taken.events[1].message) == (1, "attempt 1 claimed by worker w-taking")
    assert stack.queue.receive("default", 10, RELEASE_DELAY_SECONDS + 2, visibility_seconds=30) == []


@pytest.mark.parametrize("stack", ["aws"], indirect=True)
def test_a_run_whose_start_fails_after_its_claim_is_given_back_and_handed_back(stack, tmp_path, monkeypatch):
    """The claim was made, then its executor could not be started (here: no thread to be had):
    the cores, the slot and the quota hold go back, and the run is handed back to its queue for
    its next attempt at once, not left claimed by this worker until its lease runs out."""
    run, delivery, agent = _taking(stack, tmp_path)

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(RunExecutor, "start", no_thread)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        agent.intake.take(delivery)

    assert agent.slots.allocator.free() == (2, 0) and agent.slots.active == {} and agent.slots.claimed == 0
    assert stack.quotas.usage("user", "alice").holds == {}
    back = stack.store.get(run.id)
    assert (back.state, back.attempt, back.worker_id) == (RunState.QUEUED, 1, None)
    assert back.events[-1].message == "re-queued: worker w-taking could not start it"
    again = stack.queue.receive("default", 10, 2, visibility_seconds=30)
    assert [(d.message.run_id, d.message.attempt) for d in again] == [(run.id, 1)]
