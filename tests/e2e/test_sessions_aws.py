"""``runplane exec`` through the AWS relay as the AWS dev stack serves it (``runplane dev --cloud aws``):
the API answers with the relay's endpoint (base64 frames), and the CLI and the worker meet at the API
Gateway WebSocket fake, whose routes are the relay function, its connections in DynamoDB (moto)."""

from __future__ import annotations

import time

import pytest

from runplane.client import Client
from tests.e2e.test_cli import cli

pytestmark = pytest.mark.docker


def test_exec_through_the_aws_relay_feeds_stdin_and_exits_as_the_command_did(aws_devstack):
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
    finally:
        if not run.refresh().done:
            run.kill()
