"""A run's states and the transitions between them, and the reasons a run did not succeed."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class RunState(StrEnum):
    QUEUED = "queued"
    PREPARING = "preparing"
    RUNNING = "running"
    UPLOADING = "uploading"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    TIMED_OUT = "timed_out"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def active(self) -> bool:
        """Held by a worker under a lease."""
        return self in ACTIVE_STATES


TERMINAL_STATES = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.KILLED, RunState.TIMED_OUT})
ACTIVE_STATES = frozenset({RunState.PREPARING, RunState.RUNNING, RunState.UPLOADING})
_ENDS = {RunState.FAILED, RunState.KILLED, RunState.TIMED_OUT}

# The only allowed transitions. Going back to QUEUED is a re-queue (lease expired, worker
# terminated); terminal states have no way out.
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.QUEUED: frozenset({RunState.PREPARING, RunState.KILLED, RunState.FAILED}),
    RunState.PREPARING: frozenset({RunState.RUNNING, RunState.QUEUED, *_ENDS}),
    RunState.RUNNING: frozenset({RunState.UPLOADING, RunState.QUEUED, *_ENDS}),
    RunState.UPLOADING: frozenset({RunState.SUCCEEDED, RunState.QUEUED, *_ENDS}),
    RunState.SUCCEEDED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.KILLED: frozenset(),
    RunState.TIMED_OUT: frozenset(),
}


def can_transition(current: RunState, new: RunState) -> bool:
    return new in TRANSITIONS[current]


def states_leading_to(new: RunState) -> frozenset[RunState]:
    """Every state from which ``new`` may be entered."""
    return frozenset(s for s, targets in TRANSITIONS.items() if new in targets)


class FailureReason(StrEnum):
    """Machine-readable reasons a run did not succeed. README.md lists exactly these, and each is
    one that the control plane or the agent writes (tests/unit/test_failure_reasons.py)."""

    NONZERO_EXIT = "nonzero_exit"
    IMAGE_NOT_FOUND = "image_not_found"
    IMAGE_TOO_LARGE = "image_too_large"
    OUT_OF_MEMORY = "out_of_memory"
    TIME_LIMIT = "time_limit"
    DISK_LIMIT = "disk_limit"
    LOG_LIMIT = "log_limit"
    KILLED = "killed"
    WORKER_LOST = "worker_lost"
    INPUT_UNAVAILABLE = "input_unavailable"
    UPLOAD_FAILED = "upload_failed"
    CONTAINER_ERROR = "container_error"
    GPU_UNAVAILABLE = "gpu_unavailable"
    AGENT_ERROR = "agent_error"
    DEPENDENCY_FAILED = "dependency_failed"
    NOT_PERMITTED = "not_permitted"
    SECRET_UNAVAILABLE = "secret_unavailable"  # noqa: S105 (a reason, not a secret)
    IMAGE_UNAUTHORIZED = "image_unauthorized"


NEVER_RETRIED = frozenset({FailureReason.KILLED, FailureReason.DEPENDENCY_FAILED})
"""Reasons no retry rule may name: a kill is the user's word, and a run whose upstream failed
never ran (running it again would wait on the same failure)."""
RETRY_REASONS = [r.value for r in FailureReason if r not in NEVER_RETRIED]
DEFAULT_MAX_ATTEMPTS = 3
"""Claims a run without a retry rule may take: a lost worker is retried twice."""


REASONS = frozenset(reason.value for reason in FailureReason)


def known_reason(value: Any) -> Any:
    """A reason as another release stored or sent it: one a later release added reads as
    ``agent_error``."""
    if isinstance(value, str) and value not in REASONS:
        return FailureReason.AGENT_ERROR
    return value
