"""What a run's container is made of (``containers.create`` keywords), its name, and the labels
by which the agent knows its containers."""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from docker.types import DriverConfig, LogConfig, Mount

from runplane.domain.checkpoints import CHECKPOINT_DIR, CHECKPOINT_ENV
from runplane.domain.runs import Run
from worker_agent.resources import Allocation
from worker_agent.run_config import ExecutorConfig
from worker_agent.users import DEFAULT_RUN_AS, RUN_HOME, RunAs

OUTPUT_MOUNT = "/runplane/output"
LABEL = "io.runplane"
CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID"]
"""What a root run keeps (only on a pool with ``allow_root``); a run that is not root gets none."""
DOCKER_LOG_FILES = 2
MAX_IMAGE_VOLUMES = 64
"""The most ``VOLUME`` paths an image of a run may declare (each is a directory and a mount)."""


def container_name(stack_id: str, run_id: str, attempt: int) -> str:
    """The name of a run's container: opaque, since every container on a run network learns the
    names of the others from Docker's DNS (a reverse lookup of an address answers it), and run
    ids are their owners' only. The agent computes it (a retried create) and finds its containers
    by their labels, which hold the run id."""
    digest = hashlib.sha256(f"{stack_id}\0{run_id}\0{attempt}".encode()).hexdigest()[:32]
    return f"runplane-{digest}"


def container_labels(container: Any) -> dict[str, str]:
    """A container's labels, from a listing (sparse) or an inspect alike."""
    attrs = container.attrs or {}
    labels = attrs.get("Labels") if "Labels" in attrs else (attrs.get("Config") or {}).get("Labels")
    return dict(labels or {})


def holds(run: Run, worker_id: str | None, attempt: int | str | None) -> bool:
    """Whether, as ``run`` was read from the store, worker ``worker_id`` holds its ``attempt``:
    only the container of that worker and attempt may run for it (one made by any other worker
    or attempt is no longer of use)."""
    held = worker_id is not None and run.worker_id == worker_id and str(run.attempt) == str(attempt)
    return held and not run.state.terminal


def container_spec(
    run: Run,
    image: str,
    config: ExecutorConfig,
    output_dir: Path,
    allocation: Allocation | None,
    inputs: dict[str, Path] | None = None,
    run_as: RunAs = DEFAULT_RUN_AS,
    home_dir: Path | None = None,
    *,
    inputs_on_safe_mount: bool = False,
    image_env: Mapping[str, str] | None = None,
    volumes: Mapping[str, Path] | None = None,
    secrets: Mapping[str, str] | None = None,
    checkpoint_dir: Path | None = None,
) -> dict[str, Any]:
    """Everything ``containers.create`` gets for ``run``: the command under ``sh -c`` as
    ``run_as`` (numbers), limits, the run's own cores and GPUs, and the hardening every run has.
    ``home_dir`` is mounted as HOME when ``run_as`` asks for one (and the run sets no HOME).
    Mounts are a list (``docker.types.Mount``), one per target: two inputs of the same source
    are two mounts. ``inputs_on_safe_mount``: the input paths are on a read-only nosuid,nodev
    mount (the inputs view), so they are bound without Docker's read-only, which runc applies by
    a remount that drops nosuid and nodev; read-only they stay, from the mount they come from.
    ``volumes``: the image's ``VOLUME`` paths, each to its directory in the run directory
    (``volume_mounts``); one at a path mounted already is left to that mount, as Docker does.
    ``secrets``: the values of the run's ``secrets`` variables, beside ``env`` in its
    environment (and nowhere else: not in a label, nor in the run directory). ``checkpoint_dir``:
    the run's checkpoint directory, mounted read-write at ``CHECKPOINT_DIR`` and named by
    ``$RUNPLANE_CHECKPOINT_DIR``. The working directory is the run's ``workdir``, else its output
    directory."""
    res = run.spec.resources
    env = {**run.spec.env, **(secrets or {})}
    env.update({"RUNPLANE_RUN_ID": run.id, "RUNPLANE_ATTEMPT": str(run.attempt), "RUNPLANE_OUTPUT": OUTPUT_MOUNT})
    if run.sweep_id is not None:
        env.update({"RUNPLANE_SWEEP_ID": run.sweep_id, "RUNPLANE_SWEEP_INDEX": str(run.sweep_index)})
    allocation = allocation or Allocation((), ())
    gpus = config.gpu_access.container_kwargs(allocation.gpus)
    env.update(config.gpu_access.environment(allocation.gpus, {**(image_env or {}), **run.spec.env}))
    mounts = [Mount(OUTPUT_MOUNT, str(output_dir), type="bind"), *gpus.pop("mounts", [])]
    if checkpoint_dir is not None:
        env[CHECKPOINT_ENV] = CHECKPOINT_DIR
        mounts.append(Mount(CHECKPOINT_DIR, str(checkpoint_dir), type="bind"))
    if run_as.home and home_dir is not None and "HOME" not in run.spec.env:
        env["HOME"] = run_as.home
        mounts.append(Mount(RUN_HOME, str(home_dir), type="bind"))
    for name, path in sorted((inputs or {}).items()):
        mounts.append(Mount(f"/inputs/{name}", str(path), type="bind", read_only=not inputs_on_safe_mount))
    mounts += volume_mounts(volumes or {}, {posixpath.normpath(m["Target"]) for m in mounts})
    spec: dict[str, Any] = {
        "image": image,
        "entrypoint": ["/bin/sh", "-c"],
        "command": [run.spec.command],
        "name": container_name(config.stack_id, run.id, run.attempt),
        "working_dir": run.spec.workdir or OUTPUT_MOUNT,
        "environment": env,
        "mounts": mounts,
        # every run starts without a network; a networked one gets its run network from
        # RunNetwork.release once its rules are in (network.py)
        "network_mode": "none",
        "mem_limit": res.memory,
        "memswap_limit": res.memory,
        "pids_limit": config.pids_limit,
        "user": run_as.user,
        "cap_drop": ["ALL"],
        "cap_add": CAPABILITIES if run_as.root else [],
        "security_opt": ["no-new-privileges"],
        "privileged": False,
        "labels": {
            f"{LABEL}.run_id": run.id,
            f"{LABEL}.attempt": str(run.attempt),
            f"{LABEL}.worker_id": config.worker_id,
            f"{LABEL}.stack": config.stack_id,
        },
        # the agent ships the output itself (attached); Docker's own copy stays small
        "log_config": LogConfig(
            type="json-file", config={"max-size": config.docker_log_size, "max-file": str(DOCKER_LOG_FILES)}
        ),
        "detach": True,
        **allocation.docker_kwargs(int(res.cpus * 1e9)),
        **gpus,
    }
    if config.shm_size:
        spec["shm_size"] = config.shm_size
    if run.spec.interactive:  # its input from whoever attaches, through the one attach of its stdin the
        # agent holds (sessions/attach.py ``Input``); without a terminal not detached: the engine's
        # StdinOnce, so the end of that attach's input (an EOF from a client) is the command's
        spec.update(stdin_open=True, tty=run.spec.tty, detach=run.spec.tty)
    return spec


def image_volumes(attrs: Mapping[str, Any]) -> list[str]:
    """The paths an image declares with ``VOLUME`` (its ``Config.Volumes``), in order."""
    declared = (attrs.get("Config") or {}).get("Volumes") or {}
    return sorted(str(path) for path in declared) if isinstance(declared, Mapping) else []


def volume_mounts(volumes: Mapping[str, Path], taken: set[str]) -> list[Mount]:
    """A mount for each of an image's ``VOLUME`` paths not in ``taken``: an anonymous volume of
    the local driver whose data is ``volumes[path]``, a directory in the run directory. Docker
    would make each a volume of its own under its data root, outside the run's disk limit and
    kept when the container goes; bound into the run directory, what the run writes there counts
    against ``disk`` and goes with the run. Still a volume (not a bind), the engine copies what
    the image holds at the path into it on start, ownership and mode too, as for any volume; and
    an anonymous one, it goes with its container (``remove(v=True)``)."""
    mounts, taken = [], set(taken)
    for target, source in sorted(volumes.items()):
        if posixpath.normpath(target) in taken:
            continue
        taken.add(posixpath.normpath(target))
        driver = DriverConfig("local", {"type": "none", "o": "bind", "device": str(source)})
        mounts.append(Mount(target, None, type="volume", driver_config=driver))
    return mounts


def image_environment(attrs: Mapping[str, Any]) -> dict[str, str]:
    """The variables an image sets (its ``Config.Env``, ``NAME=value`` each)."""
    pairs = ((attrs.get("Config") or {}).get("Env")) or []
    return dict(p.split("=", 1) for p in pairs if isinstance(p, str) and "=" in p)


def on_read_only_safe_mount(path: Path) -> bool:
    """Whether ``path`` lies on a read-only, nosuid, nodev mount (the input cache's view)."""
    try:
        flags = os.statvfs(path).f_flag
    except OSError:
        return False
    return flags & (os.ST_RDONLY | os.ST_NOSUID | os.ST_NODEV) == os.ST_RDONLY | os.ST_NOSUID | os.ST_NODEV
