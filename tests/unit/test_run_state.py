"""The agent's one writer of a run's state (``worker_agent/run_state.py``): the final write takes
its state from the Outcome, a failure the retry rule names queues the run again, and what waits
for the run is told that it ended. The store here applies every write it is given; the
conditions those writes carry are the contract suites' (tests/integration/contracts)."""

from typing import Any

import pytest

from runplane.domain.asks import Resources, RetryRule
from runplane.domain.runs import Run, RunSpec, Usage
from runplane.domain.states import FailureReason, RunState
from runplane.services import lifecycle
from worker_agent.outcome import Outcome
from worker_agent.run_config import AgentPorts
from worker_agent.run_state import RunStateWriter

NOW = 1000.0


class OneRunStore:
    """A store of one run that applies every write (no condition is checked) and keeps them."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.writes: list[dict[str, Any]] = []

    def get(self, run_id: str) -> Run:
        assert run_id == self.run.id
        return self.run

    def update(self, run: Run, expect: Any, changes: dict[str, Any], event: Any = None) -> Run:
        self.writes.append(dict(changes))
        events = [*self.run.events, event] if event is not None else self.run.events
        self.run = self.run.model_copy(update={**changes, "events": events})
        return self.run


class Queue:
    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.notified: list[Any] = []

    def send(self, pool: str, message: Any) -> None:
        self.sent.append((pool, message))

    def notify(self, event: Any, delay_seconds: int = 0) -> None:
        self.notified.append(event)


def held(**fields: Any) -> Run:
    spec = RunSpec(command="true", resources=Resources(memory=64 * 1024**2), retry=fields.pop("retry", None))
    fields = {"state": RunState.RUNNING, "attempt": 1, "worker_id": "w1", **fields}
    return Run(id="r-1", owner="ada", queue="cpu", created_at=0.0, spec=spec, **fields)


def writer(run: Run) -> tuple[RunStateWriter, OneRunStore, Queue]:
    store, queue = OneRunStore(run), Queue()
    return RunStateWriter(run, AgentPorts(store, queue, objects=None), lambda: NOW), store, queue


def test_the_final_state_is_the_outcomes():
    """The reason alone would make it timed_out: the Outcome says failed, and failed it is."""
    w, store, _ = writer(held())
    w.finish(Outcome(RunState.FAILED, FailureReason.TIME_LIMIT, "over", 9), Usage(cpu_seconds=1.5))
    stored = store.run
    assert (stored.state, stored.failure.reason, stored.failure.message) == (
        RunState.FAILED,
        FailureReason.TIME_LIMIT,
        "over",
    )
    assert (stored.exit_code, stored.usage.cpu_seconds, stored.finished_at) == (9, 1.5, NOW)
    assert w.run == stored  # the writer's copy is the record as written


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (RunState.KILLED, FailureReason.KILLED),
        (RunState.TIMED_OUT, FailureReason.TIME_LIMIT),
        (RunState.FAILED, FailureReason.NONZERO_EXIT),
    ],
)
def test_each_end_of_failure_is_written_as_its_outcome_says(state, reason):
    w, store, _ = writer(held())
    w.finish(Outcome(state, reason, "it ended"), Usage())
    assert (store.run.state, store.run.failure.reason) == (state, reason)
    assert store.run.events[-1].state == state


def test_a_success_records_its_exit_code_and_no_failure():
    w, store, queue = writer(held())
    w.finish(Outcome(RunState.SUCCEEDED, None, "command exited with code 0", 0), Usage(gpu_seconds=2.0))
    assert (store.run.state, store.run.exit_code, store.run.failure) == (RunState.SUCCEEDED, 0, None)
    assert store.run.usage.gpu_seconds == 2.0
    # nothing waits for it: its end is told for the dispatcher's metrics alone
    [end] = queue.notified
    assert (end.sweep, end.upstream, end.ended.state, end.ended.reason) == (None, None, RunState.SUCCEEDED, None)


def test_a_failure_without_a_reason_is_an_agent_error():
    w, store, _ = writer(held())
    w.finish(Outcome(RunState.FAILED, None, "something broke"), Usage())
    assert (store.run.state, store.run.failure.reason) == (RunState.FAILED, FailureReason.AGENT_ERROR)


def test_a_failure_its_retry_rule_names_queues_the_run_again():
    w, store, queue = writer(held(retry=RetryRule(attempts=3, on=["nonzero_exit"])))
    w.finish(Outcome(RunState.FAILED, FailureReason.NONZERO_EXIT, "command exited with code 1", 1), Usage())
    assert (store.run.state, store.run.worker_id, store.run.failure) == (RunState.QUEUED, None, None)
    assert [(pool, m.run_id, m.attempt) for pool, m in queue.sent] == [("cpu", "r-1", 1)]


def test_a_failure_it_names_not_is_written_with_the_rules_word():
    w, store, _ = writer(held(retry=RetryRule(attempts=3, on=["out_of_memory"])))
    w.finish(Outcome(RunState.FAILED, FailureReason.NONZERO_EXIT, "command exited with code 1", 1), Usage())
    assert store.run.state == RunState.FAILED
    assert store.run.failure.message == (
        "command exited with code 1; not retried: nonzero_exit is not a reason its retry rule names (out_of_memory)"
    )


def test_what_waits_for_the_run_is_told_it_ended():
    w, _, queue = writer(held(sweep_id="s-1", sweep_index=0))
    w.finish(Outcome(RunState.KILLED, FailureReason.KILLED, "killed on request"), Usage())
    assert [(e.reason, e.sweep) for e in queue.notified] == [("run ended", "s-1")]


def test_a_state_that_ends_no_failure_is_never_written():
    w, store, _ = writer(held())
    with pytest.raises(ValueError, match="cannot fail as queued"):
        w.finish(Outcome(RunState.QUEUED, FailureReason.WORKER_LOST, "worker terminated"), Usage())
    assert store.writes == []
    with pytest.raises(ValueError, match="cannot fail as succeeded"):
        lifecycle.fail(store, held(), FailureReason.NONZERO_EXIT, "exit 1", NOW, state=RunState.SUCCEEDED)


def test_without_a_state_fail_reads_it_from_the_reason():
    for reason, state in [
        (FailureReason.KILLED, RunState.KILLED),
        (FailureReason.TIME_LIMIT, RunState.TIMED_OUT),
        (FailureReason.OUT_OF_MEMORY, RunState.FAILED),
    ]:
        store = OneRunStore(held())
        assert lifecycle.fail(store, held(), reason, "ended", NOW).state == state


def test_the_states_on_the_way_and_a_hand_back():
    w, store, queue = writer(held(state=RunState.PREPARING))
    w.running(NOW, "container started on worker w1")
    assert (store.run.state, store.run.started_at) == (RunState.RUNNING, NOW)
    w.uploading("uploading outputs (succeeded)")
    assert store.run.state == RunState.UPLOADING
    w.requeue("worker terminated", Usage(cpu_seconds=3.0))
    assert (store.run.state, store.run.waiting_reason) == (
        RunState.QUEUED,
        "re-queued after attempt 1: worker terminated",
    )
    assert store.run.max_attempts == held().max_attempts + 1  # not the run's doing: not charged to it
    assert store.run.usage.cpu_seconds == 3.0
    assert len(queue.sent) == 1


def test_whether_this_worker_holds_the_attempt_is_read_from_the_store():
    w, store, _ = writer(held())
    assert w.holds_attempt("w1") and not w.holds_attempt("w2")
    store.run = store.run.model_copy(update={"worker_id": "w2"})
    assert not w.holds_attempt("w1")
