"""moto's server (DynamoDB, SQS, S3 on one loopback port) in a process of its own.

The local stack's API, dispatcher and reaper run in ``runplane dev``'s process; moto answering
every agent's calls in that same interpreter would share one GIL with them, and at sweep scale
(many runs a second on a few workers) moto's own work is most of the stack's: in a process of its
own it has a core to itself, as the cloud's services do. The child applies each DynamoDB request
whole (``atomic_dynamodb_items``), and exits when its parent does: it serves until its standard
input closes.

    python -m runplane.devstack.moto_process --port 0      # prints "moto ready PORT" once serving
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import select
import signal
import subprocess
import sys
import threading
from typing import Any

from runplane.domain.errors import BackendError

READY = "moto ready"
START_SECONDS = 60.0


class MotoProcess:
    """A moto server child process on a free loopback port."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None
        self.endpoint = ""

    def start(self) -> str:
        """Start the child and return its endpoint once it serves; BackendError if it does not
        within START_SECONDS (the child is stopped then)."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "runplane.devstack.moto_process", "--port", "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # a Ctrl-C of `runplane dev` must not stop it before the stack
        )
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], START_SECONDS)
        line = self.process.stdout.readline() if ready else ""  # READY and the port it took, or EOF
        word, _, port = line.strip().rpartition(" ")
        if word != READY or not port.isdigit():
            code = self.process.poll()
            self.stop()
            raise BackendError(f"moto's server did not start (exit {code}): {line.strip()[:200] or 'no answer'}")
        self.endpoint = f"http://127.0.0.1:{port}"
        return self.endpoint

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()  # the child's signal to stop
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


def atomic_dynamodb_items() -> None:
    """Make the in-process moto server apply each DynamoDB request whole, as DynamoDB does. Its
    server handles requests in threads and checks a write's condition without a lock, so two
    workers claiming one run at the same moment could both win; agents that start the first run
    in their pool's line, whatever hint they hold, race for it as a matter of course. One lock
    over moto's item operations makes each condition and its write one step (the local stack's
    few requests a second do not notice it)."""
    from moto.dynamodb.models import DynamoDBBackend

    lock = threading.RLock()
    for name in ("put_item", "update_item", "delete_item", "transact_write_items", "get_item", "query", "scan"):
        original = getattr(DynamoDBBackend, name)
        if getattr(original, "_one_at_a_time", False):
            continue

        @functools.wraps(original)
        def one_at_a_time(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            with lock:
                return _original(self, *args, **kwargs)

        one_at_a_time._one_at_a_time = True  # type: ignore[attr-defined]
        setattr(DynamoDBBackend, name, one_at_a_time)


COUNTS_ENV = "RUNPLANE_MOTO_COUNTS"
"""A file the server writes, when it stops, with how many requests of each service and action it
answered ({"dynamodb.Query": 12, ...}), and again on each SIGUSR1: the benchmarks' count of
store round trips."""


def _count_requests(path: str) -> None:
    import atexit
    import collections
    import json

    from moto.core.responses import BaseResponse

    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    original = BaseResponse.call_action

    def counted(self: BaseResponse) -> Any:
        with lock:
            counts[f"{type(self).__module__.split('.')[1]}.{self._get_action()}"] += 1
        return original(self)

    BaseResponse.call_action = counted  # type: ignore[method-assign]

    def write() -> None:
        with lock, open(path, "w") as f:
            json.dump(dict(counts), f)

    atexit.register(write)
    signal.signal(signal.SIGUSR1, lambda *_: write())  # a count so far, on request


def serve(port: int) -> None:
    from moto.server import ThreadedMotoServer

    atomic_dynamodb_items()
    if os.environ.get(COUNTS_ENV):
        _count_requests(os.environ[COUNTS_ENV])
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()  # bound and listening once it returns (port 0: the kernel picks a free one)
    print(READY, server.get_host_and_port()[1], flush=True)
    try:
        sys.stdin.read()  # until the parent closes it, or is gone
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description="moto's server for the local stack")
    parser.add_argument("--port", type=int, required=True)
    serve(parser.parse_args().port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
