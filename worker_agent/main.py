"""``runplane-agent``: the command line of the worker agent. Every flag can also be set by an
environment variable RUNPLANE_AGENT_<FLAG> (for AMIs, Batch jobs, pods and Slurm jobs)."""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

from runplane.domain.errors import RunplaneError
from runplane.domain.models import NAME_PATTERN
from runplane.domain.units import parse_bytes, parse_duration
from worker_agent.preemption import PreemptionWatcher, make_probe
from worker_agent.resources import detect_gpus, host_cpus, parse_set, select_gpus
from worker_agent.workdir import WorkDir, WorkDirError, engine_shares_our_mounts, prepare

FLAGS: list[tuple[str, type | None, object, str]] = [
    # name, parser, default, help
    ("pool", str, None, "pool whose queue this worker serves (required)"),
    ("id", str, None, "worker id (default: host name plus a random suffix)"),
    ("slots", int, 1, "runs at the same time"),
    ("work-dir", str, "~/.runplane/agent", "where run directories and the input cache live (may be shared)"),
    ("max-work-dir-size", str, None, "evict cached inputs, least recently used first, above this size, e.g. 100g"),
    ("max-image-cache-size", str, None, "remove images runs used, least recently used first, above this size"),
    ("cpuset", str, None, "CPU cores runs may use, e.g. 0-7,16 (default: all this process may use)"),
    ("gpuset", str, None, "GPUs runs may use, as indices or UUIDs, e.g. 0,1 (default: all detected)"),
    ("memory", str, None, "memory to advertise, e.g. 64g (default: all)"),
    ("tag", str, None, "also take runs that ask for this tag (only those with --tag-exclusive)"),
    ("group", str, None, "take only runs of members of this group (a group's own machines)"),
    ("idle-seconds", str, None, "exit after this long with no run (e.g. 300, 5m)"),
    ("exit-after-num-runs", int, None, "exit after taking this many runs"),
    ("heartbeat-seconds", float, 5.0, "how often to renew leases and report"),
    ("lease-seconds", float, 30.0, "how long a run stays ours without a heartbeat"),
    ("poll-seconds", float, 5.0, "queue long-poll time"),
    ("kill-poll-seconds", float, 1.0, "how often a running run checks for a kill request"),
    ("upload-deadline-seconds", float, 300.0, "the most time outputs may take to upload"),
    (
        "network-mode",
        str,
        "runplane-runs",
        "Docker network for runs that ask for a network, closed off from the cloud's metadata service "
        "and this host (runplane-runs: a bridge, made if missing); host or none: such runs are refused",
    ),
    ("pull", str, "missing", "pull images that are missing ('missing') or never ('never')"),
    ("shm-size", str, None, "size of /dev/shm in run containers, e.g. 1g"),
    (
        "run-user",
        str,
        "nobody",
        "who runs commands, in numbers from the image's /etc/passwd and /etc/group: nobody (the image's USER "
        "unless it is root in any spelling, then 65534:65534), image (the image's USER, root too where the pool "
        "has allow_root), or UID[:GID]; uid 0 only where the pool has allow_root, gid 0 never for other uids",
    ),
    (
        "docker-log-size",
        str,
        "10m",
        "cap of Docker's own log file of a run container (two are kept); the agent ships the output itself",
    ),
    ("log-upload-prefix", str, None, "upload this agent's own log to object storage under this prefix"),
    ("preemption-watch", str, None, "watch for spot/preemption notices: ec2, azure or an http(s) URL"),
    ("metadata-url", str, "http://169.254.169.254", "instance metadata endpoint for --preemption-watch"),
    ("log-level", str, "INFO", "DEBUG, INFO, WARNING or ERROR"),
]
SWITCHES = [
    ("tag-exclusive", "take only runs that ask for --tag, none of the untagged ones"),
    ("pass-down-termination", "on SIGTERM stop running runs and re-queue them before exiting"),
    ("exit-on-exception", "exit (status 1) on an unexpected error instead of retrying with backoff"),
    ("preemptible", "this machine may vanish (spot): losing it does not use up one of a run's attempts"),
    (
        "allow-suid-work-dir",
        "start even where run directories cannot be put on a nosuid,nodev mount (setuid files and device nodes "
        "runs leave there then work for users of this host)",
    ),
    (
        "prepare-work-dir",
        "only make this worker's nosuid,nodev work-dir mounts and exit, leaving them (for a privileged "
        "ExecStartPre of a sandboxed service, or a host's boot script)",
    ),
]


class UsageError(Exception):
    pass


def _env_name(flag: str) -> str:
    return "RUNPLANE_AGENT_" + flag.upper().replace("-", "_")


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="runplane-agent", description=__doc__)
    for name, kind, default, text in FLAGS:
        env = os.environ.get(_env_name(name))
        parser.add_argument(
            f"--{name}", type=str, default=env if env is not None else default, help=f"{text} [env {_env_name(name)}]"
        )
        del kind
    for name, text in SWITCHES:
        env_on = os.environ.get(_env_name(name), "").lower() in ("1", "true", "yes")
        parser.add_argument(f"--{name}", action="store_true", default=env_on, help=f"{text} [env {_env_name(name)}]")
    args = parser.parse_args(list(argv))
    for name, kind, _default, _text in FLAGS:
        attr = name.replace("-", "_")
        value = getattr(args, attr)
        if value is None or kind is str:
            continue
        try:
            converted = kind(value) if kind is not None else value
        except ValueError as e:
            raise UsageError(f"--{name}: {value!r} is not a valid {kind.__name__ if kind else 'value'}") from e
        setattr(args, attr, converted)
    _validate(args)
    return args


def _validate_routing(args: argparse.Namespace) -> None:
    for name in ("tag", "group"):
        value = getattr(args, name)
        if value is not None and not re.fullmatch(NAME_PATTERN, value):
            raise UsageError(f"--{name}: {value!r} is not a valid name (lower-case letters, digits and -)")
    if args.tag_exclusive and not args.tag:
        raise UsageError("--tag-exclusive needs --tag")


def _validate(args: argparse.Namespace) -> None:
    """Check and convert the values argparse leaves as strings. Raises UsageError."""
    if not args.pool:
        raise UsageError("--pool is required (or set RUNPLANE_AGENT_POOL)")
    if args.slots < 1:
        raise UsageError("--slots must be at least 1")
    if args.preemption_watch:
        try:
            make_probe(args.preemption_watch, args.metadata_url)
        except ValueError as e:
            raise UsageError(str(e)) from e
    if args.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise UsageError("--log-level must be DEBUG, INFO, WARNING or ERROR")
    if args.run_user not in ("nobody", "image") and not re.fullmatch(r"\d+(:\d+)?", args.run_user):
        raise UsageError("--run-user must be nobody, image, or UID[:GID]")
    _validate_routing(args)
    if args.pull not in ("missing", "never"):
        raise UsageError("--pull must be 'missing' or 'never'")
    for name in ("heartbeat_seconds", "lease_seconds", "poll_seconds", "kill_poll_seconds", "upload_deadline_seconds"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    if args.heartbeat_seconds * 2 > args.lease_seconds:
        raise UsageError("--lease-seconds must be at least twice --heartbeat-seconds")
    try:
        args.idle_seconds = parse_duration(args.idle_seconds) if args.idle_seconds else None
        args.memory = parse_bytes(args.memory) if args.memory else None
        args.max_work_dir_size = parse_bytes(args.max_work_dir_size) if args.max_work_dir_size else None
        args.max_image_cache_size = parse_bytes(args.max_image_cache_size) if args.max_image_cache_size else None
        args.docker_log_size = parse_bytes(args.docker_log_size)
        args.cpuset = [int(c) for c in parse_set(args.cpuset, "--cpuset")] if args.cpuset else None
        args.gpuset = parse_set(args.gpuset, "--gpuset") if args.gpuset else None
    except ValueError as e:
        raise UsageError(str(e)) from e
    if args.cpuset is not None:
        allowed = set(host_cpus())
        outside = sorted(set(args.cpuset) - allowed)
        if outside:
            raise UsageError(f"--cpuset: cores {outside} are not available here (available: {sorted(allowed)})")


def _total_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"runplane-agent: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # the Azure SDK logs every HTTP request at INFO: keep the agent's own log readable
    logging.getLogger("azure").setLevel(max(logging.WARNING, logging.getLogger().level))
    import docker  # after argument checks, so --help and bad flags answer fast

    from runplane.bootstrap import build_stack
    from worker_agent.agent import Agent, AgentConfig
    from worker_agent.executor import LABEL, ExecutorConfig, Ports
    from worker_agent.images import ImageCache
    from worker_agent.inputs import InputCache
    from worker_agent.network import check_network
    from worker_agent.selflog import LogUploader

    worker_id = args.id or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
    root = Path(args.work_dir).expanduser()
    work_dir = root / worker_id
    if args.prepare_work_dir:
        try:
            _prepare_work_dir(work_dir, root / "cache", args.allow_suid_work_dir).leave_mounted()
        except WorkDirError as e:
            print(f"runplane-agent: error: {e}", file=sys.stderr)
            return 2
        return 0
    # configuration first (exit 2), then what the machine must offer (exit 1)
    try:
        stack = build_stack()
    except (ValueError, RunplaneError) as e:  # a bad RUNPLANE_* setting or pools file
        print(f"runplane-agent: error: {e}", file=sys.stderr)
        return 2
    pool = stack.pools.get(args.pool)
    if pool is None:
        print(f"runplane-agent: error: unknown pool {args.pool!r}", file=sys.stderr)
        return 2
    try:
        client = docker.from_env(max_pool_size=64)
        client.ping()
    except docker.errors.DockerException as e:
        print(f"runplane-agent: error: cannot reach the Docker engine: {e}", file=sys.stderr)
        return 1
    try:
        gpus = select_gpus(detect_gpus(), args.gpuset)
    except ValueError as e:
        print(f"runplane-agent: error: {e}", file=sys.stderr)
        return 2
    # run directories on a nosuid,nodev mount, found or made (workdir.py); else exit 2
    try:
        prepared = _prepare_work_dir(work_dir, root / "cache", args.allow_suid_work_dir)
    except WorkDirError as e:
        print(f"runplane-agent: error: {e}", file=sys.stderr)
        return 2
    if prepared.warning:
        logging.getLogger("runplane.agent").warning("%s (--allow-suid-work-dir)", prepared.warning)
    network = check_network(
        client,
        args.network_mode,
        pool.default_image,
        work_dir,
        pull=args.pull == "missing",
        name="runplane-netcheck-" + re.sub(r"[^A-Za-z0-9_.-]", "-", worker_id),
        labels={f"{LABEL}.netcheck": worker_id, f"{LABEL}.stack": stack.settings.stack_id()},
    )
    if network.refused:
        logging.getLogger("runplane.agent").warning(
            "runs that ask for a network are refused: %s (checked in %.2fs)", network.refused, network.seconds
        )
    else:
        logging.getLogger("runplane.agent").info(
            "runs that ask for a network get Docker network %s, closed off from metadata and this host "
            "(checked in %.2fs)",
            args.network_mode,
            network.seconds,
        )
    agent = Agent(
        AgentConfig(
            pool=args.pool,
            worker_id=worker_id,
            work_dir=work_dir,
            slots=args.slots,
            memory=args.memory or _total_memory(),
            cpuset=tuple(args.cpuset or host_cpus()),
            gpus=tuple(gpus),
            idle_seconds=args.idle_seconds,
            exit_after_num_runs=args.exit_after_num_runs,
            heartbeat_seconds=args.heartbeat_seconds,
            lease_seconds=args.lease_seconds,
            poll_seconds=args.poll_seconds,
            pass_down_termination=args.pass_down_termination,
            exit_on_exception=args.exit_on_exception,
            preemptible=args.preemptible,
            tag=args.tag,
            tag_exclusive=args.tag_exclusive,
            group=args.group,
            executor=ExecutorConfig(
                worker_id=worker_id,
                work_dir=work_dir,
                kill_poll_seconds=args.kill_poll_seconds,
                upload_deadline_seconds=args.upload_deadline_seconds,
                pull=args.pull,
                shm_size=args.shm_size,
                run_user=args.run_user,
                stack_id=stack.settings.stack_id(),
                allow_root=pool.allow_root,
                max_output_files=pool.max_output_files,
                max_log_size=pool.max_log_size,
                docker_log_size=str(args.docker_log_size),
                inputs_view=prepared.inputs_view,
            ),
        ),
        Ports(stack.store, stack.queue, stack.objects),
        stack.workers,
        client,
        time.time,
        inputs=InputCache(
            root / "cache",
            stack.objects,
            stack.store,
            args.max_work_dir_size,
            stack.input_policy,
        ),
        images=ImageCache(client, root / f"images-{socket.gethostname()}.json", args.max_image_cache_size),
        network=network,
    )

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("runplane.agent").info("signal %d: stopping", signum)
        agent.stop()

    uploader = None
    if args.log_upload_prefix:
        uploader = LogUploader(stack.objects, work_dir / "agent.log", args.log_upload_prefix, worker_id)
        uploader.attach()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    logging.getLogger("runplane.agent").info("worker %s serving pool %s", worker_id, args.pool)
    if args.preemption_watch:
        PreemptionWatcher(
            make_probe(args.preemption_watch, args.metadata_url),
            lambda notice: agent.stop(pass_down=True, reason=notice),
        ).start()
    reason = agent.run()
    logging.getLogger("runplane.agent").info("worker %s exiting: %s", worker_id, reason)
    if uploader is not None:
        uploader.stop()
    prepared.release()
    _exit_now(1 if agent.failed else 0)


def _exit_now(status: int) -> NoReturn:
    """Exit with ``status`` once the agent is done, without the interpreter's own wait for threads
    at exit: every run has ended, but an upload that outlasted its deadline may still hang on its
    threads (the upload pool's and boto3's, which ``concurrent.futures`` joins at exit), and would
    hold the process, and the machine, until the object store answered or the client gave up."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _prepare_work_dir(work_dir: Path, cache: Path, allow_suid: bool) -> WorkDir:
    """This worker's directories, run directories on a nosuid,nodev mount (workdir.py). Raises
    WorkDirError."""
    why_not = None
    if os.geteuid() != 0:
        why_not = f"it runs as uid {os.geteuid()}, not root"
    elif not engine_shares_our_mounts(os.environ.get("DOCKER_HOST")):
        why_not = "the Docker engine is in another mount namespace: this agent runs in a container or a sandbox"
    return prepare(work_dir, cache, why_not=why_not, allow_suid=allow_suid)
