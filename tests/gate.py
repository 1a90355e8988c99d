"""A run that waits for its test: ``GATE`` in a run's command holds the run, still running, until
the test opens the gate (a file the test puts in the run's output directory, which the run then
removes). A test acts on a run that surely still runs, however slow the machine, where a ``sleep``
in the command would give it a window of a few seconds."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import wait_for

GO = ".go"
GATE = f"until [ -e {GO} ]; do sleep 0.05; done; rm {GO}"


def output_dir(agents_root: Path, run_id: str, attempt: int = 1) -> Path:
    """The output directory of ``run_id``'s ``attempt`` on whichever agent under ``agents_root``
    (the work dirs of a stack's agents, one per worker) took it."""
    found = wait_for(
        lambda: list(agents_root.glob(f"*/runs/{run_id}-{attempt}/output")),
        60,
        0.1,
        f"the directory of run {run_id} attempt {attempt}",
    )
    assert len(found) == 1, found
    return Path(found[0])


def open_gate(output: Path) -> None:
    """Let the run whose output directory is ``output`` go past its ``GATE``."""
    (output / GO).touch()
