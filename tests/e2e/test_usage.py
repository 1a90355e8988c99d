"""``runplane usage`` and ``client.usage()`` (sync and async) as a user runs them, against the local
stack with real agents on Docker: the report's figures are the sums of the runs' own usage, and
errors are one line with README.md's exit codes (2 usage, also 400/422 answers; 3 refused)."""

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from runplane.client import AsyncClient, BadRequest, Client, Forbidden, UsageReport
from tests.conftest import TERMINAL, wait_state
from tests.e2e.test_cli import cli, one_error_line

pytestmark = pytest.mark.docker


def test_usage_of_real_runs_through_the_cli_and_the_sdk(devstack, tmp_path):
    name = f"use-{uuid.uuid4().hex[:8]}"
    with Client(devstack.api_url, "admin-token") as admin:
        token = admin.create_token(name, groups=["lab"]).token
    user = Client(devstack.api_url, token)
    # each computes for about 0.15 s of cpu, then idles long enough for its agent to look at its cgroup
    busy = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 0.5; echo one; echo two >&2"
    ran = [user.submit(busy, queue="default").id for _ in range(2)]
    parked = user.submit("echo never", queue="parked").id
    runs = [wait_state(user, run_id, TERMINAL, timeout=120) for run_id in ran]
    assert [r["state"] for r in runs] == ["succeeded", "succeeded"]
    cost = sum(r["usage"]["cost"] for r in runs)
    measured = [r["usage"]["cpu_seconds"] for r in runs]
    assert all(c is not None and c >= 0.05 for c in measured), measured  # the loops', as their agents measured
    cpu = sum(measured)
    assert cost > 0

    shown = cli(devstack, "usage", "--by", "pool", "--json", token=token, home=tmp_path)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert [(r["key"], r["runs"]) for r in report["rows"]] == [("default", 2), ("parked", 1)]
    default = report["rows"][0]
    assert default["cost"] == pytest.approx(cost) and default["cpu_seconds"] == pytest.approx(cpu, abs=1e-3)
    assert default["gpu_seconds"] == 0 and report["rows"][1]["cost"] is None
    assert report["total"]["runs"] == 3 and report["total"]["cost"] == pytest.approx(cost)

    table = cli(devstack, "usage", "--by", "group", token=token, home=tmp_path)
    assert table.returncode == 0, table.stderr
    (lab,) = [line for line in table.stdout.splitlines() if " lab " in f" {line} "]
    assert [word for word in lab.split() if word.isalnum()][:2] == ["lab", "3"]  # the user's only group: all 3
    assert "total" in table.stdout and table.stderr.startswith("from ")

    assert one_error_line(cli(devstack, "usage", "--user", "alice", token=token, home=tmp_path), 3) == (
        f"error: only admins may read another user's usage; {name} may read their own"
    )
    bad = one_error_line(cli(devstack, "usage", "--since", "last tuesday", token=token, home=tmp_path), 2)
    assert bad.startswith("error: since must be an ISO 8601 date or time")
    assert one_error_line(cli(devstack, "usage", "--pool", "nowhere", token=token, home=tmp_path), 2).startswith(
        "error: no pool 'nowhere'"
    )

    # the SDK: the same report, with the window as datetimes or Unix seconds
    since = datetime.now(UTC) - timedelta(days=1)
    sync = user.usage(by="pool", since=since, until=datetime.now(UTC) + timedelta(minutes=1))
    assert isinstance(sync, UsageReport) and sync.rows == [UsageReport.model_validate(report).rows[0], sync.rows[1]]
    assert sync.total.cost == pytest.approx(cost)

    async def from_async() -> UsageReport:
        async with AsyncClient(devstack.api_url, token) as client:
            return await client.usage(by="pool", pool="default", since=since.timestamp())

    only = asyncio.run(from_async())
    assert [r.key for r in only.rows] == ["default"] and only.total.runs == 2 and only.pool == "default"
    with pytest.raises(Forbidden):
        user.usage(user="alice")
    with pytest.raises(BadRequest):
        user.usage(since="soon")
    with pytest.raises(ValueError, match="since must be a datetime"):
        user.usage(since=float("nan"))
    user.kill(parked)
