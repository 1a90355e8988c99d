"""Keeping a run through the CLI and the SDK (``Client``, ``AsyncClient``, ``Run``) against the embedded
local stack: ``runplane keep`` pins a run, ``runplane status`` says it is kept, ``keep --off`` lets it
go and says what its pool's retention does then (the stack's sets none: kept for good); another user's
run is one line, "not found". The runs wait on the pool that never gets a worker."""

import asyncio
import contextlib
import json
from datetime import UTC, datetime

from runplane import bootstrap
from runplane.client import AsyncClient, Client, Conflict, RetentionView
from runplane.domain.retention import RunRetention
from runplane.ports import Expect
from tests.e2e.test_cli import cli, one_error_line

FOR_GOOD = RetentionView(kept=False, outputs_until=None, logs_until=None, record_until=None, deleted=[])


def status_line(devstack, run_id, home):
    proc = cli(devstack, "status", run_id, home=home)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    return next((line.split(None, 1)[-1].strip() for line in lines if line.startswith("retention")), None)


def test_keep_then_status_says_kept_then_keep_off_lets_it_go(devstack, tmp_path):
    alice = Client(devstack.api_url, "alice-token")
    run = alice.submit("echo kept", queue="parked")
    try:
        assert run.retention is None and status_line(devstack, run.id, tmp_path) is None
        kept = cli(devstack, "keep", run.id, home=tmp_path)
        hint = f"runplane keep --off {run.id}"
        assert (kept.returncode, kept.stdout) == (0, ""), kept.stderr
        said = f"kept: run {run.id} (its outputs, logs and record stay until you let it go: {hint})"
        assert kept.stderr.strip() == said
        assert run.refresh().retention is not None and run.retention.kept
        assert status_line(devstack, run.id, tmp_path) == f"kept ({hint} lets it go)"

        let_go = cli(devstack, "keep", "--off", run.id, home=tmp_path)
        assert let_go.returncode == 0, let_go.stderr
        assert let_go.stderr.strip() == f"let go: run {run.id} (its pool's retention applies once it ends)"
        assert run.refresh().retention is None

        run.kill()
        assert run.retention == FOR_GOOD  # ended, on a stack that sets no retention
        assert status_line(devstack, run.id, tmp_path) == "kept for good"
        assert run.keep() is run and run.retention is not None and run.retention.kept
        assert alice.keep(run.id, keep=False).retention == FOR_GOOD
        again = cli(devstack, "keep", "--off", run.id, home=tmp_path)
        assert again.stderr.strip() == f"let go: run {run.id} (its pool keeps runs for good)"
        as_json = cli(devstack, "keep", run.id, "--json", home=tmp_path)  # the run, on stdout alone
        assert (as_json.stderr, json.loads(as_json.stdout)["retention"]["kept"]) == ("", True)
        assert json.loads(cli(devstack, "status", run.id, "--json", home=tmp_path).stdout)["retention"]["kept"]

        line = one_error_line(cli(devstack, "keep", "--off", run.id, token="bob-token", home=tmp_path / "bob"), 3)
        assert line == f"error: run {run.id} not found"
        assert run.refresh().retention is not None and run.retention.kept  # bob changed nothing
    finally:
        with contextlib.suppress(Conflict):
            run.kill()


def test_the_async_client_keeps_too(devstack):
    async def main() -> None:
        async with AsyncClient(devstack.api_url, "alice-token") as client:
            run = await client.submit("echo kept", queue="parked")
            await run.kill()
            kept = await client.keep(run.id)
            assert kept.retention is not None and kept.retention.kept
            assert (await run.keep(False)) is run and run.retention == FOR_GOOD

    asyncio.run(main())


def test_download_and_logs_say_what_retention_deleted_instead_of_nothing(devstack, tmp_path):
    alice = Client(devstack.api_url, "alice-token")
    run = alice.submit("echo gone", queue="parked").kill()
    store = bootstrap.stack().store
    ended = store.get(run.id)
    due = datetime(2026, 12, 29, 23, 30, tzinfo=UTC).timestamp()
    # as the retention sweep leaves a run whose outputs and logs it deleted
    dated = RunRetention(
        checked_at=due, outputs_at=due, logs_at=due, record_at=due + 86400, deleted=["outputs", "logs"]
    )
    store.update(ended, Expect(), {"retention": dated})
    fetched = cli(devstack, "download", run.id, str(tmp_path / "out"), home=tmp_path)
    assert (fetched.returncode, fetched.stdout) == (0, ""), fetched.stderr
    assert fetched.stderr.strip() == f"{run.id}: outputs deleted by retention on 2026-12-29 23:30 UTC"
    for stream in ([], ["--stderr"]):
        printed = cli(devstack, "logs", run.id, *stream, home=tmp_path)
        assert (printed.returncode, printed.stdout) == (0, ""), printed.stderr
        assert printed.stderr.strip() == f"{run.id}: logs deleted by retention on 2026-12-29 23:30 UTC"
    assert status_line(devstack, run.id, tmp_path) == (
        "outputs deleted on 2026-12-29 23:30 UTC, logs deleted on 2026-12-29 23:30 UTC, "
        "record until 2026-12-30 23:30 UTC"
    )
    kept = cli(devstack, "keep", run.id, home=tmp_path)
    hint = f"runplane keep --off {run.id}"
    assert kept.stderr.strip() == (
        f"kept: run {run.id} (its record stays until you let it go: {hint}; outputs and logs already deleted)"
    )
    assert status_line(devstack, run.id, tmp_path) == f"kept ({hint} lets it go; outputs and logs already deleted)"
    other = alice.submit("echo still here", queue="parked").kill()  # nothing deleted: empty, and said so
    fetched = cli(devstack, "download", other.id, str(tmp_path / "other"), home=tmp_path)
    assert fetched.stderr.strip() == f"{other.id}: no output files"
    printed = cli(devstack, "logs", other.id, home=tmp_path)
    assert (printed.returncode, printed.stdout, printed.stderr) == (0, "", "")
