"""``pip install runplane`` is the client alone, and each extra brings what it promises: the wheel,
built once from this tree, installed into empty virtualenvs and used from there, as a user of the
package would (a working directory outside the checkout, HOME of its own). The light install has
no cloud SDK, and its heavy commands name the extra to install; ``local`` runs ``runplane dev`` and
a real run through the SDK, and so does ``local,azure`` on Azure terms; ``agent``, ``aws``,
``kubernetes`` and ``azure-batch`` each import what they are for, and bring nothing of the others.

The installs are uv's, ``--offline`` from the cache that ``scripts/setup.sh --test`` fills with
every extra's packages, at the versions it pinned in constraints.txt (a second or so each)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from runplane import __version__
from tests.conftest import free_port, sweep_agent_mounts

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PACKAGING = ROOT / ".venv" / "packaging"  # scripts/setup.sh --test fills it
UV = Path(sys.executable).with_name("uv")
# what the light install must not bring: every cloud SDK, Docker's, moto
HEAVY = ("boto3", "botocore", "moto", "docker", "aws-lambda-powertools", "kubernetes", "azure-")
RUN_SCRIPT = """
import json, sys
from runplane.client import Client
with Client(sys.argv[1], sys.argv[2]) as client:
    run = client.submit("echo hi").wait(timeout=180)
    print(json.dumps({"state": getattr(run.state, "value", run.state), "stdout": run.logs()}))
"""


def _uv(*args: str | Path) -> None:
    env = {
        **os.environ,
        "UV_CACHE_DIR": str(PACKAGING / "cache"),
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_NO_CONFIG": "1",
    }
    done = subprocess.run([str(UV), *map(str, args)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"uv {' '.join(map(str, args))} failed:\n{done.stderr}"


class Venv:
    """An empty virtualenv (in ``path``/venv), HOME and working directory ``path``."""

    def __init__(self, path: Path, wheel: Path) -> None:
        self.path, self.wheel = path, wheel
        self.bin = path / "venv" / "bin"
        _uv("venv", "-q", "--python", sys.executable, path / "venv")

    def install(self, extras: str = "") -> None:
        spec = f"{self.wheel}[{extras}]" if extras else str(self.wheel)
        _uv(
            "pip",
            "install",
            "-q",
            "--offline",
            "--python",
            self.bin / "python",
            "-c",
            PACKAGING / "constraints.txt",
            spec,
        )

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a user of this venv: none of the checkout's paths or runplane's settings."""
        keep = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("RUNPLANE_", "PYTHON", "VIRTUAL_ENV"))
        }
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and not p.startswith(str(ROOT))]
        return {**keep, "HOME": str(self.path), "PATH": os.pathsep.join([str(self.bin), *path]), **extra}

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        return subprocess.run(
            command, cwd=self.path, env=env or self.env(), capture_output=True, text=True, timeout=timeout
        )

    def python(self, code: str, *args: str, timeout: float = 60) -> str:
        done = self.run("python", "-c", code, *args, timeout=timeout)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def packages(self) -> set[str]:
        listing = self.python("import importlib.metadata as m; print('\\n'.join(d.name for d in m.distributions()))")
        return {line.strip().lower().replace("_", "-") for line in listing.splitlines() if line.strip()}


def heavy(packages: set[str], names: Sequence[str]) -> set[str]:
    return {p for p in packages if any(p == n or (n.endswith("-") and p.startswith(n)) for n in names)}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this tree, built without network (this venv's setuptools) from a copy of the
    sources, so that no build/ directory of the checkout's slips stale files in."""
    stamp = PACKAGING / "cache" / f".primed-{hashlib.sha256((ROOT / 'pyproject.toml').read_bytes()).hexdigest()[:12]}"
    if not stamp.exists() or not UV.exists():
        pytest.fail(
            "the packaging test's package cache is missing or older than pyproject.toml: run scripts/setup.sh --test"
        )
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("runplane", "worker_agent", "functions"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("runplane-*.whl")
    return built


def test_the_wheel_carries_what_runplane_dev_reads(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in (
        "runplane/devstack/pools.yaml",
        "runplane/devstack/azurite.py",
        "runplane/py.typed",
        "runplane/web/index.html",  # the dashboard (runplane/api/ui.py)
        "runplane/web/app.js",
        "runplane/web/app.css",
        "functions/azure/host.json",
        "functions/aws/requirements.txt",
        "worker_agent/main.py",
    ):
        assert data in names, data
    assert not [n for n in names if n.startswith("tests/") or n.endswith("local.settings.json")]


@pytest.fixture(scope="module")
def light(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    venv = Venv(tmp_path_factory.mktemp("light"), wheel)
    venv.install()
    return venv


def test_the_light_install_is_the_client_alone(light: Venv) -> None:
    assert heavy(light.packages(), HEAVY) == set()
    assert {"pydantic", "httpx", "typer", "rich"} <= light.packages()
    version = light.run("runplane", "--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"runplane {__version__}")
    light.python("import runplane.client, runplane.api.models, runplane.domain.runs, runplane.domain.units")
    assert light.run("runplane", "--help").returncode == 0
    assert light.run("runplane", "dev", "--help").returncode == 0


@pytest.mark.parametrize(
    ("command", "line"),
    [
        pytest.param(
            ("runplane", "dev"), "error: runplane dev needs the local extra: pip install 'runplane[local]'", id="dev"
        ),
        pytest.param(
            ("runplane", "dev", "--cloud", "azure"),
            "error: runplane dev --cloud azure needs the local and azure extras: pip install 'runplane[local,azure]'",
            id="dev-azure",
        ),
        pytest.param(
            ("runplane", "token", "create", "alice", "--direct"),
            "error: runplane token create --direct needs the aws extra: pip install 'runplane[aws]'",
            id="token-direct",
        ),
        pytest.param(
            ("runplane-agent", "--help"),
            "runplane-agent: error: runplane-agent needs the agent extra: pip install 'runplane[agent]'",
            id="agent",
        ),
    ],
)
def test_a_heavy_command_of_the_light_install_names_its_extra(light: Venv, command: tuple[str, ...], line: str) -> None:
    done = light.run(*command)
    assert (done.returncode, done.stderr.strip(), done.stdout) == (2, line, "")


@pytest.fixture(scope="module")
def local(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    venv = Venv(tmp_path_factory.mktemp("local"), wheel)
    venv.install("local")
    return venv


@pytest.fixture(scope="module")
def local_azure(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    venv = Venv(tmp_path_factory.mktemp("local-azure"), wheel)
    venv.install("local,azure")
    return venv


def _wait_up(process: subprocess.Popen[str], url: str, token: str, stderr: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"runplane dev exited with {process.returncode}:\n{stderr.read_text()}")
        request = urllib.request.Request(f"{url}/v1/me", headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    pytest.fail(f"runplane dev did not answer within 120 s:\n{stderr.read_text()}")


DevRun = Callable[..., tuple[dict[str, str], int]]


@pytest.fixture
def dev_run(docker_client: object) -> Iterator[DevRun]:
    """Start ``runplane dev ARGS`` in a venv, submit ``echo hi`` through the SDK with the venv's
    python, stop the stack with SIGINT; returns (the run as JSON, the exit code of runplane dev)."""
    started: list[tuple[subprocess.Popen[str], Venv]] = []

    def go(venv: Venv, *args: str) -> tuple[dict[str, str], int]:
        port, token = free_port(), "packaging-admin"
        stderr = venv.path / f"dev-{port}.err"
        with stderr.open("w") as err:
            process = subprocess.Popen(
                [str(venv.bin / "runplane"), "dev", "--port", str(port), "--token", token, *args],
                cwd=venv.path,
                env=venv.env(),
                stdout=subprocess.DEVNULL,
                stderr=err,
                text=True,
            )
        started.append((process, venv))
        url = f"http://127.0.0.1:{port}"
        _wait_up(process, url, token, stderr)
        run = json.loads(venv.python(RUN_SCRIPT, url, token, timeout=240).strip().splitlines()[-1])
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=60)
        return run, code

    yield go
    for process, venv in started:
        if process.poll() is None:
            process.kill()
            process.wait()
        sweep_agent_mounts(venv.path / ".runplane" / "dev")


def test_runplane_dev_of_the_local_extra_runs_a_run(local: Venv, dev_run: DevRun) -> None:
    run, code = dev_run(local)
    assert run == {"state": "succeeded", "stdout": "hi\n"}
    assert code == 0


def test_runplane_dev_on_azure_needs_the_azure_extra_too(local: Venv) -> None:
    done = local.run("runplane", "dev", "--cloud", "azure")
    assert (done.returncode, done.stderr.strip()) == (
        2,
        "error: runplane dev --cloud azure needs the local and azure extras: pip install 'runplane[local,azure]'",
    )


def test_the_packaged_azurite_starter_reuses_a_running_azurite(local_azure: Venv, azurite: str) -> None:
    prefix, connection = local_azure.python(
        "from runplane.devstack.azurite import default_prefix, start_azurite; print(default_prefix()); "
        "print(start_azurite())"
    ).split()
    assert (Path(prefix), connection) == (local_azure.path / ".runplane" / "azurite", azurite)


def test_runplane_dev_on_azure_without_npm_says_what_to_do(local_azure: Venv) -> None:
    ports = {f"AZURITE_{name}_PORT": str(free_port()) for name in ("BLOB", "QUEUE", "TABLE")}
    env = local_azure.env(**ports)
    env["PATH"] = str(local_azure.bin)  # no node, no npm
    done = local_azure.run("runplane", "dev", "--cloud", "azure", "--port", str(free_port()), env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: runplane dev --cloud azure needs Azurite: install Node.js and npm (apt-get install -y nodejs npm), "
        "or pass --azure-connection STRING"
    )


def test_runplane_dev_of_the_local_and_azure_extras_runs_a_run(
    local_azure: Venv, azurite: str, dev_run: DevRun
) -> None:
    assert "--azure-connection" in local_azure.run("runplane", "dev", "--help").stdout
    run, code = dev_run(local_azure, "--cloud", "azure", "--azure-connection", azurite)
    assert run == {"state": "succeeded", "stdout": "hi\n"}
    assert code == 0


@pytest.mark.parametrize(
    ("extra", "code", "absent"),
    [
        pytest.param(
            "agent",
            "import worker_agent.agent, worker_agent.executor, runplane.adapters.aws.runs, runplane.bootstrap",
            ("moto", "aws-lambda-powertools", "azure-", "kubernetes"),
            id="agent",
        ),
        pytest.param(
            "aws",
            "import functions.aws.api, functions.aws.dispatcher, functions.aws.reaper",
            ("moto", "docker", "azure-", "kubernetes"),
            id="aws",
        ),
        pytest.param(
            "kubernetes",
            "from runplane.compute.kubernetes.compute import KubernetesCompute; KubernetesCompute()",
            ("boto3", "moto", "docker", "aws-lambda-powertools", "azure-"),
            id="kubernetes",
        ),
        pytest.param(
            "azure-batch",
            "from runplane.compute.azure_batch.compute import AzureBatchCompute, BatchClient",
            ("boto3", "moto", "docker", "aws-lambda-powertools", "kubernetes", "azure-data-tables"),
            id="azure-batch",
        ),
    ],
)
def test_an_extra_alone_brings_what_it_promises(
    wheel: Path, tmp_path: Path, extra: str, code: str, absent: tuple[str, ...]
) -> None:
    venv = Venv(tmp_path, wheel)
    venv.install(extra)
    venv.python(code)
    assert heavy(venv.packages(), absent) == set()
    if extra == "agent":
        done = venv.run("runplane-agent", "--help")
        assert done.returncode == 0 and "--pool" in done.stdout, done.stderr
