"""This worker's CPUs, GPUs, memory and disk, and handing them out to runs without sharing.

Each run gets its own CPU cores (``cpuset_cpus``) and its own GPUs (given to its container as
the host's GPU mode says: gpu_access.py), and sets aside the memory and disk it asks for out of
what the worker offers; a run that does not fit what is free now waits for it rather than
oversubscribing the worker.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from runplane.domain.units import format_bytes


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str = ""
    memory: int = 0  # bytes
    minor: int | None = None
    """The driver's minor number: the N of /dev/nvidiaN (None: unknown)."""


def _nvml_gpus() -> list[Gpu] | None:
    try:
        import pynvml  # nvidia-ml-py, optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            try:
                minor: int | None = int(pynvml.nvmlDeviceGetMinorNumber(handle))
            except pynvml.NVMLError:
                minor = None
            gpus.append(
                Gpu(
                    i,
                    uuid if isinstance(uuid, str) else uuid.decode(),
                    name if isinstance(name, str) else name.decode(),
                    memory,
                    minor,
                )
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Parse ``nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        memory = int(float(parts[3]) * 1024 * 1024) if parts[3].replace(".", "", 1).isdigit() else 0
        gpus.append(Gpu(int(parts[0]), parts[1], parts[2], memory))
    return gpus


def _smi_gpus(run: Callable[[list[str]], str] | None = None) -> list[Gpu] | None:
    if run is None:
        if shutil.which("nvidia-smi") is None:
            return None

        def run(cmd: list[str]) -> str:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout

    try:
        text = run(["nvidia-smi", "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"])
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(text)


def detect_gpus() -> list[Gpu]:
    """GPUs of this host through NVML, else nvidia-smi; none when neither answers. A GPU whose
    minor number NVML did not give takes the one the driver lists under /proc."""
    for probe in (_nvml_gpus, _smi_gpus):
        found = probe()
        if found is not None:
            return with_minors(found, driver_minors())
    return []


def driver_minors(root: str = "/proc/driver/nvidia/gpus") -> dict[str, int]:
    """GPU UUID -> minor number, from the driver's ``information`` file of each GPU."""
    minors: dict[str, int] = {}
    try:
        files = sorted(Path(root).glob("*/information"))
    except OSError:
        return minors
    for path in files:
        try:
            fields = dict(line.split(":", 1) for line in path.read_text().splitlines() if ":" in line)
        except (OSError, ValueError):
            continue
        uuid, minor = fields.get("GPU UUID", "").strip(), fields.get("Device Minor", "").strip()
        if uuid and minor.isdigit():
            minors[uuid] = int(minor)
    return minors


def with_minors(gpus: Sequence[Gpu], minors: dict[str, int]) -> list[Gpu]:
    return [g if g.minor is not None or g.uuid not in minors else replace(g, minor=minors[g.uuid]) for g in gpus]


def parse_set(text: str, what: str) -> list[str]:
    """'0-3,8' -> ['0','1','2','3','8']; GPU UUIDs pass through. Raises ValueError."""
    items: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part and not part.upper().startswith("GPU-") and part.replace("-", "").isdigit():
            low, high = (int(x) for x in part.split("-", 1))
            if low > high:
                raise ValueError(f"{what}: range {part!r} runs backwards")
            items += [str(i) for i in range(low, high + 1)]
        elif part.isdigit() or part.upper().startswith(("GPU-", "MIG-")):
            items.append(part)
        else:
            raise ValueError(f"{what}: {part!r} is not an index, a range like 0-3, or a GPU UUID")
    if len(set(items)) != len(items):
        raise ValueError(f"{what}: lists an entry twice")
    return items


def host_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def select_gpus(detected: Sequence[Gpu], gpuset: Sequence[str] | None) -> list[Gpu]:
    """The detected GPUs named by ``--gpuset`` (indices or UUIDs), or all. Raises ValueError."""
    if gpuset is None:
        return list(detected)
    chosen = []
    for item in gpuset:
        match = [g for g in detected if str(g.index) == item or g.uuid == item]
        if not match:
            found = ", ".join(f"{g.index}={g.uuid}" for g in detected) or "none"
            raise ValueError(f"--gpuset: GPU {item} is not on this host (detected: {found})")
        chosen.append(match[0])
    return chosen


# how often a wait for room that runs over still hold looks whether the worker is stopping
STOP_CHECK_SECONDS = 0.5


@dataclass(frozen=True)
class Allocation:
    """What one run holds on this worker, given back whole by ``Allocator.release``."""

    cpus: tuple[int, ...]
    gpus: tuple[Gpu, ...]
    memory: int = 0  # bytes set aside
    disk: int = 0  # bytes set aside

    def docker_kwargs(self, nano_cpus: int) -> dict[str, Any]:
        """What the container gets of the CPU: its own cores (its GPUs: ``gpu_access``)."""
        kwargs: dict[str, Any] = {"nano_cpus": nano_cpus}
        if self.cpus:
            kwargs["cpuset_cpus"] = ",".join(str(c) for c in self.cpus)
        return kwargs


@dataclass
class Allocator:
    """Hands out whole CPU cores and GPUs, and bytes of memory and disk, to runs; thread-safe;
    never shares. ``memory`` and ``disk`` are what this worker offers its runs in all; 0 leaves
    that one uncounted (a worker built without a pool's shape)."""

    cpus: list[int]
    gpus: list[Gpu] = field(default_factory=list)
    memory: int = 0
    disk: int = 0
    _used: dict[str, Allocation] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _leaving: set[str] = field(default_factory=set)  # names of what runs over hold until their files go
    _released: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self._released = threading.Condition(self._lock)

    def fits_at_all(self, cpus: float, gpus: int, memory: int | None = None, disk: int | None = None) -> str | None:
        """Why a run could never fit this worker, or None."""
        if math.ceil(cpus) > len(self.cpus):
            return f"asks {cpus:g} cpus; this worker has {len(self.cpus)}"
        if gpus > len(self.gpus):
            return f"asks {gpus} gpus; this worker has {len(self.gpus)}"
        if self.memory and (memory or 0) > self.memory:
            return f"asks {format_bytes(memory or 0)} memory; this worker has {format_bytes(self.memory)}"
        if self.disk and (disk or 0) > self.disk:
            return f"asks {format_bytes(disk or 0)} disk; this worker has {format_bytes(self.disk)}"
        return None

    def allocate(
        self, run_id: str, cpus: float, gpus: int, memory: int | None = None, disk: int | None = None
    ) -> Allocation | None:
        """Reserve cores, GPUs, memory and disk for ``run_id``; None if not enough is free right
        now. A run that asks no memory or disk (a record written before they were filled in)
        sets none aside."""
        with self._lock:
            return self._allocate(run_id, cpus, gpus, memory, disk)

    def wait_for_leaving(
        self, cpus: float, gpus: int, memory: int | None, disk: int | None, *, timeout: float, stop: threading.Event
    ) -> None:
        """When a run does not fit now but would once the runs that are over here give back what
        they still hold (their files being removed), wait for that: at most ``timeout`` seconds,
        and not past ``stop``. Reserves nothing."""
        deadline = time.monotonic() + timeout
        with self._released:
            while not stop.is_set() and self._allocate("", cpus, gpus, memory, disk, reserve=False) is None:
                left = deadline - time.monotonic()
                if (
                    left <= 0
                    or self._allocate("", cpus, gpus, memory, disk, ignoring=self._leaving, reserve=False) is None
                ):
                    return  # waited long enough, or what is leaving would not make room
                self._released.wait(min(left, STOP_CHECK_SECONDS))

    def _allocate(
        self,
        run_id: str,
        cpus: float,
        gpus: int,
        memory: int | None,
        disk: int | None,
        *,
        ignoring: set[str] | frozenset[str] = frozenset(),
        reserve: bool = True,
    ) -> Allocation | None:
        """``allocate`` under the lock, counting free what ``ignoring`` holds; ``reserve`` False
        only says whether it would fit."""
        need_cpus = max(1, math.ceil(cpus))
        need_memory = (memory or 0) if self.memory else 0
        need_disk = (disk or 0) if self.disk else 0
        used = [a for name, a in self._used.items() if name not in ignoring]
        used_cpus = {c for a in used for c in a.cpus}
        used_gpus = {g.uuid for a in used for g in a.gpus}
        free_cpus = [c for c in self.cpus if c not in used_cpus]
        free_gpus = [g for g in self.gpus if g.uuid not in used_gpus]
        if len(free_cpus) < need_cpus or len(free_gpus) < gpus:
            return None
        if need_memory > self.memory - sum(a.memory for a in used):
            return None
        if need_disk > self.disk - sum(a.disk for a in used):
            return None
        allocation = Allocation(tuple(free_cpus[:need_cpus]), tuple(free_gpus[:gpus]), need_memory, need_disk)
        if reserve:
            self._used[run_id] = allocation
        return allocation

    def release(self, run_id: str, *, keep_disk_as: str | None = None) -> None:
        """Give back all that ``run_id`` holds (nothing if it holds nothing); with
        ``keep_disk_as``, all but its disk, which stays set aside under that name until that is
        released in turn (the run's files are still there)."""
        with self._released:
            held = self._used.pop(run_id, None)
            self._leaving.discard(run_id)
            if keep_disk_as is not None and held is not None and held.disk:
                self._used[keep_disk_as] = Allocation((), (), disk=held.disk)
                self._leaving.add(keep_disk_as)
            self._released.notify_all()

    def free(self) -> tuple[int, int]:
        with self._lock:
            used_cpus = sum(len(a.cpus) for a in self._used.values())
            used_gpus = sum(len(a.gpus) for a in self._used.values())
        return len(self.cpus) - used_cpus, len(self.gpus) - used_gpus

    def free_bytes(self) -> tuple[int, int]:
        """Memory and disk not set aside now (0 where uncounted)."""
        with self._lock:
            memory = sum(a.memory for a in self._used.values())
            disk = sum(a.disk for a in self._used.values())
        return (self.memory - memory if self.memory else 0), (self.disk - disk if self.disk else 0)
