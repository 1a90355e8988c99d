"""The arithmetic of fallback between pools (runplane/services/fallback.py): a run's chain of pools,
the next one after the pool it is on, when its time there is up, its preemptions counted, and the
words its waiting reason adds."""

import calendar
from types import SimpleNamespace

import pytest

from runplane.domain.errors import BackendError
from runplane.domain.runs import Run, RunSpec
from runplane.services import fallback

NOW = float(calendar.timegm((2026, 11, 30, 10, 30, 0)))


def run_of(queue="gpu-spot", fallback_pools=("gpu-ondemand", "cpu"), on=None, **spec) -> Run:
    spec = RunSpec(command="true", queue=[queue, *fallback_pools], **spec)
    return Run(id="r-1", owner="alice", spec=spec, queue=on or queue, created_at=NOW)


def test_a_list_of_queues_is_the_chain_and_the_next_pool_follows_the_one_it_is_on():
    run = run_of(fallback_after=60)
    assert run.spec.queue == "gpu-spot" and run.spec.fallback == ["gpu-ondemand", "cpu"]
    assert fallback.chain(run.spec) == ["gpu-spot", "gpu-ondemand", "cpu"]
    assert fallback.next_pool(run) == "gpu-ondemand"
    assert fallback.next_pool(run, "gpu-ondemand") == "cpu"
    assert fallback.next_pool(run_of(on="cpu", fallback_after=60)) is None  # the last: it never goes back
    assert fallback.next_pool(run, "elsewhere") is None


def test_its_time_on_a_pool_starts_when_it_is_queued_there_and_the_last_pool_has_none():
    run = run_of(fallback_after="20m")
    assert fallback.due_at(run, NOW) == NOW + 1200
    assert fallback.due_at(run, NOW, "cpu") is None
    assert fallback.due_at(run_of(fallback_after_preemptions=2), NOW) is None  # moves on preemptions only
    assert fallback.queued_changes(run, NOW) == {"fallback_at": NOW + 1200}
    plain = run_of(fallback_pools=()).model_copy(update={"spec": RunSpec(command="true", queue="gpu-spot")})
    assert fallback.queued_changes(plain, NOW, preempted=True) == {}  # no chain: its record is left as it was


def test_preemptions_are_counted_and_the_nth_moves_it_on():
    run = run_of(fallback_after_preemptions=2)
    assert fallback.queued_changes(run, NOW, preempted=True) == {"fallback_at": None, "preemptions": 1}
    assert fallback.moves_on_preemption(run) is None
    once = run.model_copy(update={"preemptions": 1})
    assert fallback.moves_on_preemption(once) == "gpu-ondemand"
    assert fallback.moves_on_preemption(run_of(on="cpu", fallback_after_preemptions=1)) is None
    assert fallback.moves_on_preemption(run_of(fallback_after=60)) is None  # only a time: preemptions move nothing


def test_the_waiting_reason_says_where_and_when_it_falls_back():
    run = run_of(fallback_after="20m").model_copy(update={"fallback_at": NOW + 1200})
    assert fallback.when_words(run, NOW + 480) == "; falls back to pool gpu-ondemand at 10:50:00 UTC (in 12m)"
    assert fallback.when_words(run, NOW + 1200).endswith("(due now)")
    assert fallback.when_words(run.model_copy(update={"fallback_at": None}), NOW) == ""


def test_the_waiting_reason_counts_the_preemptions_that_move_it_on():
    run = run_of(fallback_after_preemptions=3).model_copy(update={"preemptions": 2})
    assert fallback.when_words(run, NOW) == "; preempted 2 of 3 times on pool gpu-spot"
    assert fallback.when_words(run.model_copy(update={"preemptions": 0}), NOW) == ""  # not preempted there yet
    both = run_of(fallback_after="20m", fallback_after_preemptions=3)
    timed = both.model_copy(update={"preemptions": 1, "fallback_at": NOW + 1200})
    assert fallback.when_words(timed, NOW + 480) == (
        "; preempted 1 of 3 times on pool gpu-spot; falls back to pool gpu-ondemand at 10:50:00 UTC (in 12m)"
    )
    assert fallback.when_words(run_of(on="cpu", fallback_after_preemptions=3), NOW) == ""  # the last pool


@pytest.mark.parametrize(
    "spec",
    [
        {"queue": "gpu-spot", "fallback_after": 60},
        {"queue": ["gpu-spot", "gpu-ondemand"]},
    ],
)
def test_a_timer_is_only_where_a_chain_and_a_time_are(spec):
    run = Run(id="r-1", owner="alice", spec=RunSpec(command="true", **spec), queue="gpu-spot", created_at=NOW)
    assert fallback.due_at(run, NOW) is None


def test_a_timer_that_cannot_be_sent_is_logged_and_its_caller_goes_on(caplog):
    """The timer is sent after its run's write: a queue that fails (or whose client does not take
    the delay) is logged, and the reaper's pass moves the run when it is due."""
    sent = []

    class Queue:
        def notify(self, event, delay_seconds=0):
            sent.append((event.fallback, event.due, delay_seconds))
            raise BackendError("notify failed: ServiceUnavailable")

    class OldQueue:
        def notify(self, event):  # no delay
            sent.append(event.fallback)

    run = run_of(fallback_after=60).model_copy(update={"fallback_at": NOW + 90})
    fallback.send_timer(SimpleNamespace(queue=Queue()), run, NOW)
    assert sent == [("r-1", NOW + 90, 90)]
    fallback.send_timer(SimpleNamespace(queue=OldQueue()), run, NOW)
    assert sent == [("r-1", NOW + 90, 90)]
    assert [r.levelname for r in caplog.records if "fallback timer not sent" in r.getMessage()] == ["WARNING", "ERROR"]
