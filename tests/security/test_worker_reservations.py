"""What one run may take of a worker, against a hostile user, on the real engine: a real agent
process serves the "manual" pool (2 slots, 2 cores, 2g memory, 5g disk) of a fresh stack on moto,
with the pools file of the suite but for an image size cap on that pool. A run that asks all of a
worker's memory has it to itself; an input larger than a run's disk is refused before it is read;
an image over the pool's cap is refused. The agent's code is the same on both clouds; what differs
(each store's download past its limit) is tested on both in tests/integration/test_inputs.py."""

from __future__ import annotations

import contextlib
import io
import os
import re
import stat
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from runplane.domain.expect import Expect
from runplane.domain.runs import Run, RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.services.logs import outputs_prefix
from runplane.services.runs import kill_run, submit_run
from tests.conftest import POOLS_FILE, AgentProcess, wait_for
from worker_agent.workdir import sweep_dead

IMAGE_CAP = "3m"


@pytest.fixture
def agent(aws_stack, docker_client, tmp_path) -> Iterator[AgentProcess]:
    """One agent process on this test's stack, pool "manual" capped at IMAGE_CAP images; it and
    its runs' containers are gone afterwards."""
    text = POOLS_FILE.read_text()
    assert text.count("\n  - name: manual\n") == 1
    pools_file = tmp_path / "pools.yaml"
    pools_file.write_text(
        text.replace("\n  - name: manual\n", f"\n  - name: manual\n    max_image_size: {IMAGE_CAP}\n")
    )
    env = {
        **os.environ,
        "RUNPLANE_CLOUD": "aws",
        "RUNPLANE_PREFIX": aws_stack.settings.prefix,
        "RUNPLANE_AWS_ENDPOINT_URL": aws_stack.settings.aws_endpoint_url or "",
        "RUNPLANE_POOLS": str(pools_file),
    }
    started = AgentProcess(tmp_path, "--idle-seconds", "120", "--slots", "2", env=env)
    try:
        wait_for(
            lambda: (
                any(w.id == started.id for w in aws_stack.workers.list("manual")) or started.proc.poll() is not None
            ),
            30,
            0.1,
            f"agent {started.id} to register",
        )
        assert started.proc.poll() is None, started.log.read_text()[-3000:]
        yield started
    finally:
        started.stop()
        for container in docker_client.containers.list(
            all=True, sparse=True, filters={"label": f"io.runplane.worker_id={started.id}"}
        ):
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                container.remove(force=True, v=True)
        sweep_dead(tmp_path / "work")


def submit(stack, command: str, **spec: Any) -> Run:
    run_spec = RunSpec(command=command, queue="manual", **spec)
    return submit_run(stack.ports, Principal(user="alice"), run_spec, None).run


def state_of(stack, run: Run, states: set[RunState], timeout: float = 60) -> Run:
    return wait_for(
        lambda: (r := stack.store.get(run.id)).state in states and r, timeout, 0.1, f"run {run.id} to be {states}"
    )


def ended(stack, run: Run, timeout: float = 60) -> Run:
    return wait_for(lambda: (r := stack.store.get(run.id)).state.terminal and r, timeout, 0.1, f"run {run.id} to end")


def finished_run(stack, files: dict[str, bytes]) -> Run:
    """A succeeded run of alice's with ``files`` as its outputs (the source of ``run:`` inputs)."""
    run = stack.store.create(
        Run(id=f"r-src{uuid.uuid4().hex[:8]}", owner="alice", queue="manual", created_at=1, attempt=1,
            spec=RunSpec(command="x"))
    )  # fmt: skip
    for path, data in files.items():
        stack.objects.put_bytes(outputs_prefix(run.id, 1) + path, data)
    return stack.store.update(run, Expect(), {"state": RunState.SUCCEEDED})


def test_a_run_asking_all_of_a_workers_memory_has_the_worker_to_itself(aws_stack, agent):
    """Two slots and two cores, but one run holds all 2g of the worker's memory: a second such
    run stays queued while it runs (the worker passes its hint back), and starts once it is over.
    Before, the second ran beside the first, both promised all of the worker's memory."""
    hog = submit(aws_stack, "sleep 300", resources={"memory": "2g"})
    state_of(aws_stack, hog, {RunState.RUNNING})
    second = submit(aws_stack, "true", resources={"memory": "2g"})
    passed_back = f"run {second.id} does not fit this worker right now"
    wait_for(
        lambda: passed_back in agent.log.read_text() or aws_stack.store.get(second.id).state != RunState.QUEUED,
        60,
        0.1,
        "the worker to take or pass back the second run",
    )
    assert aws_stack.store.get(second.id).state == RunState.QUEUED, "ran beside a run holding all the memory"
    assert aws_stack.store.get(hog.id).state == RunState.RUNNING
    kill_run(aws_stack.ports, Principal(user="alice"), hog.id)
    hog = ended(aws_stack, hog)
    done = ended(aws_stack, second)
    assert done.state == RunState.SUCCEEDED, done.failure
    assert hog.finished_at is not None and done.started_at is not None and done.started_at >= hog.finished_at


def test_an_input_larger_than_the_runs_disk_is_input_unavailable_naming_both_sizes(aws_stack, agent, tmp_path):
    """A 2m output of the user's own finished run, as the input of a run with 1m of disk: refused
    before a byte of it is downloaded, as the store lists its size. Before, it was downloaded whole,
    outside of what the run's disk counts."""
    source = finished_run(aws_stack, {"weights.bin": b"w" * (2 * 1024**2)})
    run = submit(aws_stack, "true", resources={"disk": "1m"}, inputs={"w": f"run:{source.id}/weights.bin"})
    done = ended(aws_stack, run)
    assert done.failure is not None, done.state
    assert (done.state, done.failure.reason) == (RunState.FAILED, "input_unavailable")
    assert "weights.bin is 2m, more than the 1m of the run's disk" in done.failure.message
    # the run's directory may still be going away (its slot comes back first): walk what is there
    cached = [
        Path(top, name)
        for top, _, names in os.walk(tmp_path / "work")
        for name in names
        if (size := _size(Path(top, name))) is not None and size >= 1024**2
    ]
    assert cached == []  # nothing of it on the worker


def _size(path: Path) -> int | None:
    """The size of a regular file that is still there; None for anything else."""
    try:
        found = path.lstat()
    except FileNotFoundError:
        return None
    return found.st_size if stat.S_ISREG(found.st_mode) else None


def test_what_a_run_writes_counts_with_its_inputs_against_its_disk(aws_stack, agent):
    """Given 2m of inputs on a 3m disk, a run that writes 1.5m is over: its inputs are on the
    worker's disk all the while it runs. Before, only what it wrote was counted."""
    source = finished_run(aws_stack, {"weights.bin": b"w" * (2 * 1024**2)})
    command = "head -c 1572864 /dev/zero > out.bin"
    run = submit(aws_stack, command, resources={"disk": "3m"}, inputs={"w": f"run:{source.id}/weights.bin"})
    done = ended(aws_stack, run)
    assert done.failure is not None, done.state
    assert (done.state, done.failure.reason) == (RunState.FAILED, "disk_limit")
    assert "with its inputs" in done.failure.message and "inputs 2m" in done.failure.message


def make_image(client: Any, tag: str, size: int) -> Any:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("blob")
        info.size = size
        tar.addfile(info, io.BytesIO(os.urandom(size)))
    repository, _, version = tag.partition(":")
    client.api.import_image_from_data(data.getvalue(), repository=repository, tag=version)
    return client.images.get(tag)


def test_an_image_over_the_pools_cap_is_refused(aws_stack, agent, docker_client):
    """A 4m image on a pool capped at 3m ends its run image_too_large, naming both sizes, and
    no container is made of it; the pool's own (2m) image still runs under the cap."""
    tag = f"runplane/too-large-{uuid.uuid4().hex[:8]}:1"
    image = make_image(docker_client, tag, 4 * 1024**2)
    try:
        run = submit(aws_stack, "true", image=tag)
        done = ended(aws_stack, run)
        assert done.failure is not None, done.state
        assert (done.state, done.failure.reason) == (RunState.FAILED, "image_too_large")
        assert re.search(rf"image {tag} is 4(\.0)?m, larger than the pool's max_image_size 3m", done.failure.message)
        assert docker_client.containers.list(all=True, filters={"ancestor": image.id}) == []
        assert docker_client.images.get(tag).id == image.id  # not the agent's to remove: it did not pull it
        under = ended(aws_stack, submit(aws_stack, "true"))
        assert under.state == RunState.SUCCEEDED, under.failure
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.remove(image.id, force=True)
