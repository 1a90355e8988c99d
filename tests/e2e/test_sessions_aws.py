"""Sessions through the AWS relay as the AWS dev stack serves it (``runplane dev --cloud aws``): the
API answers with the relay's endpoint (base64 text frames of at most 16 KiB), and the CLI or the SDK
and the worker meet at the API Gateway WebSocket fake, whose routes are the relay function, its
connections in DynamoDB (moto); each message is handled by its own call of the function (two of one
side's may overtake each other) and nothing is held back by the gateway. ``runplane exec -i`` feeds
stdin and exits as the command did; ``Run.exec`` of ``cat`` gets more than a window of random bytes
back, every one in its place."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from runplane.client import Client
from runplane.domain.session_wire import WINDOW
from tests.e2e.test_cli import cli

pytestmark = pytest.mark.docker


def test_exec_through_the_aws_relay_feeds_stdin_exits_as_the_command_did_and_keeps_every_byte(aws_devstack):
    api = Client(aws_devstack.api_url, "alice-token")
    run = api.submit("sleep 600", queue="default")
    try:
        deadline = time.monotonic() + 120
        while run.refresh(wait=5).state != "running":
            assert not run.done and time.monotonic() < deadline, run.view
        session = api.open_session(run.id, "exec", command=["true"])
        assert (session.relay.encoding, session.relay.max_frame) == ("base64", 16 * 1024)
        api.close_session(run.id, session.id)
        proc = cli(aws_devstack, "exec", "-i", run.id, "--", "sh", stdin="echo hi; exit 3\n")
        assert (proc.returncode, proc.stdout) == (3, "hi\n"), proc.stderr
        data = os.urandom(2 * WINDOW + 12345)
        result = run.exec(["cat"], stdin=data)
        assert result.exit_code == 0, result.stderr
        assert len(result.stdout) == len(data)
        assert hashlib.sha256(result.stdout).hexdigest() == hashlib.sha256(data).hexdigest()
    finally:
        if not run.refresh().done:
            run.kill()
