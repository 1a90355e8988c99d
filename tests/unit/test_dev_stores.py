"""``runplane dev`` on stores you already have (``--azure-connection``, ``--aws-endpoint``): options
that contradict each other, and stores that cannot be used, are one line on stderr and exit 2,
with nothing of the stack left running."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from runplane.cli.app import run_cli
from runplane.devstack.stack import free_port


def dev(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> list[str]:
    """``runplane dev --port P ARGS`` in a process of its own (it would change this one's
    environment and signal handlers), which must fail with exit 2: its stderr lines."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RUNPLANE_")}
    environ |= {"HOME": str(tmp_path), **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "runplane.cli", "dev", "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    return done.stderr.strip().splitlines()


@pytest.fixture
def closed_port():
    """A port on 127.0.0.1 that refuses connections."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--cloud", "aws", "--azure-connection", "UseDevelopmentStorage=true"],
            "--azure-connection is for --cloud azure (it implies it: leave --cloud out)",
        ),
        (
            ["--cloud", "azure", "--aws-endpoint", "http://127.0.0.1:4566"],
            "--aws-endpoint is for --cloud aws (it implies it: leave --cloud out)",
        ),
        (
            ["--cloud", "local", "--aws-endpoint", "http://127.0.0.1:4566"],
            "--aws-endpoint is for --cloud aws (it implies it: leave --cloud out)",
        ),
        (
            ["--azure-connection", "UseDevelopmentStorage=true", "--aws-endpoint", "http://127.0.0.1:4566"],
            "--azure-connection and --aws-endpoint name stores of two clouds: give one",
        ),
        (["--azure-connection", " "], "--azure-connection is empty"),
        (["--aws-endpoint", "localhost:4566"], "the AWS endpoint 'localhost:4566' is not an http:// or https:// URL"),
    ],
)
def test_options_that_cannot_be_served_are_one_line_before_anything_starts(args, line, capsys):
    assert run_cli(["dev", "--port", str(free_port()), *args]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {line}"]


def test_a_wrong_connection_string_from_the_environment_is_one_line(tmp_path):
    assert dev(tmp_path, env={"RUNPLANE_AZURE_CONNECTION": "no key here"}) == [
        "error: cannot use the azure stores: the Azure storage connection string has no AccountName"
    ]


def test_an_aws_endpoint_that_does_not_answer_is_one_line(tmp_path, closed_port):
    [line] = dev(tmp_path, "--aws-endpoint", f"http://127.0.0.1:{closed_port}")
    assert line.startswith(f"error: cannot use the aws stores: provision stack at http://127.0.0.1:{closed_port}: ")
    assert "Could not connect" in line


def test_a_pool_with_bad_options_is_one_line_naming_the_pool_and_the_option(tmp_path):
    """A pools file is checked whole as it loads, each pool's options by its backend: the mistake
    stops `runplane dev` before any service starts, not at the first launch minutes later."""
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "pools:\n"
        "  - {name: cpu, backend: local, cpus: 1, memory: 1g, default_image: busybox}\n"
        "  - {name: gpu, backend: aws-batch, cpus: 1, memory: 1g, default_image: busybox, options: {image: a}}\n"
    )
    assert dev(tmp_path, "--pools", str(pools)) == [
        f"error: {pools}: pool gpu: bad aws-batch options: job_queue: required"
    ]


def test_fresh_empties_no_directory_that_is_not_a_stacks(tmp_path):
    """``--fresh`` on a state dir holding something else (a mistyped ``--state-dir``) removes nothing."""
    port = free_port()
    home = tmp_path / "state" / str(port)
    home.mkdir(parents=True)
    (home / "state.db").write_text("")
    (home / "thesis.tex").write_text("months of work")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RUNPLANE_")} | {"HOME": str(tmp_path)}
    command = [sys.executable, "-m", "runplane.cli", "dev", "--port", str(port), "--state-dir", str(tmp_path / "state")]
    done = subprocess.run([*command, "--fresh"], capture_output=True, text=True, env=environ, timeout=120)

    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {home} does not look like a runplane stack's directory (it holds thesis.tex): not emptied; "
        "remove it yourself or choose another state dir"
    ]
    assert sorted(p.name for p in home.iterdir()) == ["state.db", "thesis.tex"]
