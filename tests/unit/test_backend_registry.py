"""runplane/compute/registry.py: one entry per backend, the domain's ``Backend`` names the same ones,
every backend is built alike, and a pool's options are checked when the pools load."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from runplane.compute.registry import BACKENDS, build_backend, check_pool
from runplane.domain.errors import InvalidRequest
from runplane.domain.pools import Backend, Pool, load_pools
from runplane.settings import StackSettings

COMPUTE = Path(__file__).resolve().parents[2] / "runplane" / "compute"
# A pool's fields besides its options, the same for every backend below.
SHAPE = "cpus: 1\n    memory: 1g\n    default_image: busybox\n"


def test_the_registry_and_the_domain_name_the_same_backends() -> None:
    assert sorted(BACKENDS) == sorted(get_args(Backend))


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_has_the_same_files(name: str) -> None:
    package = COMPUTE / name.replace("-", "_")
    assert {"__init__.py", "options.py", "compute.py"} <= {p.name for p in package.iterdir()}
    compute = (package / "compute.py").read_text()
    assert "def build(settings: StackSettings)" in compute
    assert f'"{name}"' not in compute  # its name is its key in BACKENDS, given to it when it is built
    entry = BACKENDS[name]  # type: ignore[index]
    assert entry.options.__module__ == entry.model.__module__ == f"runplane.compute.{package.name}.options"
    assert entry.compute == f"runplane.compute.{package.name}.compute"


def test_a_backend_is_named_by_its_key() -> None:
    assert build_backend("slurm", StackSettings()).name == "slurm"


# Per backend: options a pool of it may have, and a mistake in them with the words that name it.
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "local": ({}, {"job_queue": "q"}, "unknown option 'job_queue' (known: none)"),
    "slurm": ({"partition": "gpu"}, {"partiton": "gpu"}, "unknown option 'partiton'"),
    "aws-batch": ({"job_queue": "q"}, {"image": "agent:1"}, "job_queue: required"),
    "kubernetes": ({"image": "agent:1"}, {"image": "agent:1", "namespce": "x"}, "unknown option 'namespce'"),
    "azure-batch": ({"job_id": "j", "batch_pool_id": "p"}, {"batch_pool_id": "p"}, "job_id: required"),
}


def test_every_backend_has_a_case() -> None:
    assert sorted(CASES) == sorted(BACKENDS)


def _pool(backend: str, options: dict[str, Any]) -> Pool:
    return Pool(name="gpu", backend=backend, cpus=1, memory="1g", default_image="busybox", options=options)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", sorted(CASES))
def test_each_backend_checks_its_options(backend: str) -> None:
    good, bad, problem = CASES[backend]
    assert isinstance(check_pool(_pool(backend, good)), BACKENDS[backend].model)  # type: ignore[index]
    with pytest.raises(InvalidRequest) as caught:
        check_pool(_pool(backend, bad))
    assert caught.value.message.startswith(f"pool gpu: bad {backend} options: ")
    assert problem in caught.value.message


@pytest.mark.parametrize("backend", sorted(CASES))
def test_a_bad_pool_stops_loading_with_one_line_naming_pool_and_option(backend: str, tmp_path: Path) -> None:
    good, bad, problem = CASES[backend]
    pools = tmp_path / "pools.yaml"
    ok = f"  - name: ok\n    backend: {backend}\n    {SHAPE}    options: {good}\n"
    pools.write_text(f"pools:\n{ok}  - name: gpu\n    backend: {backend}\n    {SHAPE}    options: {bad}\n")
    with pytest.raises(ValueError) as caught:
        load_pools(str(pools), check=check_pool)
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith(f"{pools}: pool gpu: bad {backend} options: ") and problem in line
    pools.write_text(f"pools:\n{ok}")
    assert load_pools(str(pools), check=check_pool).pools[0].name == "ok"


def test_a_bad_field_of_a_pool_is_one_line_naming_the_pool(tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n  - name: gpu\n    cpus: 1\n    memory: lots\n    default_image: busybox\n")
    with pytest.raises(ValueError) as caught:
        load_pools(str(pools), check=check_pool)
    assert str(caught.value).startswith(f"{pools}: pool gpu: memory: cannot read size 'lots'")
    assert "\n" not in str(caught.value)
    pools.write_text("pools:\n  - {name: 'not a name', cpus: 1, memory: 1g, default_image: busybox}\n")
    with pytest.raises(ValueError, match=r": pools\.0\.name: String should match pattern"):  # no name to give
        load_pools(str(pools), check=check_pool)


def test_an_unknown_backend_is_refused_by_name() -> None:
    with pytest.raises(InvalidRequest, match="compute backend 'nomad' is not known; the backends are: local, "):
        build_backend("nomad", StackSettings())


def test_a_backend_whose_extra_is_missing_is_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # how Python marks a module that cannot be imported
    with pytest.raises(InvalidRequest) as caught:
        build_backend("kubernetes", StackSettings())
    assert caught.value.message == (
        "compute backend 'kubernetes' needs the kubernetes extra: pip install 'runplane[kubernetes]'"
    )


# A Lambda of the API, in a process of its own, on a pools setting with a bad pool: what it answers
# two requests, what it logs, and how often it read the pools and built clients.
LAMBDA = """
import json
from runplane import bootstrap
calls = {"pools": 0, "clients": 0}
def counted(name, real):
    def call(*args, **kwargs):
        calls[name] += 1
        return real(*args, **kwargs)
    return call
bootstrap.load_pools = counted("pools", bootstrap.load_pools)
bootstrap.aws_clients = counted("clients", bootstrap.aws_clients)
from functions.aws import api
from runplane.api.gateway import http_event
from runplane.devstack.lambda_shim import LambdaContext
event = http_event("GET", "/v1/pools", "", {"authorization": "Bearer t"}, b"", "127.0.0.1")
for _ in range(2):
    answer = api.lambda_handler(event, LambdaContext(function_name="runplane-api"))
    print("ANSWER", answer["statusCode"], answer["body"])
print("CALLS", json.dumps(calls))
"""


def test_a_function_on_a_bad_pool_logs_the_line_once_and_answers_503() -> None:
    pools = [{"name": "gpu", "backend": "aws-batch", "cpus": 1, "memory": "1g", "default_image": "busybox"}]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPLANE_", "POWERTOOLS_"))}
    env |= {"RUNPLANE_POOLS": json.dumps(pools), "AWS_DEFAULT_REGION": "us-east-1", "POWERTOOLS_METRICS_DISABLED": "1"}
    root = COMPUTE.parents[1]
    done = subprocess.run(
        [sys.executable, "-c", LAMBDA], capture_output=True, text=True, env=env, cwd=root, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    answers = [line.split(" ", 2)[1:] for line in lines if line.startswith("ANSWER ")]
    assert len(answers) == 2
    for status, body in answers:
        assert status == "503"
        error = json.loads(body)["error"]
        assert error["code"] == "misconfigured" and "misconfigured" in error["message"]
        assert "pool" not in error["message"] and "aws-batch" not in error["message"]  # no internals
    calls = json.loads(next(line for line in lines if line.startswith("CALLS "))[6:])
    assert calls == {"pools": 1, "clients": 0}  # read once, refused before any client was built
    logged = done.stdout + done.stderr
    line = "inline pools: pool gpu: bad aws-batch options: job_queue: required"
    assert logged.count(line) == 1
    assert "Traceback" not in logged and "ValueError" not in logged


SDKS = ("boto3", "botocore", "azure", "kubernetes", "docker", "aws_lambda_powertools", "requests")
BLOCKED = """
import sys
for sdk in {sdks!r}:
    sys.modules[sdk] = None  # how Python marks a module that cannot be imported
from runplane.compute.registry import BACKENDS
for name, entry in BACKENDS.items():
    __import__(entry.model.__module__)
print(sorted(m for m in sys.modules if m.startswith("runplane.compute.")))
"""


def test_every_options_module_imports_no_sdk() -> None:
    """Pools are checked wherever they load, with or without a backend's extra: the registry and
    every options.py import with every SDK blocked, and bring no compute module in."""
    code = BLOCKED.format(sdks=SDKS)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=COMPUTE.parents[1], timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded = ast.literal_eval(done.stdout.strip())
    in_packages = {m for m in loaded if m.count(".") == 3}  # runplane.compute.<backend>.<module>
    assert in_packages == {f"runplane.compute.{name.replace('-', '_')}.options" for name in BACKENDS}
