"""A container's cpu time and peak memory, read from its cgroup (v1 or v2) or the Docker API, and
what a run used in all (``Meter``); the size of what a run wrote, by walking directories."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runplane.domain.accounting import Rates, charge
from runplane.domain.asks import Resources
from runplane.domain.runs import Usage
from worker_agent.trees import Unwalkable, scan

CGROUP_ROOT = Path("/sys/fs/cgroup")
_ASK_EVERY = 512  # entries walked between two looks at ``cancelled`` (a few milliseconds)


@dataclass
class Sample:
    cpu_seconds: float | None = None
    memory_peak: int | None = None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _v2_dirs(container_id: str, root: Path) -> list[Path]:
    return [root / "system.slice" / f"docker-{container_id}.scope", root / "docker" / container_id]


def read_cgroup(container_id: str, root: Path = CGROUP_ROOT) -> Sample | None:
    """Usage from the cgroup files, or None if they are not visible here."""
    if (root / "cgroup.controllers").exists():  # v2
        for d in _v2_dirs(container_id, root):
            if d.is_dir():
                cpu = None
                try:
                    stat = dict(line.split() for line in (d / "cpu.stat").read_text().splitlines())
                    cpu = int(stat["usage_usec"]) / 1e6
                except (OSError, KeyError, ValueError):
                    pass
                peak = _read_int(d / "memory.peak") or _read_int(d / "memory.current")
                return Sample(cpu, peak)
        return None
    for parent in ("docker", "system.slice"):
        mem = root / "memory" / parent / container_id
        if mem.is_dir() or (root / "memory" / parent / f"docker-{container_id}.scope").is_dir():
            if not mem.is_dir():
                mem = root / "memory" / parent / f"docker-{container_id}.scope"
            cpu_dir = Path(str(mem).replace("/memory/", "/cpuacct/", 1))
            cpu_ns = _read_int(cpu_dir / "cpuacct.usage")
            return Sample(cpu_ns / 1e9 if cpu_ns is not None else None, _read_int(mem / "memory.max_usage_in_bytes"))
    return None


def from_stats(stats: dict[str, Any]) -> Sample:
    """Usage from one Docker stats document (works on v1 and v2 hosts)."""
    cpu = stats.get("cpu_stats", {}).get("cpu_usage", {}).get("total_usage")
    mem = stats.get("memory_stats", {})
    peak = mem.get("max_usage") or mem.get("usage")
    return Sample(cpu / 1e9 if cpu else None, int(peak) if peak else None)


class Meter:
    """What a run used, in ``usage``: the figures of its earlier attempts (``before``), carried on,
    plus this attempt's as sampled and charged. ``usage`` is one object, updated in place: the
    heartbeat records it as it is."""

    def __init__(self, before: Usage) -> None:
        self.before = Usage(cpu_seconds=before.cpu_seconds, gpu_seconds=before.gpu_seconds, cost=before.cost)
        self.usage = self.before.model_copy(deep=True)

    def sample(self, sample: Sample | None) -> None:
        if sample is None:
            return
        if sample.cpu_seconds is not None:
            self.usage.cpu_seconds = round((self.before.cpu_seconds or 0.0) + sample.cpu_seconds, 3)
        if sample.memory_peak is not None:
            self.usage.memory_peak = max(self.usage.memory_peak or 0, sample.memory_peak)

    def charge(self, resources: Resources, rates: Rates, ran: float) -> None:
        """Record GPU-seconds and cost of earlier attempts plus ``ran`` seconds of this one."""
        gpu_seconds, cost = charge(resources, rates, ran)
        self.usage.gpu_seconds = round((self.before.gpu_seconds or 0.0) + gpu_seconds, 3)
        if cost is not None:
            self.usage.cost = (self.before.cost or 0.0) + cost


@dataclass
class Tree:
    """What a walk of a directory found: ``size`` is the apparent size of everything in it but
    directories (a sparse file counts in full: it uploads in full), ``entries`` counts every
    file, directory and link. ``stopped``: the walk gave up early, past a limit or when asked.
    ``unreadable``: why part of the tree could not be read (then what it holds is unknown, and
    the counts are no bound at all)."""

    size: int = 0
    entries: int = 0
    stopped: bool = False
    unreadable: str | None = None


def walk(
    root: Path | str,
    max_size: int | None = None,
    max_entries: int | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Tree:
    """Walk ``root`` through directory descriptors (trees.scan: symlinks never followed, one
    file system, at most MAX_DEPTH deep), stopping as soon as it is past ``max_size`` bytes or
    ``max_entries`` entries, or ``cancelled()`` says so (asked every _ASK_EVERY entries): that is all a
    limit check needs, and it bounds the cost."""
    tree = Tree()
    listing = scan(root)
    try:
        for _, entry in listing:
            tree.entries += 1
            try:
                if not entry.is_dir(follow_symlinks=False):
                    tree.size += entry.stat(follow_symlinks=False).st_size
            except OSError:  # gone meanwhile
                pass
            if (
                (max_size is not None and tree.size > max_size)
                or (max_entries is not None and tree.entries > max_entries)
                or (cancelled is not None and tree.entries % _ASK_EVERY == 0 and cancelled())
            ):
                tree.stopped = True
                return tree
    except Unwalkable as e:
        tree.unreadable = str(e)
    finally:
        listing.close()
    return tree


def dir_size(root: Path, stop_after: int | None = None) -> int:
    """Apparent bytes of the files under ``root`` (symlinks not followed)."""
    return walk(root, max_size=stop_after).size
