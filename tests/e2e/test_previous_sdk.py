"""The previous release's SDK against this release's API, as users have it after the functions'
upgrade: its answer models refuse fields they do not know (in a run's spec too), so this API leaves
out of its answers the fields added since while they hold their default (wire.shown_json)."""

import json
import subprocess
import sys
import tarfile
import uuid
from io import BytesIO
from pathlib import Path

import pytest

from runplane.client import Client
from tests.releases import CHANGELOG, previous_release

ROOT = CHANGELOG.parent

# Run by the previous release's code, with this venv's packages: its Client reads a run, the run
# listing, a sweep, its members and the pools, as `runplane get/ls/wait` and `sweep` do.
READER = """
import json, sys
import runplane
from runplane.client import Client
url, token, run_id, sweep_id = sys.argv[1:5]
with Client(url, token) as client:
    run = client.get(run_id)
    listed = [r.id for r in client.runs(limit=50)]
    sweep = client.sweep(sweep_id)
    members = [m.id for m in client.members(sweep_id)]
    pools = [p.name for p in client.pools()]
print(json.dumps({"version": runplane.__version__, "file": runplane.__file__, "run": run.id, "listed": listed,
                  "sweep": sweep.id, "members": members, "pools": pools}))
"""


@pytest.fixture(scope="module")
def previous_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's runplane package, taken from its commit in git history."""
    release = previous_release(CHANGELOG.read_text())
    archive = subprocess.run(
        ["git", "archive", "--format=tar", release.commit, "runplane"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    where = tmp_path_factory.mktemp(f"runplane-{release.version}")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    return where


def test_the_previous_release_sdk_reads_this_release_answers(devstack, previous_source):
    with Client(devstack.api_url, "admin-token") as admin:
        token = admin.create_token(f"previous-sdk-{uuid.uuid4().hex[:8]}").token
        # labels are shown where set (the previous SDK cannot read such a run: not this user's)
        labelled = admin.submit("echo hi", queue="parked", labels={"exp": "a"})
        assert admin.request("GET", f"/v1/runs/{labelled.id}")["spec"]["labels"] == {"exp": "a"}
        admin.kill(labelled.id)
    with Client(devstack.api_url, token) as client:
        run = client.submit("echo hi", queue="parked")
        sweep = client.submit_sweep("echo $I", parameters={"I": [1, 2]}, queue="parked")
        # and left out while they hold their default
        assert "labels" not in client.request("GET", f"/v1/runs/{run.id}")["spec"]
    shown = subprocess.run(
        [sys.executable, "-c", READER, devstack.api_url, token, run.id, sweep.id],
        cwd=previous_source,
        env={"PYTHONPATH": str(previous_source), "PATH": "/usr/bin:/bin", "HOME": str(previous_source)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    read = json.loads(shown.stdout)
    assert read["version"] == previous_release(CHANGELOG.read_text()).version
    assert Path(read["file"]).is_relative_to(previous_source)
    assert read["run"] == run.id and read["sweep"] == sweep.id
    assert run.id in read["listed"] and len(read["members"]) == 2
    assert "parked" in read["pools"]
