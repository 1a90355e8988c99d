"""Sessions through the AWS relay as the AWS dev stack serves it (``runplane dev --cloud aws``): the
API answers with the relay's endpoint (base64 text frames of at most 16 KiB), and the CLI or the SDK
and the worker meet at the API Gateway WebSocket fake, whose routes are the relay function, its
connections in DynamoDB (moto); each message is handled by its own call of the function (two of one
side's may overtake each other) and nothing is held back by the gateway. ``runplane exec -i`` feeds
stdin and exits as the command did; ``Run.exec`` of ``cat`` gets more than a window of random bytes
back, every one in its place, and again while the gateway cuts the client's connection every second
(each side dials again and the session resumes)."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

from runplane.adapters.aws.relay import AwsSessionRelay
from runplane.bootstrap import build_stack
from runplane.client import Client
from runplane.domain.session_wire import WINDOW
from tests.conftest import aws_devstack_settings
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
        settings = aws_devstack_settings(aws_devstack).model_copy(update={"relay_url": session.relay.url})
        relay = build_stack(settings).relay
        assert isinstance(relay, AwsSessionRelay)
        cuts: list[str] = []
        done = threading.Event()

        def cut_every_second() -> None:  # the client's connection, as the gateway's DELETE @connections does
            while len(set(cuts)) < 2 and not done.wait(1.0):  # twice: not as the command exits (not resumed)
                for live in api.sessions(run.id):
                    held = relay.connections.sides(live.id).get("client") if live.state == "active" else None
                    if held is not None:
                        relay.gateway.delete(held.connection_id)
                        cuts.append(held.connection_id)

        cutter = threading.Thread(target=cut_every_second, daemon=True)
        cutter.start()
        try:
            result = run.exec(["sh", "-c", "cat; sleep 5"], stdin=data)  # its EXIT well after the cuts
        finally:
            done.set()
            cutter.join(10)
        assert result.exit_code == 0, result.stderr
        assert hashlib.sha256(result.stdout).hexdigest() == hashlib.sha256(data).hexdigest()
        assert len(set(cuts)) >= 2, cuts  # it was cut, more than once, and went on
    finally:
        if not run.refresh().done:
            run.kill()
