"""What ``Run`` and ``AsyncRun`` share: the run as last read, and access to its fields."""

from __future__ import annotations

from typing import Any

from runplane.api.models import RetentionView, RunCheckpoint, RunFailure, RunView, SweepView
from runplane.domain.states import TERMINAL_STATES, RunState


class _Viewed:
    """A record as last read (``.view``), whose fields read as its own attributes; ``created``:
    this client's request made it (False: an Idempotency-Key named an earlier one, or it was read)."""

    view: Any
    created: bool

    def __init__(self, view: Any, created: bool = False) -> None:
        self.view = view
        self.created = created

    def __getattr__(self, name: str) -> Any:
        # only called for names the record itself lacks; "view" is looked up on the instance so
        # that a half-built object (copy, pickle) does not recurse
        if name.startswith("__") or "view" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["view"], name)


class RunBase(_Viewed):
    """A run as last read (``.view``, a RunView). Its fields read as the run's own attributes
    (``run.id``, ``run.state``, ``run.exit_code``, ``run.failure``, ``run.waiting_reason``, ...);
    ``refresh`` reads it again. ``created``: ``submit`` made it (False: its Idempotency-Key
    named an earlier run, or it was read rather than submitted)."""

    view: RunView

    def __init__(self, view: RunView, created: bool = False) -> None:
        super().__init__(view, created)

    @property
    def id(self) -> str:
        return self.view.id

    @property
    def state(self) -> RunState:
        return self.view.state

    @property
    def exit_code(self) -> int | None:
        return self.view.exit_code

    @property
    def failure(self) -> RunFailure | None:
        return self.view.failure

    @property
    def waiting_reason(self) -> str | None:
        return self.view.waiting_reason

    @property
    def retention(self) -> RetentionView | None:
        """How long its outputs, logs and record are kept, and whether it is kept (None: it has not
        ended and is not kept, or a server older than retention)."""
        return self.view.retention

    @property
    def checkpoint(self) -> RunCheckpoint | None:
        """Its newest checkpoint as its record says (None: none synced yet, or a server older than
        checkpoints); its files: ``checkpoint_files``."""
        return self.view.checkpoint

    @property
    def labels(self) -> dict[str, str]:
        """Its labels (``spec.labels``)."""
        return self.view.spec.labels

    @property
    def done(self) -> bool:
        """The run has ended: succeeded, failed, killed or timed_out."""
        return self.view.state in TERMINAL_STATES

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.view.id!r}, state={str(self.view.state)!r})"


class SweepBase(_Viewed):
    """A sweep as last read (``.view``, a SweepView); its fields read as its own attributes
    (``sweep.id``, ``sweep.counts``, ``sweep.failures``, ``sweep.waiting``, ...)."""

    view: SweepView

    def __init__(self, view: SweepView, created: bool = False) -> None:
        super().__init__(view, created)

    @property
    def id(self) -> str:
        return self.view.id

    @property
    def done(self) -> bool:
        """Every member's latest try has ended."""
        return self.view.finished_at is not None

    def __repr__(self) -> str:
        counts = ", ".join(f"{state}={n}" for state, n in sorted(self.view.counts.items()))
        return f"{type(self).__name__}(id={self.view.id!r}, size={self.view.size}, {counts})"
