"""The retention sweep deletes an ended run's sessions (and the commands they hold) with the run's
record, and only then: a run not yet due, or kept, keeps them. The store's ``forget`` is in the
sessions store contract (every stack); this is the sweep's use of it."""

from __future__ import annotations

from runplane.domain.sessions import SessionState
from runplane.services.retention import sweep
from tests.integration.contracts.test_session_store import make
from tests.integration.test_retention import DAY, T0, Clock, finished, ports_of


def test_the_sweep_deletes_a_runs_sessions_with_its_record(local_stack):
    stack = local_stack
    clock = Clock(T0 + 1 * DAY)
    ports = ports_of(stack, clock, pools={"default": {"runs": "10d"}})
    gone, kept = finished(stack, "gone"), finished(stack, "kept", kept=True)
    for run in (gone, kept):
        for slot in (0, 1):
            stack.sessions.create(make(run.id, slot, state=SessionState.ENDED, command=["sh", "-c", "token=s3cret"]))

    sweep(ports)  # dated, nothing deleted
    assert len(stack.sessions.for_run(gone.id)) == 2
    clock.now = T0 + 10 * DAY
    assert sweep(ports).records == [gone.id]
    assert stack.sessions.for_run(gone.id) == []
    assert [s.slot for s in stack.sessions.for_run(kept.id)] == [0, 1]
