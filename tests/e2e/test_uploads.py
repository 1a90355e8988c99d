"""Uploads as a new user meets them: a local directory run with ``--upload`` and ``--workdir``
(the CLI, a run in Docker on the embedded stack), and the SDK's uploads on the stacks of the
clouds (the signed PUT of S3 and of Blob storage)."""

import asyncio
import uuid

import pytest

from runplane.client import AsyncClient, NotFound
from tests.e2e.test_cli import cli, one_error_line

PYTHON_IMAGE = "runplane/python-base:bookworm"
"""An image with python3 (built by scripts/build-agent-image.sh, the agent's base)."""

TRAIN = """\
import os
rows = [line.split(",") for line in open("data/points.csv").read().split()]
print("total", sum(int(a) * int(b) for a, b in rows))
print("cwd", os.getcwd(), "log left out:", not os.path.exists("notes.log"))
try:
    open("written.txt", "w")
except OSError as e:
    print("read-only:", e.errno == 30)
"""


def project(root):
    """A directory holding train.py, its data file and a file its .gitignore leaves out."""
    root.mkdir()
    (root / "data").mkdir()
    (root / "train.py").write_text(TRAIN)
    (root / "data" / "points.csv").write_text("2,3\n4,5\n10,7\n")
    (root / "notes.log").write_text("not sent\n" * 1000)
    (root / ".gitignore").write_text("*.log\n")
    return root


@pytest.mark.docker
def test_run_a_local_directory_then_again_uploading_nothing(devstack, docker_client, tmp_path):
    project(tmp_path / "proj")
    args = ["run", "--upload", "./proj:code", "--workdir", "/inputs/code", "--image", PYTHON_IMAGE, "--wait"]
    first = cli(devstack, *args, "--", "python3", "train.py", cwd=tmp_path, home=tmp_path)
    assert first.returncode == 0, (first.stdout, first.stderr)
    assert first.stdout.splitlines() == ["total 96", "cwd /inputs/code log left out: True", "read-only: True"]
    assert "uploaded code (" in first.stderr, first.stderr
    again = cli(devstack, *args, "--", "python3", "train.py", cwd=tmp_path, home=tmp_path)
    assert again.returncode == 0, (again.stdout, again.stderr)
    assert again.stdout == first.stdout
    assert "code: already uploaded" in again.stderr and "uploaded code (" not in again.stderr, again.stderr


@pytest.mark.parametrize("alice", ["aws_devstack", "azure_devstack"], indirect=True)
def test_the_sdk_sends_an_upload_once_and_a_run_names_it(alice, tmp_path):
    """The PUT goes to the store's own signed URL (S3 presigned, Blob SAS); the same content
    again sends nothing; a run names it as an input, and a sweep's members share it."""
    proj = project(tmp_path / "proj")
    (proj / "salt.txt").write_text(uuid.uuid4().hex)  # content no earlier test sent
    first = alice.upload(proj)
    assert first.sent and first.source == f"upload:{first.sha256}"
    again = alice.upload(proj)
    assert (again.sent, again.source, again.size) == (False, first.source, first.size)
    run = alice.submit("python3 train.py", queue="parked", uploads={"code": proj}, workdir="/inputs/code")
    try:
        assert run.view.spec.inputs == {"code": first.source}
        assert run.view.spec.workdir == "/inputs/code"
    finally:
        run.kill()
    sweep = alice.submit_sweep("true", count=2, queue="parked", uploads={"code": proj})
    try:
        assert sweep.view.spec.run.inputs == {"code": first.source}
    finally:
        sweep.kill()
    with pytest.raises(NotFound, match=f"upload {'0' * 64} not found"):
        alice.submit("true", queue="parked", inputs={"code": "upload:" + "0" * 64})


def test_async_uploads_send_once_through_the_embedded_stacks_signed_url(devstack, tmp_path):
    proj = project(tmp_path / "proj")
    (proj / "salt.txt").write_text(uuid.uuid4().hex)
    seen: list[tuple[int, int | None]] = []

    async def main():
        async with AsyncClient(devstack.api_url, "alice-token") as client:
            first = await client.upload(proj, progress=lambda sent, total: seen.append((sent, total)))
            again = await client.upload(proj)
            run = await client.submit("true", queue="parked", uploads={"code": proj}, workdir="/inputs/code")
            await run.kill()
            return first, again, run

    first, again, run = asyncio.run(main())
    assert first.sent and not again.sent and again.source == first.source
    assert seen and seen[-1] == (first.size, first.size)
    assert run.view.spec.inputs == {"code": first.source}


def test_a_directory_that_cannot_be_packed_is_one_error_line_and_sends_nothing(devstack, tmp_path):
    proj = project(tmp_path / "proj")
    (proj / "escape").symlink_to(tmp_path)
    proc = cli(devstack, "run", "--upload", str(proj), "--", "true", cwd=tmp_path, home=tmp_path)
    line = one_error_line(proc, 2)
    assert "escape is a symlink to" in line and "outside" in line, line
    assert proc.stdout == ""  # no run id: nothing was submitted
