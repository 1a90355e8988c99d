"""Shared fixtures: a real moto server (in-process, server mode), stacks wired to it, and the
embedded local stack with agents on the real Docker engine."""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runplane.adapters.aws.provision import provision
from runplane.adapters.local.files import FileObjectStore
from runplane.backend import ComputeBackend
from runplane.bootstrap import Stack, aws_clients, aws_names, build_stack
from runplane.client import ApiError, Client
from runplane.devstack.process import DevStackProcess
from runplane.devstack.stack import DevConfig, DevStack, free_port
from runplane.domain.pools import Pool, dump_pools, load_pools
from runplane.domain.states import TERMINAL_STATES
from runplane.ports import TokenStore
from runplane.services.auth import register_token
from runplane.settings import StackSettings
from tests.object_front import objects_front

ROOT = Path(__file__).resolve().parents[1]
POOLS_FILE = ROOT / "tests" / "pools.yaml"
TEST_IMAGE = "runplane/test-busybox:1"
AGENT_IMAGE = "runplane/agent:local"
# Agents in tests: quick polls; leases long enough that no stall of this machine (the moto server
# runs in the test's process) lets one lapse, so a live worker never loses its run; never pull (a
# pull would leave this machine); no network for runs that ask for one: host mode cannot be
# contained, so such runs are refused, and the default (a bridge the agent makes) would use a
# private range. tests/security/test_network.py gives its agents networks of the test's own namespaces.
FAST = ["--lease-seconds", "60", "--heartbeat-seconds", "2", "--poll-seconds", "1", "--kill-poll-seconds", "0.5"]
FAST += ["--pull", "never", "--network-mode", "host"]
# Only for agents a test kills to see their runs re-queued when the lease lapses (given after FAST:
# the last value of a flag wins). A stall there can re-queue a run early, which such tests allow for.
SHORT_LEASE = ["--lease-seconds", "4", "--heartbeat-seconds", "1"]
AGENT_ARGS = " ".join([*FAST, "--upload-deadline-seconds", "30"])
# Buckets (Azure: containers) the local stacks of the tests allow as inputs: one for everyone, one
# for the group "vision" only. Both are made when the stacks start.
DATASETS, VISION_DATA = "e2e-datasets", "e2e-vision"
INPUT_BUCKETS = json.dumps({"*": [DATASETS], "vision": [VISION_DATA]})


class AgentProcess:
    """``runplane-agent`` as a process of the test, with FAST settings and its log in tmp_path."""

    def __init__(self, tmp_path: Path, *args: str, pool: str = "manual", worker_id: str | None = None,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.id = worker_id or f"{pool}-{os.urandom(3).hex()}"
        self.log = tmp_path / f"{self.id}-{time.monotonic_ns()}.log"
        cmd = [sys.executable, "-m", "worker_agent", "--pool", pool, "--id", self.id]
        cmd += ["--work-dir", str(tmp_path / "work"), *FAST, *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("wb"), stderr=subprocess.STDOUT, env=env)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"agent did not exit within {timeout}s:\n{self.log.read_text()[-3000:]}") from None

    def stop(self) -> None:
        """SIGTERM first: a killed agent's open long poll would still take the next message."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    from runplane.devstack.moto_process import atomic_dynamodb_items

    atomic_dynamodb_items()

    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        # moto's Batch runs job containers on the host network, so they reach 127.0.0.1
        "MOTO_DOCKER_NETWORK_MODE": "host",
    }.items():
        os.environ.setdefault(key, value)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def aws_stack(moto_endpoint: str) -> Stack:
    """A freshly provisioned stack (own tables, queues, bucket) on the moto server."""
    settings = StackSettings(prefix=f"t{uuid.uuid4().hex[:8]}", aws_endpoint_url=moto_endpoint, pools=str(POOLS_FILE))
    clients = aws_clients(settings)
    stack = build_stack(settings, clients)
    provision(
        aws_names(settings),
        [p.name for p in stack.pools.pools],
        clients["dynamodb"],
        clients["sqs"],
        clients["s3"],
        kms=clients["kms"],
    )
    return stack


@pytest.fixture
def local_stack(tmp_path: Path) -> Iterator[Stack]:
    """A fresh stack on one machine: its own SQLite database and objects directory (cloud ``local``),
    its object URLs answered on loopback by the front, as the local stack's front answers them."""
    state = tmp_path / "state"
    with objects_front(state) as (url, front):
        settings = StackSettings(cloud="local", state_dir=str(state), public_url=url, pools=str(POOLS_FILE))
        stack = build_stack(settings)
        front.secret = stack.tokens.secret
        yield stack


def _stop_service(pid: int, name: str) -> None:
    """SIGTERM to a service this session started (``name`` in its command line: a pid that has
    gone and been reused is left alone), SIGKILL when it is still there after 10 s."""

    def running() -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        return stat.rpartition(")")[2].split()[0] not in ("Z", "X") and name.lower().encode() in command

    if not running():
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while running() and time.monotonic() < deadline:
            time.sleep(0.05)
        if running():
            logging.getLogger(__name__).warning("%s (pid %d) ignored SIGTERM: killed", name, pid)
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def dynalite_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """dynalite (DynamoDB's API in Node.js, in memory) of this test session's own, on a free
    loopback port (scripts/start-dynalite.sh, which installs it first if needed), stopped when the
    session ends: a dynalite some other process started is never used, nor left behind. Unlike
    moto's DynamoDB it applies each item's conditional writes atomically when they race, as
    DynamoDB does."""
    state = tmp_path_factory.mktemp("dynalite")
    done = subprocess.run(
        [str(ROOT / "scripts" / "start-dynalite.sh"), str(state)],
        env={**os.environ, "DYNALITE_PORT": "0"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        pytest.fail(f"could not start dynalite:\n{done.stdout}\n{done.stderr}")
    pid = int((state / "dynalite.pid").read_text())
    yield lines[-1]
    _stop_service(pid, "dynalite")


@pytest.fixture
def aws_dynalite_stack(moto_endpoint: str, dynalite_endpoint: str) -> Iterator[Stack]:
    """A freshly provisioned stack with its tables on dynalite and its queues and bucket on the
    moto server (``RUNPLANE_DYNAMODB_ENDPOINT_URL``); its tables are deleted afterwards (dynalite
    keeps everything in memory)."""
    settings = StackSettings(
        prefix=f"t{uuid.uuid4().hex[:8]}",
        aws_endpoint_url=moto_endpoint,
        dynamodb_endpoint_url=dynalite_endpoint,
        pools=str(POOLS_FILE),
    )
    clients = aws_clients(settings)
    stack = build_stack(settings, clients)
    names = aws_names(settings)
    pools = [p.name for p in stack.pools.pools]
    provision(names, pools, clients["dynamodb"], clients["sqs"], clients["s3"], kms=clients["kms"])
    yield stack
    for table in names.tables:
        clients["dynamodb"].delete_table(TableName=table)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Azurite (Blob, Queue, Table) of this test session's own, on free loopback ports (installed
    first if needed, as scripts/start-azurite.sh does), stopped when the session ends: an Azurite
    some other process started is never used, nor left behind. Its ports are in the environment
    (AZURITE_*_PORT) meanwhile, so that whatever starts Azurite finds this one. Returns its storage
    connection string."""
    from runplane.devstack.azurite import AzuriteError, Ports, default_prefix, start_azurite

    chosen: list[int] = []
    while len(chosen) < 3:
        port = free_port()
        if port not in chosen:
            chosen.append(port)
    ports = Ports(*chosen)
    state = tmp_path_factory.mktemp("azurite")
    try:
        connection = start_azurite(state, default_prefix(), ports, install_timeout=600)
    except AzuriteError as e:
        pytest.fail(f"could not start Azurite: {e}")
    pid = int((state / "azurite.pid").read_text())
    names = {f"AZURITE_{kind}_PORT": str(port) for kind, port in zip(("BLOB", "QUEUE", "TABLE"), chosen, strict=True)}
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(names)
    yield connection
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _stop_service(pid, "Azurite")


@pytest.fixture
def azure_stack(azurite: str) -> Iterator[Stack]:
    """A freshly provisioned stack (own tables, queues, container) on Azurite, deleted afterwards
    (Azurite keeps everything in memory). Its secrets key is a Key Vault key (the fake of
    tests/fakes/key_vault.py, no emulator exists): sealed with the API's identity, opened with the nodes'."""
    from runplane.adapters.azure.provision import deprovision
    from runplane.adapters.azure.provision import provision as provision_azure
    from runplane.bootstrap import azure_clients, azure_names
    from tests.fakes.key_vault import deployed_keys

    settings = StackSettings(
        cloud="azure", prefix=f"t{uuid.uuid4().hex[:8]}", azure_storage_connection_string=azurite, pools=str(POOLS_FILE)
    )
    clients = azure_clients(settings)
    stack = build_stack(settings, clients)
    stack.sealer, stack.opener = deployed_keys()
    pools = [p.name for p in stack.pools.pools]
    provision_azure(azure_names(settings), pools, clients)
    yield stack
    deprovision(azure_names(settings), pools, clients)


@pytest.fixture(scope="session")
def docker_client() -> Any:
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as e:
        pytest.fail(f"the Docker engine is not reachable ({e}); run `make test`, which starts it")
    try:
        client.images.get(TEST_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"image {TEST_IMAGE} is missing; run scripts/build-images.sh")
    return client


def batch_queue(endpoint: str, prefix: str) -> str:
    """An IAM role, an UNMANAGED compute environment and a job queue in moto's AWS Batch (kept if
    they exist); returns the queue's name."""
    from runplane.adapters.aws.clients import AwsConfig, make_client

    config = AwsConfig(endpoint_url=endpoint)
    iam, batch = make_client("iam", config), make_client("batch", config)
    role = f"{prefix}-batch-service"
    try:
        arn = iam.get_role(RoleName=role)["Role"]["Arn"]
    except iam.exceptions.NoSuchEntityException:
        arn = iam.create_role(RoleName=role, AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    env, queue = f"{prefix}-batch-env", f"{prefix}-batch-queue"
    if not batch.describe_compute_environments(computeEnvironments=[env])["computeEnvironments"]:
        batch.create_compute_environment(computeEnvironmentName=env, type="UNMANAGED", state="ENABLED", serviceRole=arn)
    if not batch.describe_job_queues(jobQueues=[queue])["jobQueues"]:
        batch.create_job_queue(
            jobQueueName=queue,
            state="ENABLED",
            priority=1,
            computeEnvironmentOrder=[{"order": 1, "computeEnvironment": env}],
        )
    return queue


@pytest.fixture(scope="session")
def agent_image(docker_client: Any) -> Any:
    """The worker agent's image, built by scripts/build-agent-image.sh (or kept): two to three
    minutes cold (debootstrap + pip), seconds after a change to the sources (the dependency
    layer is reused), under a second when up to date."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(ROOT / "scripts" / "build-agent-image.sh")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"build-agent-image.sh failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    print(f"agent image ready in {time.monotonic() - t0:.1f} s")
    return docker_client.images.get(AGENT_IMAGE)


@pytest.fixture(scope="session")
def slurm_conf() -> str:
    """A real one-node Slurm (munged, slurmctld, slurmd) on this machine, started if needed."""
    done = subprocess.run([str(ROOT / "scripts" / "start-slurm.sh")], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"could not start Slurm:\n{done.stdout}\n{done.stderr}")
    conf = done.stdout.strip().splitlines()[-1]
    os.environ["SLURM_CONF"] = conf
    return conf


@pytest.fixture(scope="session")
def devstack(slurm_conf: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    """The embedded default, as ``runplane dev`` starts it (cloud ``local``: one SQLite database
    and a directory of objects in its state directory), serving this process's handlers. The input
    buckets are folders of its objects directory, as an operator makes them."""
    stack = DevStack(
        DevConfig(
            port=free_port(),
            token="admin-token",
            user="admin",
            pools_file=str(POOLS_FILE),
            prefix="e2e",
            schedule_seconds=1,
            agent_args=AGENT_ARGS,
            input_buckets=INPUT_BUCKETS,
            state_dir=tmp_path_factory.mktemp("devstack"),
            write_dev_file=False,
        )
    )
    stack.start()
    from runplane import bootstrap

    objects = bootstrap.stack().objects
    assert isinstance(objects, FileObjectStore)
    for bucket in (DATASETS, VISION_DATA):  # made as the stack makes its own
        FileObjectStore(objects.root, bucket, objects.secret, objects.public_url)
    register_users(bootstrap.stack().tokens)
    yield stack
    stack.stop()
    sweep_agent_mounts(stack.config.state_dir)


def off_local(path: Path, *, keep: Iterable[str] = ()) -> Path:
    """The test pools (POOLS_FILE) written to ``path``, those on backends other than local (but
    ``keep``) put on the local backend with no workers: they keep their names and shapes (so answers
    match ``devstack``'s), but Slurm and moto's Batch each belong to one stack of the session."""
    pools = load_pools(str(POOLS_FILE))
    for pool in pools.pools:
        if pool.backend != "local" and pool.name not in keep:
            pool.backend, pool.max_workers, pool.options = "local", 0, {}
    path.write_text(dump_pools(pools))
    return path


@pytest.fixture(scope="session")
def aws_devstack(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStackProcess]:
    """The local stack on AWS terms (``runplane dev --cloud aws``: the Lambda handlers on the moto
    server), with the users of ``devstack``, in a process of its own: ``devstack`` owns this
    process's handler settings. Its pools are those of ``devstack``, "batch" (moto's AWS Batch) on
    its backend; Slurm belongs to ``devstack``."""
    state = tmp_path_factory.mktemp("aws-devstack")
    config = DevConfig(
        port=free_port(),
        token="admin-token",
        user="admin",
        pools_file=str(off_local(state / "pools.json", keep=["batch"])),
        aws_endpoint_url=moto_endpoint,
        prefix=f"e2e{uuid.uuid4().hex[:6]}",
        schedule_seconds=1,
        agent_args=AGENT_ARGS,
        input_buckets=INPUT_BUCKETS,
        state_dir=state,
        write_dev_file=False,
    )
    stack = DevStackProcess(config, state / "devstack.log")
    stack.start()
    built = aws_devstack_stack(stack)
    for bucket in (DATASETS, VISION_DATA):
        with contextlib.suppress(built.objects.client.exceptions.BucketAlreadyOwnedByYou):
            built.objects.client.create_bucket(Bucket=bucket)
    register_users(built.tokens)
    yield stack
    stack.stop()
    sweep_agent_mounts(state)


def aws_devstack_settings(stack: DevStackProcess) -> StackSettings:
    """What an agent or this process needs to reach the stores of ``aws_devstack``."""
    assert stack.config.pools_file is not None
    return StackSettings(
        prefix=stack.config.prefix,
        aws_endpoint_url=stack.config.aws_endpoint_url,
        pools=Path(stack.config.pools_file).read_text(),
    )


def aws_devstack_stack(stack: DevStackProcess) -> Stack:
    """The stores and backends of ``aws_devstack``, built in this process (its handlers serve ``devstack``)."""
    return build_stack(aws_devstack_settings(stack))


@pytest.fixture(scope="session")
def azure_devstack(azurite: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStackProcess]:
    """The local stack on Azure terms (Azurite, the Azure Functions app), with the users of
    ``devstack``, in a process of its own: ``devstack`` owns this process's handler settings.
    Pools not on the local backend keep their names and shapes (so answers match ``devstack``'s)
    but get no workers: Slurm belongs to ``devstack``, moto's Batch to ``aws_devstack``."""
    state = tmp_path_factory.mktemp("azure-devstack")
    config = DevConfig(
        port=free_port(),
        token="admin-token",
        user="admin",
        pools_file=str(off_local(state / "pools.json")),
        cloud="azure",
        azure_connection_string=azurite,
        prefix=f"e2e{uuid.uuid4().hex[:6]}",
        schedule_seconds=1,
        agent_args=AGENT_ARGS,
        input_buckets=INPUT_BUCKETS,
        state_dir=state,
        write_dev_file=False,
    )
    stack = DevStackProcess(config, state / "devstack.log")
    stack.start()
    settings = StackSettings(
        cloud="azure", prefix=config.prefix, azure_storage_connection_string=azurite, pools=config.pools_file
    )
    from azure.core.exceptions import ResourceExistsError

    built = build_stack(settings)
    for container in (DATASETS, VISION_DATA):
        with contextlib.suppress(ResourceExistsError):
            built.objects.client.create_container(container)
    register_users(built.tokens)
    yield stack
    stack.stop()
    sweep_agent_mounts(state)


@contextlib.contextmanager
def nosuid_work_dir(path: Path) -> Iterator[Path]:
    """``path`` bind-mounted onto itself ``nosuid,nodev`` on this host, as an operator does for an
    agent that runs in a container (which cannot make the mount itself); removed afterwards."""
    from worker_agent.workdir import bind_mount, unmount

    path.mkdir(parents=True, exist_ok=True)
    bind_mount(path, path, False)
    try:
        yield path
    finally:
        unmount(path)


def sweep_agent_mounts(state_dir: Path) -> None:
    """Remove the work-dir mounts (worker_agent/workdir.py) that agents of a local stack killed
    with SIGKILL left, so that pytest can remove its temporary directories."""
    from worker_agent.workdir import sweep_dead

    for agents in state_dir.glob("*/agents"):
        sweep_dead(agents)


def register_users(tokens: TokenStore) -> None:
    """The users of the local stacks, besides the administrator whose token the stack made itself
    ("admin-token"): alice, bob, alice read-only and write-only, carol of the group vision, and a
    token with no scopes at all."""
    register_token(tokens, "alice-token", "alice", now=time.time())
    register_token(tokens, "bob-token", "bob", now=time.time())
    register_token(tokens, "reader-token", "alice", scopes=["runs:read"], now=time.time())
    register_token(tokens, "writer-token", "alice", scopes=["runs:write"], now=time.time())
    register_token(tokens, "carol-token", "carol", groups=["vision"], now=time.time())
    register_token(tokens, "empty-token", "eve", scopes=[], now=time.time())


ON_EVERY_CLOUD = ["devstack", "aws_devstack", "azure_devstack"]
"""The local stacks of each cloud: ``@pytest.mark.parametrize("alice", ON_EVERY_CLOUD, indirect=True)``
runs a test of ``alice`` alone on the embedded default, on moto and on Azurite."""


@pytest.fixture(scope="session")
def alice(request: pytest.FixtureRequest) -> Client:
    """alice's client of ``devstack``, or of the stack fixture named by the test's param."""
    stack = request.getfixturevalue(getattr(request, "param", None) or "devstack")
    return Client(stack.api_url, "alice-token")


@pytest.fixture(scope="session")
def bob(devstack: DevStack) -> Client:
    return Client(devstack.api_url, "bob-token")


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.1, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def moto_credentials_for(pool: Pool) -> None:
    """Write moto's dummy keys to the credentials file the pool's workers are pointed at (its
    ``AWS_SHARED_CREDENTIALS_FILE``): workers never get the dispatcher's keys as plain values."""
    path = Path(pool.options["environment"]["AWS_SHARED_CREDENTIALS_FILE"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n")


def cancel_all(backend: ComputeBackend, pool: Pool) -> None:
    for job in backend.list(pool):
        backend.cancel(pool, job.id)


TERMINAL = frozenset(str(state) for state in TERMINAL_STATES)
"""The final states, as the API writes them."""


def wait_state(client: Client, run_id: str, states: Iterable[str], timeout: float = 60) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        run = client.request("GET", f"/v1/runs/{run_id}")
        return run if run["state"] in set(states) else None

    return wait_for(check, timeout, 0.1, f"run {run_id} to reach {states}")


def api_status(call: Callable[[], Any]) -> tuple[int, str, str]:
    """(status, code, message) of a call expected to fail."""
    try:
        call()
    except ApiError as e:
        return e.status, e.code, e.message
    raise AssertionError("the call succeeded but was expected to fail")


_ORDER = {"unit": 0, "integration": 1, "e2e": 2, "security": 2}


# The fixtures that bring up a service, and the marker (pyproject.toml) of every test that needs
# one, however it gets there: as an argument, through another fixture, or by
# request.getfixturevalue(). Markers follow from the fixtures, so none can be forgotten;
# `make test-fast` deselects them.
SERVICE_MARKERS = {
    "docker_client": "docker",
    "slurm_conf": "slurm",
    "azurite": "azurite",
    "dynalite_endpoint": "dynalite",
    "devstack": "devstack",
    "aws_devstack": "devstack",
    "azure_devstack": "devstack",
}


@functools.cache
def _getfixturevalue_arguments(func: Callable[..., Any]) -> list[ast.expr] | None:
    """The argument expressions of the ``getfixturevalue`` calls in a fixture's source (None: no
    source to read)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return None
    return [
        node.args[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "getfixturevalue"
        and node.args
    ]


def _requested_by_name(func: Callable[..., Any], param: Any) -> set[str] | None:
    """The fixtures a fixture asks for with ``request.getfixturevalue(...)`` when its param is
    ``param``: each argument evaluated in the fixture's module. None when one cannot be told."""
    arguments = _getfixturevalue_arguments(func)
    if arguments is None:
        return None
    names = set()
    for argument in arguments:
        try:
            code = compile(ast.Expression(argument), inspect.getsourcefile(func) or "<fixture>", "eval")
            name = eval(code, func.__globals__, {"request": SimpleNamespace(param=param)})
        except Exception:  # an expression of more than the param and the module's names
            return None
        if not isinstance(name, str):
            return None
        names.add(name)
    return names


def _fixtures_needed(item: pytest.Item) -> set[str] | None:
    """Every fixture the test sets up, with those it requests by name; None when that cannot
    be told (then it is taken to need every service)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    manager = item.session._fixturemanager
    needed: set[str] = set()
    todo = list(getattr(item, "fixturenames", []))
    # a test parametrised by fixture name asks for it with request.getfixturevalue(param)
    todo += [v for v in params.values() if isinstance(v, str) and manager.getfixturedefs(v, item)]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        for fixturedef in manager.getfixturedefs(name, item) or ():
            todo += fixturedef.argnames
            dynamic = _requested_by_name(fixturedef.func, params.get(name))
            if dynamic is None:
                return None
            todo += dynamic
    return needed


# Services one machine has one of, shared by whichever tests use them: the Docker engine (and what
# tests check is left on it), the one-node Slurm, and the local stacks' agents on that engine.
ENGINE_MARKERS = {"docker", "slurm", "devstack"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "engine: in a module with a test that uses the Docker engine, Slurm or a local stack (set by "
        "tests/conftest.py); scripts/run-tests.sh runs these in one process and the rest beside it",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with the services its fixtures bring up (SERVICE_MARKERS), and every test of
    a module that has one using the engine, Slurm or a local stack with ``engine``. Then fast suites
    first; the e2e suite last, because its local stack (started on first use) keeps polling in the
    background and owns the process-wide handler settings from then on."""
    engine_modules = set()
    for item in items:
        needed = _fixtures_needed(item)
        for fixture, marker in sorted(SERVICE_MARKERS.items()):
            if needed is None or fixture in needed:
                item.add_marker(marker)
        if any(item.get_closest_marker(marker) for marker in ENGINE_MARKERS):  # set here or by hand
            engine_modules.add(item.path)
    for item in items:
        if item.path in engine_modules:  # a module's fixtures are set up in one process only
            item.add_marker("engine")
    items.sort(key=lambda item: _ORDER.get(Path(str(item.fspath)).relative_to(ROOT / "tests").parts[0], 1))
