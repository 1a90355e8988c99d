"""What the worker records when the relay says GONE (worker_agent/sessions/host.py ``ended_by``): a
reason it can check for itself (``closed``, ``run_ended``) only when its run or the stored session
bears it out, whatever a GONE frame says; the others as said, anything unknown as the client gone."""

import pytest

from runplane.domain.sessions import EndReason, Session, SessionKind, SessionState
from worker_agent.sessions.host import ended_by


def stored(state: SessionState, end_reason: str | None = None) -> Session:
    return Session(
        id="r-1.0.0123abcd", run_id="r-1", slot=0, attempt=1, owner="alice", asked_by="alice",
        kind=SessionKind.EXEC, command=["sh"], relay="ws://127.0.0.1:1/v1/relay", state=state,
        end_reason=end_reason, client_secret_hash="0" * 64, created_at=0.0, expires_at=60.0,
    )  # fmt: skip


LIVE = stored(SessionState.ACTIVE)


@pytest.mark.parametrize("said", ["run_ended", "closed"])
def test_a_reason_the_worker_can_check_is_not_taken_on_a_frames_word(said: str) -> None:
    assert ended_by(said, False, LIVE) == EndReason.CLIENT_GONE
    assert ended_by(said, False, None) == EndReason.CLIENT_GONE  # unreadable: not borne out either
    assert ended_by(said, False, stored(SessionState.ENDED, "worker_lost")) == EndReason.CLIENT_GONE


def test_a_checked_reason_holds_when_the_run_or_the_stored_session_bears_it_out() -> None:
    assert ended_by("run_ended", True, LIVE) == EndReason.RUN_ENDED
    assert ended_by("run_ended", False, stored(SessionState.ENDED, "run_ended")) == EndReason.RUN_ENDED
    assert ended_by("closed", False, stored(SessionState.ENDED, "closed")) == EndReason.CLOSED
    assert ended_by("closed", True, LIVE) == EndReason.CLIENT_GONE  # the run ending closes nothing


def test_other_reasons_are_as_said_and_an_unknown_one_is_the_client_gone() -> None:
    assert ended_by("client_gone", False, None) == EndReason.CLIENT_GONE
    assert ended_by("relay_lost", False, None) == EndReason.RELAY_LOST
    assert ended_by("exited", True, None) == EndReason.CLIENT_GONE
    assert ended_by("", False, None) == EndReason.CLIENT_GONE
