"""Azurite, the Azure Storage emulator (Blob, Queue, Table), for ``runplane dev --cloud azure`` and
the tests: installed with npm into a prefix when missing, started on 127.0.0.1 unless its ports
already answer, and reached through the well-known development account's connection string. Its
data lives in memory: a restart starts empty.

``python -m runplane.devstack.azurite [--install] [--prefix DIR] [STATE_DIR]`` is the command line
behind scripts/start-azurite.sh; it prints the connection string on its last line. Standard library
only: the script runs it before a virtualenv has any package.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["VERSION", "AzuriteError", "NpmMissing", "Ports", "default_prefix", "install", "start_azurite"]

log = logging.getLogger(__name__)

# 3.35 is the newest release that runs on Debian 12's Node.js 18; later ones need Node 21+.
VERSION = "3.35.0"
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_CHECKOUT = Path(__file__).resolve().parents[2]


class AzuriteError(ValueError):
    """Azurite could not be installed or started; the message says why."""


class NpmMissing(AzuriteError):
    """Installing Azurite needs npm, and there is none on PATH."""


@dataclass(frozen=True)
class Ports:
    blob: int = 10000
    queue: int = 10001
    table: int = 10002

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Ports:
        """The ports of AZURITE_BLOB_PORT, AZURITE_QUEUE_PORT and AZURITE_TABLE_PORT, each
        defaulting to Azurite's own. Raises AzuriteError for one that is not a port number."""
        environ = os.environ if environ is None else environ
        ports = {}
        for name, default in (("blob", cls.blob), ("queue", cls.queue), ("table", cls.table)):
            text = environ.get(f"AZURITE_{name.upper()}_PORT") or str(default)
            if not text.isdigit() or not 0 < int(text) < 65536:
                raise AzuriteError(f"AZURITE_{name.upper()}_PORT must be a port number, got {text!r}")
            ports[name] = int(text)
        return cls(**ports)

    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint=http://127.0.0.1:{self.blob}/{ACCOUNT};"
            f"QueueEndpoint=http://127.0.0.1:{self.queue}/{ACCOUNT};"
            f"TableEndpoint=http://127.0.0.1:{self.table}/{ACCOUNT};"
        )

    def answer(self) -> bool:
        """Whether something listens on each of the three ports of 127.0.0.1."""
        for port in (self.blob, self.queue, self.table):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return False
        return True


def default_prefix() -> Path:
    """Where Azurite is installed: ``.azurite/`` of the checkout this module runs from (where
    ``scripts/setup.sh --test`` puts it for the tests), else ``~/.runplane/azurite``."""
    if (_CHECKOUT / "scripts" / "start-azurite.sh").is_file() and (_CHECKOUT / "pyproject.toml").is_file():
        return _CHECKOUT / ".azurite"
    return Path("~/.runplane/azurite").expanduser()


def _binary(prefix: Path) -> Path:
    return prefix / "node_modules" / ".bin" / "azurite"


def _installed(prefix: Path) -> bool:
    try:
        package = json.loads((prefix / "node_modules" / "azurite" / "package.json").read_text())
    except (OSError, ValueError):
        return False
    return os.access(_binary(prefix), os.X_OK) and package.get("version") == VERSION


@contextlib.contextmanager
def _locked(prefix: Path) -> Iterator[None]:
    """One install or start at a time: a second caller waits here, then finds the first one's work done."""
    prefix.mkdir(parents=True, exist_ok=True)
    with (prefix / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def install(prefix: Path, timeout: float = 600) -> None:
    """Install Azurite ``VERSION`` with npm into ``prefix`` unless it is there. The caller holds
    the prefix's lock. Raises NpmMissing without npm and AzuriteError when npm fails."""
    if _installed(prefix):
        return
    npm = shutil.which("npm")
    if npm is None:
        raise NpmMissing("Azurite needs Node.js and npm: apt-get install -y nodejs npm")
    log.info("installing azurite %s into %s", VERSION, prefix)
    command = [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-save", f"azurite@{VERSION}"]
    with tempfile.TemporaryFile() as output:
        try:
            done = subprocess.run(
                command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise AzuriteError(f"npm install azurite@{VERSION} did not finish within {timeout:g} s") from None
        if done.returncode != 0 or not _installed(prefix):
            output.seek(0)
            tail = output.read().decode(errors="replace").strip().splitlines()[-20:]
            raise AzuriteError(f"npm install azurite@{VERSION} failed:\n" + "\n".join(tail))


def _spawn(prefix: Path, state_dir: Path, ports: Ports) -> int:
    """Start Azurite, detached, and return its pid."""
    state_dir.mkdir(parents=True, exist_ok=True)
    command = [
        str(_binary(prefix)),
        *("--silent", "--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck", "--loose"),
        *("--blobHost", "127.0.0.1", "--blobPort", str(ports.blob)),
        *("--queueHost", "127.0.0.1", "--queuePort", str(ports.queue)),
        *("--tableHost", "127.0.0.1", "--tablePort", str(ports.table)),
    ]
    # Through a shell that leaves it in the background and exits: Azurite outlives this process
    # (other stacks and test runs share it), nothing here has to reap it, and in a session of its
    # own a Ctrl-C in this terminal does not reach it. In memory it writes nothing, but it runs in
    # the state dir in case a version does.
    launcher = subprocess.run(
        ["/bin/sh", "-c", '"$@" </dev/null >azurite.log 2>&1 & echo $!', "sh", *command],
        cwd=state_dir,
        start_new_session=True,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    pid = int(launcher.stdout)
    (state_dir / "azurite.pid").write_text(f"{pid}\n")
    return pid


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie has exited


def start_azurite(
    state_dir: Path | None = None,
    prefix: Path | None = None,
    ports: Ports | None = None,
    install_timeout: float = 600,
    start_timeout: float = 60,
) -> str:
    """Azurite on 127.0.0.1 and its connection string. Something already answering on the three
    ports is taken to be Azurite and reused; else Azurite is installed into ``prefix`` (default:
    ``default_prefix()``) when missing and started with its log and pid in ``state_dir`` (default:
    ``PREFIX/run-BLOBPORT``). It keeps running after this process ends.

    Raises NpmMissing when it must be installed and npm is missing, AzuriteError when the install
    fails or Azurite does not answer within ``start_timeout`` seconds (then the message ends with
    its log's last lines and the process is stopped)."""
    ports = ports or Ports.from_env()
    if ports.answer():
        return ports.connection_string()
    prefix = prefix or default_prefix()
    with _locked(prefix):
        install(prefix, install_timeout)
        if ports.answer():  # another caller started it while this one waited for the lock
            return ports.connection_string()
        state_dir = state_dir or prefix / f"run-{ports.blob}"
        pid = _spawn(prefix, state_dir, ports)
        deadline = time.monotonic() + start_timeout
        while _alive(pid) and time.monotonic() < deadline:
            if ports.answer():
                return ports.connection_string()
            time.sleep(0.1)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    log_file = state_dir / "azurite.log"
    tail = log_file.read_text(errors="replace").strip().splitlines()[-20:]
    raise AzuriteError("\n".join([f"Azurite did not come up; the end of its log ({log_file}):", *tail]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="start-azurite",
        description="Start Azurite on 127.0.0.1 unless it answers, installing it with npm first if it is missing; "
        "print its connection string. Ports: AZURITE_BLOB_PORT, AZURITE_QUEUE_PORT, AZURITE_TABLE_PORT.",
    )
    parser.add_argument("--install", action="store_true", help="only install Azurite, do not start it")
    parser.add_argument("--prefix", type=Path, help="where Azurite is installed (default: %(default)s)")
    parser.add_argument("state_dir", nargs="?", type=Path, help="its log and pid (default: PREFIX/run-BLOBPORT)")
    parser.set_defaults(prefix=default_prefix())
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="start-azurite: %(message)s")
    try:
        if args.install:
            with _locked(args.prefix):
                install(args.prefix)
            return 0
        print(start_azurite(args.state_dir, args.prefix))
    except AzuriteError as e:
        print(f"start-azurite: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
