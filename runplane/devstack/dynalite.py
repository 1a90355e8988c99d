"""dynalite (DynamoDB's API in Node.js, in memory) in a process of its own: the tables of
``runplane dev --cloud aws``, where it is installed (``scripts/start-dynalite.sh --install`` puts
it in the checkout's ``.dynalite/``; else ``dynalite`` on the PATH). Unlike moto's DynamoDB it
applies each item's conditional writes atomically when they race, and answers a query from its
index rather than by reading the whole table, as DynamoDB does."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import requests

from runplane.devstack.net import free_port
from runplane.domain.errors import BackendError

__all__ = ["DynaliteProcess", "dynalite_command"]

START_SECONDS = 30.0
ACTIVE_AT_ONCE = ("--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0")
"""Tables ACTIVE at once (dynalite's default keeps them CREATING for half a second)."""
CHECKOUT_BIN = Path(__file__).resolve().parents[2] / ".dynalite" / "node_modules" / ".bin" / "dynalite"


def dynalite_command() -> str | None:
    """dynalite's program: the checkout's, else one on the PATH; None when there is none."""
    if CHECKOUT_BIN.is_file() and os.access(CHECKOUT_BIN, os.X_OK):
        return str(CHECKOUT_BIN)
    return shutil.which("dynalite")


class DynaliteProcess:
    """dynalite on a free loopback port, its tables ACTIVE at once."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """Its endpoint once it answers; BackendError if it does not within START_SECONDS (then
        it is stopped)."""
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        try:
            self.process = subprocess.Popen(
                [self.command, "--host", "127.0.0.1", "--port", str(port), *ACTIVE_AT_ONCE],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C of `runplane dev` must not stop it before the stack
            )
        except OSError as e:
            raise BackendError(f"dynalite did not start: {e}") from e
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline and self.process.poll() is None:
            with contextlib.suppress(requests.RequestException):
                if "healthy: dynamodb" in requests.get(endpoint, timeout=1).text:
                    return endpoint
            time.sleep(0.1)
        code = self.process.poll()
        self.stop()
        raise BackendError(f"dynalite did not answer on {endpoint} (exit {code})")

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
