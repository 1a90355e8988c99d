"""A hostile user against the real Docker engine, through the agent's own executor (the moto
server for the store and objects): root through the image's USER, limits that leak, data left
readable. Each run goes from claimed to its final state as on a worker; the work dir is
prepared as the agent prepares it at start (``workdir.prepare``: nosuid,nodev mounts it removes
when done)."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from runplane.domain.models import Run, RunSpec, RunState
from runplane.ports import Expect
from runplane.services import lifecycle
from runplane.services.logs import log_prefix, outputs_prefix
from tests.conftest import TEST_IMAGE, wait_for
from worker_agent.executor import ExecutorConfig, Ports, RunExecutor
from worker_agent.inputs import InputCache
from worker_agent.users import NOBODY, ImageUsers
from worker_agent.workdir import SAFE, covering, parse_mountinfo, prepare, read_mountinfo, sweep_dead

pytestmark = pytest.mark.docker

BUSYBOX = shutil.which("busybox") or "/bin/busybox"
PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\n"
    "toor:x:0:0:root by another name:/root:/bin/sh\n"
    "app:x:1000:1000:app:/home/app:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n"
)
GROUP = "root:x:0:\napp:x:1000:\nnogroup:x:65534:\n"
# tag -> USER of an image built like runplane/test-busybox:1, with the accounts above
IMAGES = {
    "runplane/test-user-0000:1": "0000",
    "runplane/test-user-root:1": "root",
    "runplane/test-user-toor:1": "toor",
    "runplane/test-user-app:1": "app",
    "runplane/test-user-ghost:1": "ghost",
}


def _rootfs() -> bytes:
    data = io.BytesIO()
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    with tarfile.open(fileobj=data, mode="w") as tar:

        def add(name: str, kind: bytes, mode: int, uid: int = 0, content: bytes = b"", link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.uid, info.gid, info.linkname = kind, mode, uid, uid, link
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))

        for name, mode, uid in [("bin", 0o755, 0), ("etc", 0o755, 0), ("tmp", 0o1777, 0), ("home", 0o755, 0)]:
            add(name, tarfile.DIRTYPE, mode, uid)
        add("home/app", tarfile.DIRTYPE, 0o755, 1000)
        add("bin/busybox", tarfile.REGTYPE, 0o755, content=Path(BUSYBOX).read_bytes())
        for applet in applets:
            if applet != "busybox":
                add(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox")
        add("etc/passwd", tarfile.REGTYPE, 0o644, content=PASSWD.encode())
        add("etc/group", tarfile.REGTYPE, 0o644, content=GROUP.encode())
    return data.getvalue()


@pytest.fixture(scope="session")
def user_images(docker_client: Any) -> dict[str, str]:
    """Images whose USER is root in several spellings, a non-root user with a home, and a user
    the image does not have. Kept while built from the same definition."""
    rootfs = None
    for tag, user in IMAGES.items():
        digest = hashlib.sha256(f"{PASSWD}{GROUP}{user}{Path(BUSYBOX).stat().st_size}".encode()).hexdigest()[:16]
        try:
            if docker_client.images.get(tag).labels.get("io.runplane.test-hash") == digest:
                continue
        except docker.errors.ImageNotFound:
            pass
        rootfs = rootfs or _rootfs()
        repository, _, version = tag.partition(":")
        docker_client.api.import_image_from_data(
            rootfs,
            repository=repository,
            tag=version,
            changes=["ENV PATH=/bin", f"USER {user}", f"LABEL io.runplane.test-hash={digest}"],
        )
    return {user: tag for tag, user in IMAGES.items()}


class Worker:
    """The agent's side of one worker: its prepared work dir, input cache and executors."""

    def __init__(self, stack: Any, client: Any, root: Path) -> None:
        self.stack, self.client = stack, client
        self.id = f"w-sec-{uuid.uuid4().hex[:6]}"
        self.work_dir = root / self.id
        self.workdir = prepare(self.work_dir, root / "cache", why_not=None)
        self.cache = InputCache(root / "cache", stack.objects, stack.store)
        self.users = ImageUsers(client)

    def start(self, command: str, image: str = TEST_IMAGE, resources: dict[str, Any] | None = None,
              inputs: dict[str, str] | None = None, **config: Any) -> RunExecutor:  # fmt: skip
        store = self.stack.store
        spec = RunSpec(
            command=command, image=image, inputs=inputs or {}, resources={"memory": "256m", **(resources or {})}
        )
        run = store.create(Run(id=f"r-sec{uuid.uuid4().hex[:10]}", owner="alice", queue="manual",
                               created_at=time.time(), spec=spec))  # fmt: skip
        claimed = lifecycle.claim(store, run, 0, self.id, 30, time.time())
        executor = RunExecutor(
            claimed,
            Ports(store, self.stack.queue, self.stack.objects),
            self.client,
            ExecutorConfig(
                worker_id=self.id,
                work_dir=self.work_dir,
                kill_poll_seconds=0.5,
                usage_seconds=0.5,
                upload_deadline_seconds=30,
                pull="never",
                inputs_view=self.workdir.inputs_view,
                **config,
            ),
            time.time,
            inputs=self.cache,
            users=self.users,
        )
        executor.start()
        return executor

    def finish(self, executor: RunExecutor, timeout: float = 60) -> Run:
        assert executor.thread is not None
        executor.thread.join(timeout)
        assert not executor.thread.is_alive(), f"run {executor.run.id} did not end within {timeout}s"
        return self.stack.store.get(executor.run.id)

    def run(self, command: str, image: str = TEST_IMAGE, **kwargs: Any) -> Run:
        return self.finish(self.start(command, image, **kwargs))

    def log(self, run: Run, stream: str = "stdout") -> bytes:
        """The shipped log, checked to be whole: chunks follow each other with no gap."""
        prefix = log_prefix(run.id, run.attempt, stream)
        chunks = sorted((int(o.key[len(prefix) :]), o.key) for o in self.stack.objects.list(prefix))
        data = b""
        for offset, key in chunks:
            assert offset == len(data), f"the log of {run.id} has a gap at {len(data)}"
            data += self.stack.objects.get_bytes(key)
        return data

    def outputs(self, run: Run) -> list[str]:
        prefix = outputs_prefix(run.id, run.attempt)
        return [o.key[len(prefix) :] for o in self.stack.objects.list(prefix)]


@pytest.fixture
def worker(aws_stack: Any, docker_client: Any, tmp_path: Path) -> Any:
    made = Worker(aws_stack, docker_client, tmp_path / "work")
    yield made
    made.workdir.release()


def _failure(run: Run) -> tuple[str, str, str]:
    assert run.failure is not None, f"run {run.id} ended {run.state} without a failure"
    return run.state, run.failure.reason, run.failure.message


# -- root through the image's USER ----------------------------------------------------------------

ROOT_PROBE = (
    "id -u; id -g; id -G; grep -E 'Cap(Eff|Bnd)' /proc/self/status; "
    "echo x > f; chown 0:0 f 2>/dev/null && echo chowned || echo no-chown; "
    "cp /bin/busybox s; chmod 4755 s; stat -c '%u %a' s; "
    "(su -c true root </dev/null >/dev/null 2>&1 || true); id -u"
)


@pytest.mark.parametrize("user", ["0000", "root", "toor"])
def test_uid_0_in_any_spelling_runs_as_nobody_without_capabilities(worker, user_images, user):
    run = worker.run(ROOT_PROBE, user_images[user])
    assert run.state == RunState.SUCCEEDED, run.failure
    assert worker.log(run).decode().split("\n") == [
        "65534",
        "65534",
        "65534",  # no supplementary group either
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",  # nothing to regain either
        "no-chown",
        "65534 4755",  # a setuid file of nobody, never of root
        "65534",
        "",
    ]


def test_root_only_where_the_pool_allows_it(worker, user_images):
    run = worker.run("id -u; grep CapEff /proc/self/status", user_images["toor"], allow_root=True, run_user="image")
    assert run.state == RunState.SUCCEEDED, run.failure
    out = worker.log(run).decode().split("\n")
    assert out[0] == "0"
    assert out[1] != "CapEff:\t0000000000000000"  # today's small set
    default = worker.run("id -u", user_images["toor"], allow_root=True)  # --run-user nobody never runs root
    assert worker.log(default) == b"65534\n"


def test_a_user_the_image_does_not_have_fails_clearly(worker, user_images):
    run = worker.run("id -u", user_images["ghost"])
    state, reason, message = _failure(run)
    assert (state, reason) == (RunState.FAILED, "container_error")
    assert "user 'ghost' is not in the image's /etc/passwd" in message


def test_an_ordinary_user_writes_its_home_and_tmp(worker, user_images):
    own = worker.run('id -u; echo h > "$HOME/h"; echo t > /tmp/t; cat "$HOME/h" /tmp/t; echo $HOME', user_images["app"])
    assert own.state == RunState.SUCCEEDED, own.failure
    assert worker.log(own) == b"1000\nh\nt\n/home/app\n"
    # a root image runs as nobody, whose passwd home does not exist: it gets a writable one
    nobody = worker.run('echo h > "$HOME/h" && cat "$HOME/h"; echo t > /tmp/t && cat /tmp/t; echo $HOME')
    assert nobody.state == RunState.SUCCEEDED, nobody.failure
    assert worker.log(nobody) == b"h\nt\n/runplane/home\n"


# -- nosuid, nodev and private directories -----------------------------------------------------


def _producer(worker: Worker, files: dict[str, bytes]) -> Run:
    """A succeeded run of alice's with these outputs, for a ``run:`` input."""
    store = worker.stack.store
    run = store.create(Run(id=f"r-src{uuid.uuid4().hex[:8]}", owner="alice", queue="manual", created_at=1,
                           attempt=1, spec=RunSpec(command="x")))  # fmt: skip
    for path, data in files.items():
        worker.stack.objects.put_bytes(outputs_prefix(run.id, 1) + path, data)
    return store.update(run, Expect(), {"state": RunState.SUCCEEDED})


def test_output_and_inputs_are_nosuid_nodev_and_the_run_dir_private(worker):
    source = _producer(worker, {"data": b"rows\n"})
    executor = worker.start(
        "grep -E ' /runplane/output | /inputs/data ' /proc/self/mountinfo | cut -d' ' -f5,6; "
        "cat /inputs/data; (echo x > /inputs/data) 2>/dev/null || echo read-only; "
        "cp /bin/busybox suid; chmod 4755 suid; touch started; sleep 3",
        inputs={"data": f"run:{source.id}/data"},
    )
    wait_for(lambda: (executor.output_dir / "started").exists(), 30, 0.05, "the run to start")
    # on the host, while it runs: the run's directories are its own and nobody else's
    for path in (executor.run_dir, executor.output_dir):
        st = path.stat()
        assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o700, NOBODY, NOBODY), path
    assert (executor.run_dir.parent.stat().st_mode & 0o777) == 0o700
    # a setuid file the run left is inert for users of this host: its mount is nosuid,nodev
    suid = executor.output_dir / "suid"
    assert suid.stat().st_mode & 0o4000
    assert covering(parse_mountinfo(read_mountinfo()), suid.resolve()).options >= SAFE
    assert os.statvfs(suid).f_flag & os.ST_NOSUID
    done = worker.finish(executor)
    assert done.state == RunState.SUCCEEDED, done.failure
    lines = worker.log(done).decode().splitlines()
    mounts = {line.split()[0]: set(line.split()[1].split(",")) for line in lines[:2]}
    assert mounts["/runplane/output"] >= {"rw", "nosuid", "nodev"}
    assert mounts["/inputs/data"] >= {"ro", "nosuid", "nodev"}
    assert lines[2:] == ["rows", "read-only"]


def test_the_input_cache_is_not_readable_by_other_users_after_the_run(worker):
    source = _producer(worker, {"model/w": b"secret weights\n"})
    done = worker.run("cat /inputs/m/w", inputs={"m": f"run:{source.id}/model"})
    assert done.state == RunState.SUCCEEDED, done.failure
    assert worker.log(done) == b"secret weights\n"
    cached = next(worker.cache.root.glob("*/content/w"))
    assert worker.cache.root.stat().st_mode & 0o777 == 0o700
    other = subprocess.run(["cat", str(cached)], user=4321, group=4321, capture_output=True, text=True)
    assert other.returncode != 0
    assert "Permission denied" in other.stderr


# -- limits that leak -----------------------------------------------------------------------------


def test_a_big_file_in_tmp_counts_against_disk(worker):
    run = worker.run("dd if=/dev/zero of=/tmp/big bs=1M count=200 2>/dev/null; sleep 30", resources={"disk": "1m"})
    state, reason, message = _failure(run)
    assert (state, reason) == (RunState.FAILED, "disk_limit")
    assert "container file system" in message
    assert "over the 1m disk limit" in message


def test_a_sparse_output_counts_in_full_and_is_not_uploaded(worker):
    # it ends before any sample: the check after the run catches it
    run = worker.run("dd if=/dev/zero of=sparse bs=1 count=1 seek=200M 2>/dev/null", resources={"disk": "1m"})
    state, reason, message = _failure(run)
    assert (state, reason) == (RunState.FAILED, "disk_limit")
    assert "(output directory 200.0m)" in message
    assert "outputs not uploaded" in message
    assert worker.outputs(run) == []


def test_more_files_than_the_pool_allows_is_disk_limit(worker):
    run = worker.run("i=0; while [ $i -lt 2000 ]; do : > f$i; i=$((i+1)); done", max_output_files=50)
    state, reason, message = _failure(run)
    assert (state, reason) == (RunState.FAILED, "disk_limit")
    assert "more than 50 files" in message
    assert worker.outputs(run) == []


LINE = "y" * 99  # `yes` with long lines: fast here, and still 1.7 times its size in Docker's json log


def _docker_log_bytes(client: Any, name: str) -> int:
    try:
        path = client.containers.get(name).attrs.get("LogPath")
    except docker.errors.NotFound:
        return 0
    if not path:
        return 0
    folder = Path(path).parent
    try:
        return sum(f.stat().st_size for f in folder.iterdir() if "-json.log" in f.name)
    except OSError:
        return 0


def _largest_docker_log(client: Any, executor: RunExecutor) -> int:
    """The most bytes Docker's log files of the run's container held while it went."""
    name = f"runplane-{executor.run.id}-{executor.run.attempt}"
    largest = 0
    while executor.thread is not None and executor.thread.is_alive():
        largest = max(largest, _docker_log_bytes(client, name))
        time.sleep(0.01)
    return largest


def test_a_log_over_the_limit_stops_the_run_and_docker_keeps_little(worker, docker_client):
    executor = worker.start(f"yes {LINE} | head -c 8000000; sleep 30", max_log_size=2 * 1024**2,
                            docker_log_size=str(512 * 1024))  # fmt: skip
    largest = _largest_docker_log(docker_client, executor)
    run = worker.finish(executor)
    state, reason, message = _failure(run)
    assert (state, reason) == (RunState.FAILED, "log_limit")
    assert "2m" in message
    assert worker.log(run) == (f"{LINE}\n" * 30_000).encode()[: 2 * 1024**2]  # every byte up to the limit
    assert 0 < largest <= 2 * 512 * 1024 + 64 * 1024, f"Docker's log of the run reached {largest} bytes"


def test_following_the_output_across_docker_log_rotations_loses_nothing(worker, docker_client):
    # about 5 MB of Docker json log through files of 256 KiB: rotated some twenty times
    executor = worker.start(f"yes {LINE} | head -c 3000000", docker_log_size=str(256 * 1024))
    largest = _largest_docker_log(docker_client, executor)
    run = worker.finish(executor)
    assert run.state == RunState.SUCCEEDED, run.failure
    assert worker.log(run) == (f"{LINE}\n" * 30_000).encode()[:3_000_000]
    assert 0 < largest <= 2 * 256 * 1024 + 64 * 1024, f"Docker's log of the run reached {largest} bytes"


def test_prepare_work_dir_leaves_mounts_that_the_agent_then_finds(tmp_path):
    """What the AMI's unit runs outside its sandbox before the agent starts."""
    root = tmp_path / "work"
    command = [sys.executable, "-m", "worker_agent", "--pool", "manual", "--id", "w-pre", "--work-dir", str(root)]
    try:
        done = subprocess.run([*command, "--prepare-work-dir"], capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stderr) == (0, "")
        mounts = parse_mountinfo(read_mountinfo())
        runs = covering(mounts, (root / "w-pre" / "runs").resolve())
        assert runs.mount_point == str((root / "w-pre" / "runs").resolve())
        assert runs.options >= SAFE
        view = covering(mounts, (root / "w-pre" / "inputs").resolve())
        assert view.options >= {"ro", *SAFE}
        assert (root / "cache").stat().st_mode & 0o777 == 0o700
        # the agent finds them (and takes them over: it removes them when it leaves)
        found = prepare(root / "w-pre", root / "cache", why_not="in a sandbox: it could not make them")
        assert (found.warning, found.inputs_view) == (None, (root / "w-pre" / "inputs").resolve())
        found.leave_mounted()
    finally:
        sweep_dead(root)  # nobody holds the worker's lock any more: its mounts go
    left = [m.mount_point for m in parse_mountinfo(read_mountinfo()) if m.mount_point.startswith(str(root))]
    assert left == []
