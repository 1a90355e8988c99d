"""runplane/devstack/azurite.py, which starts Azurite for ``runplane dev --cloud azure`` and for the
tests (scripts/start-azurite.sh runs it): on ports of its own here, from the checkout's install
(the ``azurite`` fixture makes sure of it), so that these Azurites start and stop with each test."""

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.storage.blob import BlobServiceClient

from runplane.devstack.azurite import AzuriteError, NpmMissing, Ports, default_prefix, start_azurite
from tests.conftest import ROOT, free_port


def _ports() -> Ports:
    return Ports(blob=free_port(), queue=free_port(), table=free_port())


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """Where the test's Azurite keeps its pid; whatever it started is stopped afterwards."""
    yield tmp_path / "state"
    pid_file = tmp_path / "state" / "azurite.pid"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_it_starts_azurite_detached_and_reuses_it(azurite: str, state_dir: Path) -> None:
    ports = _ports()
    connection = start_azurite(state_dir, default_prefix(), ports)
    assert connection == ports.connection_string()
    assert f"BlobEndpoint=http://127.0.0.1:{ports.blob}/devstoreaccount1;" in connection
    service = BlobServiceClient.from_connection_string(connection)
    service.create_container("packaged")
    assert [c.name for c in service.list_containers()] == ["packaged"]
    pid = int((state_dir / "azurite.pid").read_text())
    parent = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    assert parent != os.getpid()  # not this process's child: it outlives the caller
    assert os.getsid(pid) != os.getsid(0)  # a Ctrl-C in the caller's terminal does not reach it
    # answering already: the same one again, not a second Azurite
    assert start_azurite(state_dir / "second", default_prefix(), ports) == connection
    assert not (state_dir / "second").exists()
    assert [c.name for c in service.list_containers()] == ["packaged"]


def test_an_azurite_that_cannot_start_fails_with_its_log_and_is_stopped(azurite: str, state_dir: Path) -> None:
    ports = _ports()
    with socket.socket() as taken:  # something else holds the blob port
        taken.bind(("127.0.0.1", ports.blob))
        taken.listen()
        with pytest.raises(AzuriteError) as failed:
            start_azurite(state_dir, default_prefix(), ports, start_timeout=60)
    message = str(failed.value)
    assert message.startswith(f"Azurite did not come up; the end of its log ({state_dir / 'azurite.log'}):")
    assert "EADDRINUSE" in message
    assert not _alive(int((state_dir / "azurite.pid").read_text()))


def test_without_npm_it_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(NpmMissing, match=r"^Azurite needs Node.js and npm: apt-get install -y nodejs npm$"):
        start_azurite(tmp_path / "state", tmp_path / "prefix", _ports())


def test_the_script_prints_the_connection_string_last(azurite: str) -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "start-azurite.sh")], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == azurite
    installed = subprocess.run(
        [str(ROOT / "scripts" / "start-azurite.sh"), "--install"], capture_output=True, text=True, timeout=120
    )
    assert (installed.returncode, installed.stdout) == (0, "")
