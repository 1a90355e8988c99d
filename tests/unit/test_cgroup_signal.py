"""A signal sent to every process a container's cgroup lists, and to no other: real processes,
listed in a cgroup tree laid out as the engine's (v2, systemd driver) under a directory of the test's."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from worker_agent.cgroup_signal import cgroup_dir, signal_cgroup, signal_number

CONTAINER = "c0ffee" * 10


def test_every_listed_process_is_signalled_and_no_other(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    scope = tmp_path / "system.slice" / f"docker-{CONTAINER}.scope"
    (scope / "nested").mkdir(parents=True)
    inside, nested, outside = (subprocess.Popen(["sleep", "60"]) for _ in range(3))
    try:
        (scope / "cgroup.procs").write_text(f"{inside.pid}\n0\n")  # 0: a process of another pid namespace
        (scope / "nested" / "cgroup.procs").write_text(f"{nested.pid}\n")
        assert cgroup_dir(CONTAINER, tmp_path) == scope
        assert signal_cgroup(CONTAINER, signal.SIGTERM, tmp_path) == 2
        assert inside.wait(10) == -signal.SIGTERM and nested.wait(10) == -signal.SIGTERM
        assert outside.poll() is None  # never listed: never signalled
    finally:
        for p in (inside, nested, outside):
            p.kill()
            p.wait()


def test_a_cgroup_not_seen_here_says_so(tmp_path: Path) -> None:
    assert signal_cgroup(CONTAINER, signal.SIGTERM, tmp_path) is None  # the caller falls back to the engine's kill


@pytest.mark.parametrize(
    ("name", "number"), [("SIGUSR1", signal.SIGUSR1), ("usr2", signal.SIGUSR2), ("15", 15), ("SIGNOPE", None)]
)
def test_signal_names_as_the_engine_takes_them(name: str, number: int | None) -> None:
    assert signal_number(name) == number
