"""``runs.stop_all`` (what a stopping local stack does to its runs) on every RunStore: queued runs
killed at once, active ones flagged with the reason for their workers (the reason stored and read
back), and recorded killed by the caller once their workers are gone; finished runs untouched."""

from runplane.bootstrap import make_ports
from runplane.domain.runs import Event, Failure, Run, RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.domain.tenancy import Principal
from runplane.services import lifecycle, runs

REASON = "the local stack stopped"


def clock():
    return 2000.0


def submitted(stack, i, queue="default"):
    return stack.store.create(
        Run(
            id=f"r-stop-{queue}-{i}",
            owner="alice",
            queue=queue,
            spec=RunSpec(command="sleep 600"),
            created_at=1000.0 + i,
            events=[Event(at=1000.0, state=RunState.QUEUED, message="submitted")],
        )
    )


def claimed(stack, i, queue="default"):
    return lifecycle.claim(stack.store, submitted(stack, i, queue), 0, "w-1", 60, 1001.0)


def test_queued_runs_are_killed_at_once_and_active_ones_flagged_with_the_reason(stack):
    queued, active = submitted(stack, 1), claimed(stack, 2, queue="manual")
    finished = lifecycle.fail(stack.store, claimed(stack, 3), FailureReason.NONZERO_EXIT, "exit 1", 1002.0)

    written = runs.stop_all(make_ports(stack, clock), REASON)

    assert sorted((r.id, r.state) for r in written) == [(queued.id, RunState.KILLED), (active.id, RunState.PREPARING)]
    killed = stack.store.get(queued.id)
    assert killed.failure is not None
    assert (killed.failure.reason, killed.failure.message) == (
        FailureReason.KILLED,
        f"killed before it started: {REASON}",
    )
    assert killed.events[-1].message == f"killed while queued: {REASON}"
    flagged = stack.store.get(active.id)
    assert (flagged.state, flagged.kill_requested, flagged.kill_reason) == (RunState.PREPARING, True, REASON)
    assert flagged.events[-1].message == f"kill requested: {REASON}"
    assert stack.store.get(finished.id) == finished


def test_once_the_workers_are_gone_active_runs_are_recorded_killed_here(stack):
    active = claimed(stack, 4)
    runs.stop_all(make_ports(stack, clock), REASON)

    written = runs.stop_all(make_ports(stack, clock), REASON, workers_gone=True)

    ended = stack.store.get(active.id)
    assert written == [ended]
    assert (ended.state, ended.finished_at, ended.lease_expires_at) == (RunState.KILLED, 2000.0, None)
    assert ended.failure == Failure(reason=FailureReason.KILLED, message=f"killed: {REASON}")
    assert list(runs.unfinished_runs(stack.ports)) == []


def test_a_kill_by_a_user_still_names_the_user_and_stores_no_reason(stack):
    alice = Principal(user="alice", scopes=["runs:write"])
    queued, active = submitted(stack, 5), claimed(stack, 6)

    killed = runs.kill_run(make_ports(stack, clock), alice, queued.id)
    flagged = runs.kill_run(make_ports(stack, clock), alice, active.id)

    assert killed.failure is not None and killed.failure.message == "killed by alice before it started"
    assert (flagged.kill_requested, flagged.kill_reason) == (True, None)
    assert stack.store.get(active.id).events[-1].message == "kill requested by alice"
