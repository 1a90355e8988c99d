"""The error tree. Every error carries a stable ``code``; transports map codes to statuses."""

from __future__ import annotations

from typing import Any


class RunplaneError(Exception):
    """Root of every error runplane raises on purpose."""

    code = "internal"
    retryable = False

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class BadRequest(RunplaneError):
    """The request cannot be read (malformed JSON, wrong content)."""

    code = "bad_request"


class InvalidRequest(RunplaneError):
    """The request was read but its values are not acceptable."""

    code = "invalid_request"


class NotAllowed(InvalidRequest):
    """A well-formed request that policy refuses: a group that is not the caller's, a bucket the
    operator does not allow, a quota or a cap it would exceed."""

    code = "not_allowed"


class UnknownName(InvalidRequest):
    """A well-formed name that names nothing configured (a pool)."""

    code = "unknown_name"


class Unschedulable(RunplaneError):
    """This request could never run: no pool can fit it, or it waits for a run that cannot succeed."""

    code = "unschedulable"


class Unauthorized(RunplaneError):
    code = "unauthorized"


class Forbidden(RunplaneError):
    code = "forbidden"


class NotFound(RunplaneError):
    code = "not_found"


class Conflict(RunplaneError):
    """The request clashes with the current state (e.g. killing a finished run)."""

    code = "conflict"


class LastAdmin(Conflict):
    """Revoking this token would leave the stack with no administrator's token that has not expired."""

    code = "last_admin"


class PayloadTooLarge(RunplaneError):
    code = "payload_too_large"


class ConditionFailed(RunplaneError):
    """A conditional write lost: the stored record is not in the expected state."""

    code = "condition_failed"


class AlreadyExists(RunplaneError):
    code = "already_exists"


class LeaseLost(RunplaneError):
    """The worker no longer holds the run (re-queued, killed or taken by another attempt)."""

    code = "lease_lost"


class OutOfTime(RunplaneError):
    """The invocation is about to end: the work is left for another (its queue offers it again)."""

    code = "out_of_time"
    retryable = True


class BackendError(RunplaneError):
    """A cloud or compute service failed; usually worth a retry."""

    code = "backend_error"
    retryable = True


class Misconfigured(RunplaneError):
    """The stack's own settings cannot make a stack (a pool its backend refuses): nothing is served
    until its operator fixes them. The message is the one line that names what to fix."""

    code = "misconfigured"
