"""How a run's GPUs reach its container, in one of three ways the host may offer:

* ``nvidia-runtime``: a Docker device request for the ``nvidia`` driver naming the run's GPUs (the
  engine calls the NVIDIA container toolkit's hook, which adds the device nodes and the driver's
  libraries);
* ``cdi``: a device request for the ``cdi`` driver naming ``nvidia.com/gpu=<uuid>`` (an engine
  that reads Container Device Interface specs: Docker 25 and newer with CDI on, or any other
  CDI-aware engine; the spec is made per host by ``nvidia-ctk cdi generate``, and must name GPUs
  by UUID: an index is the host's, which an agent inside a Slurm job or a pod may not see);
* ``devices``: no runtime at all: the run's own ``/dev/nvidiaN`` nodes (N the GPU's minor number,
  from NVML or the driver, never guessed), the shared control nodes (``nvidiactl`` and
  ``nvidia-uvm``, and ``nvidia-uvm-tools``, ``nvidia-modeset`` where present), and the driver's
  user-space libraries and tools bound read-only under ``/usr/local/nvidia``.

``choose`` settles ``--gpu-mode`` (``auto`` takes the first of the three that works here, in that
order) from facts gathered once at start (``HostFacts``) and, given a ``probe``, a test container
the engine must start with the mode's request; ``GpuAccess`` then gives each run's container what
its mode needs. In every mode a run sees its own GPUs' device nodes only, and
``NVIDIA_VISIBLE_DEVICES`` (and, but for the runtime mode, ``CUDA_VISIBLE_DEVICES``) names the
GPUs it was given, whatever the run set them to.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from worker_agent.resources import Gpu

Mode = Literal["nvidia-runtime", "cdi", "devices"]
MODES: tuple[Mode, ...] = ("nvidia-runtime", "cdi", "devices")
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
DRIVER_LIBRARIES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-opencl.so",
    "libnvidia-cfg.so",
    "libnvidia-allocator.so",
)
"""The compute and utility libraries of the driver (each under its soname, ``libcuda.so.1`` ...)."""
DRIVER_TOOLS = ("nvidia-smi", "nvidia-debugdump")
LIB_DIR = "/usr/local/nvidia/lib64"
BIN_DIR = "/usr/local/nvidia/bin"
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
HOOK = "nvidia-container-runtime-hook"
REQUIRED_NODES = ("nvidiactl", "nvidia-uvm")


class GpuModeError(ValueError):
    """``--gpu-mode`` names a mode this host cannot serve (the message says what is missing)."""


@dataclass(frozen=True)
class DriverFile:
    host: str
    container: str


@dataclass(frozen=True)
class GpuAccess:
    mode: Mode = "nvidia-runtime"
    dev_dir: str = "/dev"
    control_nodes: tuple[str, ...] = ()
    """The control nodes present under ``dev_dir`` (``devices`` mode)."""
    driver_files: tuple[DriverFile, ...] = ()
    """The driver's libraries and tools to bind read-only (``devices`` mode)."""

    def container_kwargs(self, gpus: Sequence[Gpu]) -> dict[str, Any]:
        """What ``containers.create`` gets for ``gpus`` (nothing for none)."""
        if not gpus:
            return {}
        from docker.types import DeviceRequest, Mount

        if self.mode == "nvidia-runtime":
            ids = [g.uuid for g in gpus]
            return {"device_requests": [DeviceRequest(driver="nvidia", device_ids=ids, capabilities=[["gpu"]])]}
        if self.mode == "cdi":
            return {"device_requests": [DeviceRequest(driver="cdi", device_ids=[cdi_name(g) for g in gpus])]}
        if any(g.minor is None for g in gpus):
            raise ValueError("devices mode needs each GPU's minor number")  # choose() never allows it
        nodes = [f"nvidia{g.minor}" for g in gpus] + list(self.control_nodes)
        return {
            "devices": [f"{self.dev_dir}/{name}:/dev/{name}:rw" for name in nodes],
            "mounts": [Mount(f.container, f.host, type="bind", read_only=True) for f in self.driver_files],
        }

    def environment(self, gpus: Sequence[Gpu], inherited: Mapping[str, str]) -> dict[str, str]:
        """The variables that name the run's GPUs (``inherited``: the image's and the run's own)."""
        if not gpus:
            return {"NVIDIA_VISIBLE_DEVICES": "void"}  # even where nvidia is the engine's default runtime
        ids = ",".join(g.uuid for g in gpus)
        env = {"NVIDIA_VISIBLE_DEVICES": ids}
        if self.mode != "nvidia-runtime":
            env["CUDA_VISIBLE_DEVICES"] = ids
        if self.mode == "devices" and self.driver_files:
            own = inherited.get("LD_LIBRARY_PATH")
            env["LD_LIBRARY_PATH"] = f"{own}:{LIB_DIR}" if own else LIB_DIR
        return env

    def describe(self) -> str:
        if self.mode != "devices":
            return self.mode
        tools = [Path(f.container).name for f in self.driver_files if f.container.startswith(BIN_DIR)]
        return (
            f"devices ({self.dev_dir}/nvidiaN with {', '.join(self.control_nodes) or 'no control node'}; "
            f"{len(self.driver_files) - len(tools)} driver libraries in {LIB_DIR}, tools {', '.join(tools) or 'none'} "
            f"in {BIN_DIR})"
        )


def cdi_name(gpu: Gpu) -> str:
    return f"nvidia.com/gpu={gpu.uuid}"


@dataclass(frozen=True)
class HostFacts:
    """What decides the GPU mode, read once at start (``gather``), or given by a test."""

    runtimes: tuple[str, ...] = ()
    """The engine's runtimes (``docker info``); ``nvidia`` where the toolkit configured it."""
    hook: str | None = None
    """The NVIDIA container toolkit's hook, if on PATH (what the engine's ``nvidia`` driver calls)."""
    engine_version: str = ""
    cdi_enabled: bool = False
    """The engine reads CDI specs (Docker reports its spec directories once CDI is on)."""
    cdi_gpus: tuple[str, ...] = ()
    """Device names of kind nvidia.com/gpu found in the CDI spec directories."""
    dev_dir: str = "/dev"
    dev_nodes: tuple[str, ...] = ()
    """Names of the nvidia* nodes under ``dev_dir``."""
    libraries: Mapping[str, str] = field(default_factory=dict)
    """soname -> host path of each driver library found."""
    tools: Mapping[str, str] = field(default_factory=dict)
    """name -> host path of each driver tool found."""


Probe = Callable[[dict[str, Any]], str | None]
"""Starts a throwaway container with these extra arguments; None if the engine started it, else
the engine's words."""


def choose(requested: str, gpus: Sequence[Gpu], facts: HostFacts, probe: Probe | None = None) -> GpuAccess:
    """The access for ``--gpu-mode requested`` on a host with ``facts``: a mode the facts allow
    and, given ``probe``, for which the engine starts a test container with the first GPU. A named
    mode that does not work here raises GpuModeError saying why; ``auto`` takes the first that
    works, and raises (with each mode's reason) when none does."""
    if requested != "auto" and requested not in MODES:
        raise GpuModeError(f"--gpu-mode: {requested!r} is not one of auto, {', '.join(MODES)}")
    reasons = []
    for mode in MODES if requested == "auto" else (requested,):
        problem = _problem(mode, gpus, facts)  # type: ignore[arg-type]
        access = _access(mode, facts)  # type: ignore[arg-type]
        if problem is None and probe is not None:
            refused = probe(access.container_kwargs(gpus[:1]))
            problem = None if refused is None else f"the engine refused a test container with it: {refused}"
        if problem is None:
            return access
        reasons.append(f"{mode}: {problem}")
    if requested != "auto":
        raise GpuModeError(f"--gpu-mode {reasons[0]}")
    raise GpuModeError("no GPU mode works on this host: " + "; ".join(reasons))


def _problem(mode: Mode, gpus: Sequence[Gpu], facts: HostFacts) -> str | None:
    if mode == "nvidia-runtime":
        if "nvidia" in facts.runtimes or facts.hook:
            return None
        return f"the engine has no nvidia runtime and {HOOK} is not on PATH"
    if mode == "cdi":
        major = _major(facts.engine_version)
        if major is not None and major < 25:
            return f"Docker {facts.engine_version} reads no CDI specs (25 or newer does)"
        if not facts.cdi_enabled:
            return 'the engine has CDI off (Docker: "features": {"cdi": true} in daemon.json)'
        missing = [g.uuid for g in gpus if cdi_name(g) not in facts.cdi_gpus]
        if missing:
            return (
                f"no CDI spec in {' or '.join(CDI_DIRS)} names {', '.join(missing)} by UUID "
                "(nvidia-ctk cdi generate --device-name-strategy=uuid)"
            )
        return None
    unknown = [g.uuid for g in gpus if g.minor is None]
    if unknown:
        return f"the minor number of {', '.join(unknown)} is unknown (neither NVML nor /proc/driver/nvidia gave it)"
    missing_nodes = [f"nvidia{g.minor}" for g in gpus if f"nvidia{g.minor}" not in facts.dev_nodes]
    missing_nodes += [n for n in REQUIRED_NODES if n not in facts.dev_nodes]
    if missing_nodes:
        hint = " (nvidia-modprobe -u -c=0 makes the control nodes)" if set(missing_nodes) & set(REQUIRED_NODES) else ""
        return f"no {', '.join(facts.dev_dir + '/' + n for n in missing_nodes)}{hint}"
    if "libcuda.so.1" not in facts.libraries:
        return "no libcuda.so.1 in the loader cache or --gpu-driver-dir"
    return None


def _major(version: str) -> int | None:
    found = re.match(r"(\d+)\.", version)
    return int(found.group(1)) if found else None


def _access(mode: Mode, facts: HostFacts) -> GpuAccess:
    if mode != "devices":
        return GpuAccess(mode)
    files = [DriverFile(host, f"{LIB_DIR}/{soname}") for soname, host in sorted(facts.libraries.items())]
    files += [DriverFile(host, f"{BIN_DIR}/{name}") for name, host in sorted(facts.tools.items())]
    control = tuple(n for n in CONTROL_NODES if n in facts.dev_nodes)
    return GpuAccess("devices", facts.dev_dir, control, tuple(files))


# ---- reading the host -----------------------------------------------------------------------


def gather(
    engine_info: Mapping[str, Any],
    engine_version: str,
    *,
    dev_dir: str = "/dev",
    driver_dir: str | None = None,
    cdi_dirs: Iterable[str] = CDI_DIRS,
    loader_cache: Callable[[], str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
) -> HostFacts:
    """The facts ``choose`` needs, from the engine's ``info`` and ``version``, the device nodes, the
    CDI spec directories, and the driver's files (in ``driver_dir``, else the loader cache)."""
    spec_dirs = list(engine_info.get("CDISpecDirs") or [])
    try:
        nodes = tuple(sorted(p.name for p in Path(dev_dir).iterdir() if p.name.startswith("nvidia")))
    except OSError:
        nodes = ()
    if driver_dir is not None:
        libraries, tools = driver_files_in(Path(driver_dir))
    else:
        libraries = libraries_from_cache((loader_cache or _ldconfig)())
        tools = {name: path for name in DRIVER_TOOLS if (path := which(name))}
    return HostFacts(
        runtimes=tuple(sorted((engine_info.get("Runtimes") or {}).keys())),
        hook=which(HOOK),
        engine_version=engine_version,
        cdi_enabled=bool(spec_dirs),
        cdi_gpus=tuple(sorted(cdi_devices(spec_dirs or list(cdi_dirs)))),
        dev_dir=dev_dir,
        dev_nodes=nodes,
        libraries=libraries,
        tools=tools,
    )


def _ldconfig() -> str:
    for binary in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            return subprocess.run([binary, "-p"], capture_output=True, text=True, timeout=10, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            continue
    return ""


def libraries_from_cache(text: str) -> dict[str, str]:
    """soname -> path of the driver's libraries in ``ldconfig -p`` output (the 64-bit ones)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)", line)
        if not match:
            continue
        soname, flags, path = match.groups()
        if "64" not in flags or not any(soname.startswith(lib + ".") for lib in DRIVER_LIBRARIES):
            continue
        found.setdefault(soname, path)
    return found


def driver_files_in(directory: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The driver's libraries (each soname found, as ``lib*.so.N`` files or links) and tools in
    ``directory`` (and its ``lib64``, ``lib`` and ``bin``)."""
    libraries: dict[str, str] = {}
    tools: dict[str, str] = {}
    for where in (directory, directory / "lib64", directory / "lib", directory / "bin"):
        try:
            entries = sorted(where.iterdir())
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            if name in DRIVER_TOOLS and os.access(entry, os.X_OK):
                tools.setdefault(name, os.path.realpath(entry))
            elif any(re.fullmatch(re.escape(lib) + r"\.\d+", name) for lib in DRIVER_LIBRARIES):
                libraries.setdefault(name, os.path.realpath(entry))  # the file a link names, bound as itself
    return libraries, tools


def cdi_devices(directories: Iterable[str]) -> set[str]:
    """``kind=name`` of every device in the CDI specs (JSON, or YAML where PyYAML is at hand)."""
    names: set[str] = set()
    for directory in directories:
        try:
            files = sorted(Path(directory).iterdir())
        except OSError:
            continue
        for path in files:
            spec = _read_spec(path)
            if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str):
                continue
            for device in spec.get("devices") or []:
                if isinstance(device, dict) and isinstance(device.get("name"), str):
                    names.add(f"{spec['kind']}={device['name']}")
    return names


def _read_spec(path: Path) -> Any:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except ValueError:
            return None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml

            return yaml.safe_load(text)
        except Exception:
            return None
    return None
