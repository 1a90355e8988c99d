"""A local stack in a process of its own: ``python -m runplane.devstack CONFIG_JSON``.

The functions read one process-wide stack (as in a Lambda sandbox or a Functions worker), so a
second stack beside a first one, e.g. an Azure stack beside an AWS stack in one test session,
runs in a child process. The child prints one JSON line once it serves, and stops its stack
(agents included) on SIGTERM or SIGINT.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runplane.devstack.stack import DevConfig, DevStack


def config_json(config: DevConfig) -> str:
    return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(config).items()})


def config_from_json(text: str) -> DevConfig:
    """A DevConfig from ``config_json``'s output; raises ValueError naming an unknown field."""
    data = json.loads(text)
    known = {f.name for f in dataclasses.fields(DevConfig)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown DevConfig fields: {', '.join(sorted(unknown))}")
    for name in ("state_dir", "tls_cert", "tls_key"):
        if data.get(name) is not None:
            data[name] = Path(data[name])
    return DevConfig(**data)


def serve(config: DevConfig) -> None:
    """Run a stack until SIGTERM or SIGINT; its address goes to stdout as one JSON line."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stack = DevStack(config)
    try:
        stack.start()
        ready = {"api_url": stack.api_url, "token": stack.token, "endpoint": stack.endpoint, "services": stack.services}
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()
        stop.wait()
    finally:
        stack.stop()


class DevStackProcess:
    """A child process serving ``config``. ``start`` returns once it serves; ``stop`` ends it.

    Its log (stderr) goes to ``log_path``. Attributes after ``start``: ``api_url``, ``token``,
    ``endpoint`` (what serves its stores), ``services`` (what they are, in words) and ``config``.
    """

    def __init__(self, config: DevConfig, log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.log_path = log_path
        self.env = dict(os.environ if env is None else env)
        self.proc: subprocess.Popen[bytes] | None = None
        self.api_url = self.token = self.endpoint = self.services = ""

    def start(self, timeout: float = 120) -> None:
        """Raises RuntimeError, with the end of the child's log, when it does not come up."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runplane.devstack", config_json(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env=self.env,
            )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            readable, _, _ = select.select([self.proc.stdout], [], [], max(0.0, remaining))
            if not readable:
                self.stop()
                raise RuntimeError(f"the local stack did not come up in {timeout:g} s:\n{self._log_tail()}")
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                self.stop()
                raise RuntimeError(f"the local stack exited while starting:\n{self._log_tail()}")
            line += chunk
        ready: dict[str, Any] = json.loads(line)
        self.api_url, self.token, self.endpoint = ready["api_url"], ready["token"], ready["endpoint"]
        self.services = ready["services"]

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; idempotent."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
