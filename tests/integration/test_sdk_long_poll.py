"""The SDK waits by asking the API to hold its reads until the run changes, not by polling: a run
that ends after a few seconds is read a handful of times. Against a stack that does not wait (an
older one: it ignores the parameters and sends no revision) it still works, never spinning; a
state this release does not know is not waited on silently.

The stack is the one-machine stack behind the local front (runplane/devstack), each request
counted, or changed as an older or a newer release would answer it, on its way."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from dataclasses import replace

import pytest

from runplane import bootstrap
from runplane.client import AsyncClient, Client, WaitTimeout
from runplane.devstack.front import FrontServer
from runplane.devstack.local import LocalCloud
from runplane.settings import StackSettings
from tests.conftest import POOLS_FILE, register_users

PARKED = {"queue": "parked"}
RUN_READ = re.compile(r"^/v1/runs/r-[A-Za-z0-9-]+$")


class Counted:
    """The local cloud's front, counting the reads of one run; ``old``: answered as a release
    before long-polls (the parameters dropped, no revision sent); ``renamed``: a queued run shown
    in a state of a newer release."""

    def __init__(self, cloud: LocalCloud) -> None:
        self.cloud, self.reads, self.old, self.renamed = cloud, 0, False, None

    def http(self, request):
        if request.method == "GET" and RUN_READ.match(request.path):
            self.reads += 1
            if self.old:
                request = replace(request, query="")
        response = self.cloud.http(request)
        if (self.old or self.renamed) and RUN_READ.match(request.path) and response.status == 200:
            body = json.loads(response.body)
            if self.old:
                body.pop("revision")
            if self.renamed and body["state"] == "queued":
                body["state"] = self.renamed
            response = replace(response, body=json.dumps(body).encode())
        return response

    def __getattr__(self, name):
        return getattr(self.cloud, name)


@pytest.fixture
def front(tmp_path):
    cloud = LocalCloud(tmp_path / "state", "http://127.0.0.1:9")
    settings = StackSettings(cloud="local", pools=str(POOLS_FILE), **cloud.settings())
    stack = cloud.build(settings)
    cloud.provision(stack)
    register_users(stack.tokens)
    before = bootstrap.use(stack)
    counted = Counted(cloud)
    server = FrontServer(("127.0.0.1", 0), counted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    counted.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield counted
    server.shutdown()
    server.server_close()
    bootstrap.use(before)


def _kill_later(front, run_id, seconds):
    timer = threading.Timer(seconds, lambda: Client(front.url, "alice-token").kill(run_id))
    timer.start()
    return timer


def test_wait_and_follow_are_answered_when_the_run_ends(front):
    client = Client(front.url, "alice-token")
    run = client.submit("echo hi", **PARKED)
    front.reads = 0
    timer = _kill_later(front, run.id, 3.0)
    assert run.wait(timeout=30).state == "killed"
    timer.join()
    assert 1 <= front.reads <= 3, f"{front.reads} reads of a run that ended after 3 s: polled, not waited"

    run, front.reads = client.submit("echo hi", **PARKED), 0
    timer = _kill_later(front, run.id, 3.0)
    assert list(run.follow_chunks()) == [] and run.state == "killed"
    timer.join()
    assert 1 <= front.reads <= 4, f"{front.reads} reads while following a run that ended after 3 s"


def test_the_async_wait_is_answered_when_the_run_ends(front):
    async def waited():
        async with AsyncClient(front.url, "alice-token") as client:
            run = await client.submit("echo hi", **PARKED)
            front.reads = 0
            timer = _kill_later(front, run.id, 3.0)
            await run.wait(timeout=30)
            timer.join()
            return run.state

    assert asyncio.run(waited()) == "killed"
    assert 1 <= front.reads <= 3, f"{front.reads} reads of a run that ended after 3 s"


def test_a_stack_that_does_not_wait_is_read_every_poll_never_in_a_spin(front):
    client = Client(front.url, "alice-token")
    run = client.submit("echo hi", **PARKED)
    front.old, front.reads = True, 0
    timer = _kill_later(front, run.id, 2.0)
    assert run.wait(timeout=30, poll=0.5).state == "killed"
    timer.join()
    assert 2 <= front.reads <= 8, f"{front.reads} reads in 2 s at one every 0.5 s"


def test_a_state_this_release_does_not_know_is_warned_of_and_named_when_the_wait_ends(front):
    client = Client(front.url, "alice-token")
    run = client.submit("echo hi", **PARKED)
    front.renamed = "hibernating"
    with pytest.warns(RuntimeWarning, match="state 'hibernating', which this release of runplane does not know"):
        with pytest.raises(WaitTimeout, match=r"is still 'hibernating' \(run r-.* does not know.*\) after 1s"):
            run.refresh().wait(timeout=1)
    assert run.state == "hibernating"  # kept, readable
