"""The Python SDK (``runplane.client``) against the real local stack: runs on real Docker, logs and
outputs through the stack's object store, every error kind the API can give, and the asyncio
client doing the same."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from runplane.client import (
    AsyncClient,
    AsyncRun,
    AsyncSweep,
    BadRequest,
    Client,
    Conflict,
    ConnectionFailed,
    DownloadFailed,
    Forbidden,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    Run,
    RunState,
    Unauthorized,
    WaitTimeout,
)
from tests.conftest import ROOT, wait_for
from tests.gate import GATE, open_gate, output_dir

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def admin(devstack):
    with Client(devstack.api_url, "admin-token") as client:
        yield client


@pytest.fixture(scope="module")
def alice(devstack):
    with Client(devstack.api_url, "alice-token") as client:
        yield client


@pytest.fixture
def newcomer(devstack, admin):
    """A client of a user of their own, made with ``create_token``: their runs are only the test's."""
    made = admin.create_token(f"sdk-{uuid.uuid4().hex[:8]}")
    with Client(devstack.api_url, made.token) as client:
        yield client


def gate_of(devstack, run_id: str) -> Path:
    """The output directory of a run on the stack's own agents (pool "default")."""
    return output_dir(Path(devstack.config.state_dir) / str(devstack.config.port) / "agents", run_id)


def test_submit_replay_wait_logs(alice, docker_client):
    key = f"sdk-{uuid.uuid4()}"
    run = alice.submit("echo hello; echo oops >&2", name="sdk", memory="256m", time="5m", idempotency_key=key)
    assert isinstance(run, Run) and run.created is True
    assert run.spec.resources.memory == 256 * 1024**2 and run.queue == "default"  # attributes of the view
    again = alice.submit("echo hello; echo oops >&2", name="sdk", memory="256m", time="5m", idempotency_key=key)
    assert (again.id, again.created) == (run.id, False)
    assert run.wait(timeout=120) is run
    assert (run.state, run.exit_code, run.done, run.failure) == (RunState.SUCCEEDED, 0, True, None)
    assert run.logs() == "hello\n"
    assert run.logs("stderr") == "oops\n"
    page = alice.logs(run.id, "stdout", offset=2)
    assert (page.data, page.next_offset, page.complete) == ("llo\n", 6, True)
    assert alice.get(run.id).state == RunState.SUCCEEDED
    with pytest.raises(Conflict, match="already finished"):
        run.kill()
    with pytest.raises(Conflict, match="Idempotency-Key was already used for a different request"):
        alice.submit("echo something else", idempotency_key=key)


def test_wait_gives_up_after_its_timeout(alice):
    run = alice.submit("x", queue="parked")  # no worker ever takes it
    with pytest.raises(WaitTimeout, match=f"run {run.id} is still queued after 0.3s") as caught:
        run.wait(timeout=0.3, poll=0.1)
    assert isinstance(caught.value, TimeoutError)
    assert run.kill().state == RunState.KILLED  # a queued run is killed at once


def test_follow_yields_lines_as_the_run_prints_them(devstack, alice, docker_client):
    run = alice.submit(f"echo one; printf par; {GATE}; echo tial; echo two; echo bad >&2")
    states = []
    chunks = run.follow_chunks(("stdout", "stderr"), on_state=lambda r: states.append(r.state), poll=0.1)
    assert next(chunks) == ("stdout", "one\n")  # the whole line only: "par" waits for its end
    assert run.state == RunState.RUNNING  # held at its gate: "one" came while it ran
    open_gate(gate_of(devstack, run.id))
    rest = list(chunks)
    assert "".join(text for stream, text in rest if stream == "stdout") == "partial\ntwo\n"
    assert [text for stream, text in rest if stream == "stderr"] == ["bad\n"]
    assert run.state == RunState.SUCCEEDED and run.exit_code == 0  # the run was kept up to date
    assert states[-1] == RunState.SUCCEEDED and RunState.RUNNING in states
    assert "".join(run.follow()) == "one\npartial\ntwo\n"  # a finished run: everything, then the end


def test_kill_a_running_run(devstack, alice, docker_client):
    run = alice.submit(f"echo started; {GATE}")
    wait_for(lambda: run.logs() == "started\n", 60, 0.2, "the run to print")
    assert run.kill() is run and run.kill_requested
    assert run.wait(timeout=60).state == RunState.KILLED
    assert run.failure is not None and run.failure.reason == "killed"
    assert "".join(run.follow()) == "started\n"


def test_outputs_and_download(alice, docker_client, tmp_path):
    run = alice.submit("mkdir -p sub && echo 42 > answer && printf abc > sub/letters").wait(timeout=120)
    assert run.state == RunState.SUCCEEDED, run.failure
    assert sorted((f.path, f.size) for f in run.outputs()) == [("answer", 3), ("sub/letters", 3)]
    dest = tmp_path / "out"
    seen = []
    paths = run.download(dest, progress=lambda done, total: seen.append((done, total)))
    assert sorted(paths) == [dest / "answer", dest / "sub" / "letters"]
    assert (dest / "answer").read_text() == "42\n" and (dest / "sub" / "letters").read_text() == "abc"
    assert seen[-1] == (6, 6)
    assert run.download(dest) == paths  # the same bytes again: nothing to refuse
    (dest / "answer").write_text("a longer file\n")
    with pytest.raises(DownloadFailed, match=r"answer exists and differs; use --force"):
        run.download(dest)
    assert (dest / "answer").read_text() == "a longer file\n"
    (dest / "answer").write_text("43\n")  # same size, other bytes: found when it is downloaded
    with pytest.raises(DownloadFailed, match=r"answer exists and differs; use --force"):
        run.download(dest)
    assert (dest / "answer").read_text() == "43\n"
    assert not list(dest.rglob("*.part"))
    run.download(dest, force=True)
    assert (dest / "answer").read_text() == "42\n"
    single = tmp_path / "single"
    file = next(f for f in run.outputs() if f.path == "answer")
    alice.download_file(file.url, single)
    assert single.read_text() == "42\n"
    with pytest.raises(DownloadFailed, match="download of broken failed: HTTP 40"):
        alice.download_file(file.url.replace("/answer?", "/missing?"), tmp_path / "broken")
    assert not (tmp_path / "broken").exists() and not (tmp_path / "broken.part").exists()


def test_runs_iterates_across_pages_with_filters(devstack, admin, newcomer):
    made = [newcomer.submit(f"echo {i}", queue="parked") for i in range(3)]
    ids = [r.id for r in reversed(made)]  # newest first
    assert [r.id for r in newcomer.runs(page_size=1)] == ids
    assert [r.id for r in newcomer.runs(page_size=2, limit=2)] == ids[:2]
    page = newcomer.runs_page(limit=2)
    assert [r.id for r in page.runs] == ids[:2] and page.next_cursor is not None
    newcomer.kill(made[0].id)
    assert [r.id for r in newcomer.runs(state="queued", page_size=1)] == ids[:2]
    assert [r.id for r in newcomer.runs(state=RunState.KILLED)] == [made[0].id]
    assert [r.id for r in newcomer.runs(queue="default")] == []
    me = newcomer.me().user
    assert [r.id for r in admin.runs(owner=me, page_size=2)] == ids  # an admin lists anyone's
    with pytest.raises(Forbidden):
        list(newcomer.runs(owner="admin"))
    for run in made[1:]:
        run.kill()


def test_each_error_is_its_own_kind(devstack, admin, alice):
    run = alice.submit("x", queue="parked")
    other = admin.create_token(f"sdk-{uuid.uuid4().hex[:8]}")
    with Client(devstack.api_url, other.token) as stranger:
        with pytest.raises(NotFound, match=f"run {run.id} not found") as caught:
            stranger.get(run.id)  # another user's run is no run of theirs
        assert (caught.value.status, caught.value.code) == (404, "not_found")
        with pytest.raises(NotFound):
            stranger.kill(run.id)
    with pytest.raises(NotFound, match="run r-nope not found"):
        alice.get("r-nope")
    with Client(devstack.api_url, "wrong") as bad, pytest.raises(Unauthorized) as caught:
        bad.me()
    assert caught.value.status == 401
    reader = admin.create_token("alice", scopes=["runs:read"])
    with Client(devstack.api_url, reader.token) as read_only:
        assert read_only.get(run.id).id == run.id
        with pytest.raises(Forbidden, match="runs:write") as caught:
            read_only.submit("x")
        assert caught.value.status == 403
    with pytest.raises(InvalidRequest, match="no pool can run this request"):
        alice.submit("x", memory="1t")
    with pytest.raises(InvalidRequest, match=r"resources\.cpus"):
        alice.submit("x", resources={"cpus": -1})
    with pytest.raises(InvalidRequest, match="unknown state"):
        list(alice.runs(state="sleeping"))
    with pytest.raises(BadRequest, match="cursor is not valid"):
        alice.runs_page(cursor="not-a-cursor")
    with pytest.raises(BadRequest, match="body must be a JSON object"):
        alice.request("POST", "/v1/runs", ["not", "an", "object"])
    with pytest.raises(PayloadTooLarge) as caught:
        alice.submit("x", env={"BIG": "x" * 300_000})
    assert caught.value.status == 413
    with pytest.raises(Forbidden, match="admin"):
        alice.create_token("mallory")
    revoked = admin.create_token("alice")
    admin.revoke_token(revoked.id)
    with Client(devstack.api_url, revoked.token) as gone, pytest.raises(Unauthorized):
        gone.me()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", "t", retries=1) as nowhere:
        with pytest.raises(ConnectionFailed, match=f"^cannot reach http://127.0.0.1:{port}: ") as caught:
            nowhere.health()
    assert caught.value.status == 0
    run.kill()


def test_the_raw_requests(alice):
    created = alice.request_with_status("POST", "/v1/runs", {"command": "x", "queue": "parked"})
    assert created.status == 201 and created.body["state"] == "queued"
    got = alice.request("GET", f"/v1/runs/{created.body['id']}", query={"unused": None})
    assert got["id"] == created.body["id"]
    killed = alice.request_with_status("POST", f"/v1/runs/{got['id']}/kill")
    assert (killed.status, killed.body["state"]) == (202, "killed")
    assert alice.request("GET", "/v1/health") == {"status": "ok"}


def test_pools_workers_me_tokens(admin, alice):
    assert {"default", "parked"} <= {p.name for p in alice.pools()}
    assert isinstance(alice.workers(), list)
    me = alice.me()
    assert (me.user, sorted(me.scopes)) == ("alice", ["runs:read", "runs:write"])
    made = admin.create_token("dana-sdk", groups=["vision"], scopes=["runs:read"], expires_in="1h")
    assert made.token.startswith("rp_") and made.groups == ["vision"] and made.expires_at is not None
    listed = admin.tokens("dana-sdk")
    assert made.id in {t.id for t in listed}
    admin.revoke_token(made.id)
    assert made.id not in {t.id for t in admin.tokens("dana-sdk")}
    alice.health()


def test_the_async_client(devstack, docker_client):
    async def main() -> None:
        async with AsyncClient(devstack.api_url, "alice-token") as client:
            key = f"sdk-{uuid.uuid4()}"
            run = await client.submit("echo hi; echo 7 > seven", idempotency_key=key)
            assert isinstance(run, AsyncRun) and run.created
            assert (await client.submit("echo hi; echo 7 > seven", idempotency_key=key)).created is False
            await run.wait(timeout=120)
            assert (run.state, run.exit_code, await run.logs()) == (RunState.SUCCEEDED, 0, "hi\n")
            assert [f.path async for f in run.outputs()] == ["seven"]

            held = await client.submit(f"echo one; {GATE}; echo two")
            lines = held.follow(poll=0.1)
            assert await anext(lines) == "one\n"
            assert (await held.refresh()).state == RunState.RUNNING
            open_gate(gate_of(devstack, held.id))
            assert [text async for text in lines] == ["two\n"]
            assert held.state == RunState.SUCCEEDED

            victim = await client.submit(f"echo started; {GATE}")
            async for _ in victim.follow(poll=0.1):
                break  # it runs
            await victim.kill()
            assert (await victim.wait(timeout=60)).state == RunState.KILLED

            sweep = await asyncio.gather(*(client.submit(f"echo {i}", queue="parked") for i in range(3)))
            assert len({r.id for r in sweep}) == 3
            await asyncio.gather(*(r.kill() for r in sweep))
            assert {r.state for r in sweep} == {RunState.KILLED}
            assert len([r async for r in client.runs(limit=2, page_size=1)]) == 2
            with pytest.raises(NotFound):
                await client.get("r-nope")

    asyncio.run(main())


def test_the_async_client_sweeps_and_downloads(devstack, docker_client, tmp_path):
    """docs/sdk.md: ``AsyncClient`` has the sweeps of ``Client`` as coroutines, and downloads."""

    async def main() -> None:
        async with AsyncClient(devstack.api_url, "alice-token") as client:
            key = f"sweep-{uuid.uuid4()}"
            made = await client.submit_sweep(
                "echo $N > n; test $N = 1", parameters={"N": [1, 2]}, max_parallel=2, idempotency_key=key
            )
            assert isinstance(made, AsyncSweep) and made.created and made.view.size == 2
            again = await client.submit_sweep(
                "echo $N > n; test $N = 1", parameters={"N": [1, 2]}, max_parallel=2, idempotency_key=key
            )
            assert (again.id, again.created) == (made.id, False)
            progress: list[int] = []
            done = await made.wait(timeout=120, poll=0.2, on_progress=lambda s: progress.append(s.view.size))
            assert done is made and made.done and progress
            assert (made.view.counts[RunState.SUCCEEDED], made.view.counts[RunState.FAILED]) == (1, 1)
            assert made.view.failures == {"nonzero_exit": 1}
            assert made.id in {s.id async for s in client.sweeps(limit=50)}
            assert (await client.sweep(made.id)).view.counts == made.view.counts
            (good,) = [r async for r in made.members(state="succeeded")]
            assert isinstance(good, AsyncRun) and good.view.spec.env["N"] == "1"
            files = await good.download(tmp_path / "out")
            assert files == [tmp_path / "out" / "n"] and files[0].read_text() == "1\n"
            (output,) = [f async for f in good.outputs()]
            await client.download_file(output.url, tmp_path / "again")
            assert (tmp_path / "again").read_text() == "1\n"
            assert await made.retry() == 1  # the failed member, as a new run
            assert made.view.counts.get(RunState.FAILED, 0) == 0 and not made.done  # as the answer says
            await made.kill()
            assert made.view.killed

    asyncio.run(main())


def test_the_first_example_of_the_docs(devstack, docker_client, tmp_path):
    code = re.search(r"```python\n(.*?)```", (ROOT / "docs" / "sdk.md").read_text(), re.DOTALL).group(1)
    env = {k: v for k, v in os.environ.items() if k not in ("RUNPLANE_PROFILE", "RUNPLANE_CONFIG")}
    env.update(RUNPLANE_API_URL=devstack.api_url, RUNPLANE_TOKEN="alice-token", HOME=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout) == (0, "succeeded 0\nhello\n"), done.stderr
