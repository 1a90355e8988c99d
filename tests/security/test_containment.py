"""A hostile user against the real Docker engine, through the agent's own executor (the moto
server for the store and objects): root through the image's USER, limits that leak, data left
readable. Each run goes from claimed to its final state as on a worker; the work dir is
prepared as the agent prepares it at start (``workdir.prepare``: nosuid,nodev mounts it removes
when done)."""

from __future__ import annotations

import functools
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from runplane.domain.expect import Expect
from runplane.domain.runs import Run, RunSpec
from runplane.domain.states import RunState
from runplane.services import lifecycle
from runplane.services.logs import log_prefix, outputs_prefix
from tests.conftest import TEST_IMAGE, wait_for
from tests.gate import GATE, open_gate
from worker_agent.container_spec import container_name
from worker_agent.containers import remove_container
from worker_agent.executor import RunExecutor
from worker_agent.inputs import InputCache
from worker_agent.run_config import AgentPorts, ExecutorConfig
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
# app and nobody are listed members of group root: neither may get it as a supplementary group
GROUP = "root:x:0:app,nobody\napp:x:1000:\nnogroup:x:65534:\n"
# tag -> USER of an image built like runplane/test-busybox:1, with the accounts above
IMAGES = {
    "runplane/test-user-0000:1": "0000",
    "runplane/test-user-root:1": "root",
    "runplane/test-user-toor:1": "toor",
    "runplane/test-user-app:1": "app",
    "runplane/test-user-ghost:1": "ghost",
}


def _rootfs(passwd_at: str = "etc/passwd") -> bytes:
    """A busybox root file system with the accounts above; ``/etc/passwd`` a symlink to
    ``/passwd_at`` when that is elsewhere."""
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
        if passwd_at != "etc/passwd":
            add(str(Path(passwd_at).parent), tarfile.DIRTYPE, 0o755)
            add("etc/passwd", tarfile.SYMTYPE, 0o777, link=f"/{passwd_at}")
        add(passwd_at, tarfile.REGTYPE, 0o644, content=PASSWD.encode())
        add("etc/group", tarfile.REGTYPE, 0o644, content=GROUP.encode())
    return data.getvalue()


def _import(client: Any, tag: str, rootfs: Callable[[], bytes], user: str, definition: str) -> None:
    """``tag`` from ``rootfs()``, unless it is there already built from the same ``definition``."""
    digest = hashlib.sha256(f"{definition}{Path(BUSYBOX).stat().st_size}".encode()).hexdigest()[:16]
    try:
        if client.images.get(tag).labels.get("io.runplane.test-hash") == digest:
            return
    except docker.errors.ImageNotFound:
        pass
    repository, _, version = tag.partition(":")
    client.api.import_image_from_data(
        rootfs(), repository=repository, tag=version,
        changes=["ENV PATH=/bin", f"USER {user}", f"LABEL io.runplane.test-hash={digest}"],
    )  # fmt: skip


@pytest.fixture(scope="session")
def user_images(docker_client: Any) -> dict[str, str]:
    """Images whose USER is root in several spellings, a non-root user with a home, and a user
    the image does not have. Kept while built from the same definition."""
    rootfs = functools.cache(_rootfs)
    for tag, user in IMAGES.items():
        _import(docker_client, tag, rootfs, user, f"{PASSWD}{GROUP}{user}")
    return {user: tag for tag, user in IMAGES.items()}


LONG_LINK = "p" * 120 + "/passwd"


@pytest.fixture(scope="session")
def long_link_image(docker_client: Any) -> str:
    """USER app, whose /etc/passwd is a symlink to /ppp…/passwd: a link target too long for a
    plain tar header, so the engine's archive of it starts with a PAX header."""
    tag = "runplane/test-user-app-long-link:1"
    _import(docker_client, tag, lambda: _rootfs(LONG_LINK), "app", f"{PASSWD}{GROUP}{LONG_LINK}")
    return tag


@pytest.fixture(scope="session")
def marked_images(docker_client: Any) -> dict[str, str]:
    """Two images that differ only in the environment variable MARK (A or B)."""
    tags = {}
    for mark in "AB":
        tags[mark] = f"runplane/test-mark-{mark.lower()}:1"
        dockerfile = f"FROM {TEST_IMAGE}\nENV MARK={mark}\n".encode()
        docker_client.images.build(fileobj=io.BytesIO(dockerfile), tag=tags[mark], rm=True, pull=False)
    return tags


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
              inputs: dict[str, str] | None = None, env: dict[str, str] | None = None, run_id: str | None = None,
              client: Any = None, kind: type[RunExecutor] = RunExecutor, **config: Any) -> RunExecutor:  # fmt: skip
        """A run of ``command`` claimed by this worker and started by a ``kind`` executor on
        ``client`` (the worker's by default), with ``config`` over the test's ExecutorConfig."""
        store = self.stack.store
        spec = RunSpec(
            command=command, image=image, inputs=inputs or {}, env=env or {},
            resources={"memory": "256m", **(resources or {})},
        )  # fmt: skip
        run = store.create(Run(id=run_id or f"r-sec{uuid.uuid4().hex[:10]}", owner="alice", queue="manual",
                               created_at=time.time(), spec=spec))  # fmt: skip
        claimed = lifecycle.claim(store, run, 0, self.id, 30, time.time())
        executor = kind(
            claimed,
            AgentPorts(store, self.stack.queue, self.stack.objects),
            client or self.client,
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


# CHOWN (bit 0), DAC_OVERRIDE (1), FOWNER (3), SETGID (6), SETUID (7): nothing else
ROOT_CAPABILITIES = "00000000000000cb"


def test_root_only_where_the_pool_allows_it(worker, user_images):
    run = worker.run("id -u; grep -E 'Cap(Eff|Bnd)' /proc/self/status", user_images["toor"], allow_root=True,
                     run_user="image")  # fmt: skip
    assert run.state == RunState.SUCCEEDED, run.failure
    assert worker.log(run).decode().split("\n") == [
        "0",
        f"CapEff:\t{ROOT_CAPABILITIES}",  # exactly the small set, and nothing to regain
        f"CapBnd:\t{ROOT_CAPABILITIES}",
        "",
    ]
    default = worker.run("id -u", user_images["toor"], allow_root=True)  # --run-user nobody never runs root
    assert worker.log(default) == b"65534\n"


def test_no_group_root_for_a_user_the_image_lists_in_it(worker, user_images):
    """The image's /etc/group names app a member of root: it never gets group 0 (runc adds a
    user's listed groups when no group is given; the agent always gives one)."""
    run = worker.run("id -u; id -g; id -G", user_images["app"])
    assert run.state == RunState.SUCCEEDED, run.failure
    assert worker.log(run) == b"1000\n1000\n1000\n"


def test_passwd_behind_a_long_symlink_is_read(worker, long_link_image):
    """The engine's archive of /etc/passwd here starts with a PAX header (its link target is
    long): read as one header of 512 bytes, the image seemed to have no /etc/passwd."""
    run = worker.run("id -u; id -g", long_link_image)
    assert run.state == RunState.SUCCEEDED, run.failure
    assert worker.log(run) == b"1000\n1000\n"


class _TagMovesAfterInspect:
    """A Docker client under which ``tag`` is moved to ``to`` as soon as the agent has inspected
    it (a pull or a build elsewhere on the host, at the worst moment)."""

    def __init__(self, client: Any, tag: str, to: str) -> None:
        self._client, self._tag, self._to = client, tag, to

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    @property
    def images(self) -> Any:
        outer = self

        class Images:
            def __getattr__(self, name: str) -> Any:
                return getattr(outer._client.images, name)

            def get(self, name: str) -> Any:
                image = outer._client.images.get(name)
                if name == outer._tag:
                    outer._client.images.get(outer._to).tag(*outer._tag.split(":"))
                return image

        return Images()


def test_the_run_runs_the_image_it_inspected_even_if_the_tag_moves(worker, docker_client, marked_images):
    """Its users were read from the image inspected; created from the tag, the run would run
    whatever the tag names by then."""
    tag = "runplane/test-moving:1"
    docker_client.images.get(marked_images["A"]).tag(*tag.split(":"))
    try:
        run = worker.run("echo $MARK", tag, client=_TagMovesAfterInspect(docker_client, tag, marked_images["B"]))
    finally:
        docker_client.images.remove(tag)
    assert run.state == RunState.SUCCEEDED, run.failure
    assert worker.log(run) == b"A\n"


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


def test_a_run_that_sets_its_home_gets_no_home_directory(worker):
    executor = worker.start(f'touch started; echo "$HOME"; {GATE}', env={"HOME": "/tmp"})
    wait_for(lambda: (executor.output_dir / "started").exists(), 30, 0.02, "the run to start")
    assert executor.run_as.home == "/runplane/home"  # the image's own would not do for nobody
    assert executor.run_dir.exists() and not executor.home_dir.exists()  # but the run brings its own
    open_gate(executor.output_dir)
    done = worker.finish(executor)
    assert done.state == RunState.SUCCEEDED, done.failure
    assert worker.log(done) == b"/tmp\n"


# -- nosuid, nodev and private directories -----------------------------------------------------


def test_a_run_id_that_is_no_run_id_touches_nothing_on_the_host(worker):
    """The run's id names its directory, which the agent makes, gives to the run's user and
    removes: ``x/../../../victim`` made that a directory of the host's."""
    victim = worker.work_dir.parent / "victim-0"
    victim.mkdir()
    (victim / "keep").write_bytes(b"kept")
    before = victim.stat()
    run = worker.run("true", run_id="x/../../../victim")
    state, reason, message = _failure(run)
    assert (state, reason) == (RunState.FAILED, "agent_error")
    assert "'x/../../../victim' is not a valid run id" in message
    after = victim.stat()
    assert ((victim / "keep").read_bytes(), after.st_uid, after.st_mode) == (b"kept", before.st_uid, before.st_mode)
    assert list((worker.work_dir / "runs").iterdir()) == []


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
        f"cp /bin/busybox suid; chmod 4755 suid; touch started; {GATE}",
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
    open_gate(executor.output_dir)
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


# Ends the commands of runs that only a check while they run may stop: the check after a run
# would give the same failure, an hour late, long after ``Worker.finish`` gave up waiting.
FOREVER = "sleep 3600"


def test_a_big_file_in_tmp_counts_against_disk(worker):
    run = worker.run(f"dd if=/dev/zero of=/tmp/big bs=1M count=200 2>/dev/null; {FOREVER}", resources={"disk": "1m"})
    state, reason, message = _failure(run)
    assert (state, reason) == (RunState.FAILED, "disk_limit")
    assert "container file system" in message
    assert "over the 1m disk limit" in message


# A 1 TiB (sparse) file under 20 directories of 250 characters, one in the other: a path of
# 5,000, more than PATH_MAX. Made inside out (A wrapped 20 times), as no shell can cd that deep.
DEEP_BIG_FILE = (
    "n=$(printf '%0250d' 0); mkdir A && truncate -s 1099511627776 A/big && "
    "for i in $(seq 20); do mkdir W && mv A W/$n && mv W A || exit 3; done"
)


@pytest.mark.parametrize("where", ["", "cd /tmp && "], ids=["output", "tmp"])
def test_a_file_deeper_than_path_max_still_counts(worker, where):
    """Walked by path strings, such a directory failed with ENAMETOOLONG and was passed over:
    the 1 TiB file in it counted as nothing."""
    run = worker.run(f"{where}{DEEP_BIG_FILE}; {FOREVER}", resources={"disk": "1m"})
    state, reason, message = _failure(run)
    assert (state, reason) == (RunState.FAILED, "disk_limit")
    assert "over the 1m disk limit" in message
    assert worker.outputs(run) == []


def test_files_anywhere_count_against_the_pools_max_output_files(worker):
    """Empty files in /tmp (or home) had no cap: millions of them made every walk long."""
    run = worker.run(f"cd /tmp && i=0; while [ $i -lt 200 ]; do : > f$i; i=$((i+1)); done; {FOREVER}",
                     max_output_files=50)  # fmt: skip
    state, reason, message = _failure(run)
    assert (state, reason) == (RunState.FAILED, "disk_limit")
    assert "more than 50 files" in message


class _EndlessWalks(RunExecutor):
    """Every disk check goes on, as walking a tree of millions of empty files would, until the
    test lets it end (``walks_may_end``) or it is called off."""

    walking = threading.Event()
    walks_may_end = threading.Event()

    def _check_disk(self, cancelled: Callable[[], bool] | None = None) -> Any:
        self.walking.set()
        while not self.walks_may_end.wait(0.01):
            if cancelled is not None and cancelled():
                break
        return super()._check_disk(cancelled)


def _request_kill(worker: Worker, run_id: str) -> None:
    store = worker.stack.store
    store.update(store.get(run_id), Expect(), {"kill_requested": True})


def test_a_kill_is_honoured_while_the_disk_is_walked(worker, docker_client):
    """The walk ran on the thread that polls for a kill: a kill waited for the walk to end."""
    _EndlessWalks.walking.clear()
    _EndlessWalks.walks_may_end.clear()
    try:
        executor = worker.start("touch started; sleep 600", kind=_EndlessWalks)
        wait_for(lambda: (executor.output_dir / "started").exists(), 30, 0.02, "the run to start")
        assert _EndlessWalks.walking.wait(30), "no disk check started"
        _request_kill(worker, executor.run.id)
        container = docker_client.containers.get(executor.container.id)
        wait_for(lambda: container.reload() or container.status == "exited", 30, 0.02, "the container to be killed")
        assert not _EndlessWalks.walks_may_end.is_set()  # killed while the walk went on
    finally:
        _EndlessWalks.walks_may_end.set()
    done = worker.finish(executor)
    assert done.state == RunState.KILLED, done.failure


class _KillRefused:
    """A Docker client whose engine refuses every kill of a run container (an API error): the
    container goes on running, as one whose process sleeps uninterruptibly would."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    @property
    def containers(self) -> Any:
        outer = self

        class Unkillable:
            def __init__(self, container: Any) -> None:
                self._container = container

            def __getattr__(self, name: str) -> Any:
                return getattr(self._container, name)

            def kill(self, *args: Any, **kwargs: Any) -> None:
                raise docker.errors.APIError("500 Server Error: cannot kill container (refused by the test)")

        class Containers:
            def __getattr__(self, name: str) -> Any:
                return getattr(outer._client.containers, name)

            def create(self, **kwargs: Any) -> Any:
                return Unkillable(outer._client.containers.create(**kwargs))

        return Containers()


def test_outputs_are_never_read_while_the_container_may_still_run(worker, docker_client):
    """Past its time limit the kill fails and the container goes on: uploading then would read
    a directory its processes still change (a symlink swapped in, pointing anywhere)."""
    executor = worker.start("echo mine > out; sleep 60", resources={"time": "2s"}, client=_KillRefused(docker_client),
                            stop_seconds=1)  # fmt: skip
    run = worker.finish(executor)
    state, reason, message = _failure(run)
    assert (state, reason) == (RunState.FAILED, "container_error")
    assert "did not stop within 1s of being killed (it is still running)" in message
    assert message.endswith("; outputs not uploaded")
    assert worker.outputs(run) == []
    assert not executor.run_dir.exists()  # and it is gone after all (removed by force)


def test_a_container_slow_to_remove_is_waited_for(docker_client):
    """Removing a layer of many files outlasts the client's timeout: docker-py raised
    ReadTimeout (no APIError), which escaped the run's cleanup and kept its slot for ever. The
    engine goes on removing meanwhile and answers 409 to a retry until it is done."""
    many = "mkdir /tmp/m && cd /tmp/m && seq 20000 | xargs touch"
    container = docker_client.containers.run(TEST_IMAGE, ["sh", "-c", many], detach=True, network_mode="none")
    container.wait()
    impatient = docker.from_env(timeout=0.05)  # each request times out long before the removal is done
    try:
        assert remove_container(impatient.containers.prepare_model(container.attrs), 60, time.monotonic) is None
    finally:
        impatient.close()
    with pytest.raises(docker.errors.NotFound, match="No such container"):
        docker_client.containers.get(container.id)


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
    name = container_name(executor.config.stack_id, executor.run.id, executor.run.attempt)
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
