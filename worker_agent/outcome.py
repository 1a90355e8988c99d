"""How one attempt of a run ended, as its executor found it: the one source of its final state."""

from __future__ import annotations

from dataclasses import dataclass

from runplane.domain.states import FailureReason, RunState


@dataclass
class Outcome:
    """``state`` is what the run's final write records (``run_state.RunStateWriter.finish``);
    ``reason`` and ``message`` its failure, when it failed."""

    state: RunState
    reason: FailureReason | None = None
    message: str = ""
    exit_code: int | None = None
    upload: bool = True  # False: the outputs must not be read (over a limit, or the container may still run)
