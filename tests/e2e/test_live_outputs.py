"""Outputs while the run goes, as a user meets them: a run writes a metrics file under
``$RUNPLANE_OUTPUT/live/``; before it ends, ``runplane download`` gets the file as last uploaded
and says the run still goes, and the outputs page says more may come; once it ends, its outputs
hold the file's last content, and downloading into the same folder again writes it over what was
got while it ran, no --force asked (a run in Docker on the embedded stack)."""

import time

import httpx
import pytest

from runplane.client import Client
from tests.conftest import TEST_IMAGE
from tests.e2e.test_cli import cli

# step 1, then (once the test has read it mid-run, or after at most 60 s) step 2, and the end
COMMAND = (
    'mkdir -p "$RUNPLANE_OUTPUT/live"; echo "step 1" > "$RUNPLANE_OUTPUT/live/metrics.txt"; '
    "i=0; while [ ! -e /tmp/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; "
    'echo "step 2" >> "$RUNPLANE_OUTPUT/live/metrics.txt"'
)


@pytest.mark.docker
def test_a_runs_live_file_is_read_before_it_ends_and_its_last_content_after(devstack, agents, docker_client, tmp_path):
    agents("--live-interval", "0.5")
    with Client(devstack.api_url, "alice-token") as client:
        run = client.submit(COMMAND, queue="manual", image=TEST_IMAGE)
        try:
            mid = tmp_path / "mid"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                got = cli(devstack, "download", run.id, str(mid), home=tmp_path)  # again and again
                assert got.returncode == 0, got.stderr
                if (mid / "live" / "metrics.txt").exists():
                    break
                assert not run.refresh().done, run.view.failure
                time.sleep(0.3)
            assert (mid / "live" / "metrics.txt").read_text() == "step 1\n"
            assert f"{run.id} is still running: these are its outputs so far" in got.stderr
            assert _page(devstack, run.id)["complete"] is False  # the run goes: more may come
            # let it write its last line and end
            container = docker_client.containers.list(filters={"label": f"io.runplane.run_id={run.id}"})[0]
            container.exec_run(["touch", "/tmp/go"])
            assert run.wait(timeout=60).view.state == "succeeded", run.view.failure
        finally:
            if not run.done:
                run.kill()
        end = tmp_path / "end"
        run.download(end)
        assert (end / "live" / "metrics.txt").read_text() == "step 1\nstep 2\n"
        again = cli(devstack, "download", run.id, str(mid), home=tmp_path)  # over what it got while it ran
        assert again.returncode == 0, again.stderr
        assert (mid / "live" / "metrics.txt").read_text() == "step 1\nstep 2\n"
        assert _page(devstack, run.id)["complete"] is True


def _page(devstack, run_id):
    answer = httpx.get(f"{devstack.api_url}/v1/runs/{run_id}/outputs", headers={"Authorization": "Bearer alice-token"})
    assert answer.status_code == 200, answer.text
    return answer.json()
