"""A session's wire through the AWS dev stack's relay (``runplane dev --cloud aws``): base64 text
frames of at most 16 KiB, each message handled by its own call of the relay function (two of one
side's may overtake each other), nothing held back by the gateway. ``Run.exec`` of ``cat`` gets
more than a window of random bytes back, every one in its place."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from runplane.client import Client
from runplane.domain.session_wire import WINDOW

pytestmark = pytest.mark.docker


def test_cat_gives_back_more_than_a_window_of_random_bytes_through_the_aws_relay(aws_devstack):
    api = Client(aws_devstack.api_url, "alice-token")
    run = api.submit("sleep 600", queue="default")
    try:
        deadline = time.monotonic() + 120
        while run.refresh(wait=5).state != "running":
            assert not run.done and time.monotonic() < deadline, run.view
        data = os.urandom(2 * WINDOW + 12345)
        result = run.exec(["cat"], stdin=data)
        assert result.exit_code == 0, result.stderr
        assert hashlib.sha256(result.stdout).hexdigest() == hashlib.sha256(data).hexdigest()
        assert len(result.stdout) == len(data)
    finally:
        if not run.refresh().done:
            run.kill()
