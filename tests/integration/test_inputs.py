"""The shared input cache against the moto server: sources, reuse, eviction, and two
processes racing for the same input downloading it once."""

import multiprocessing
import os

import pytest

from runplane.domain.errors import PayloadTooLarge
from runplane.domain.expect import Expect
from runplane.domain.runs import Run, RunSpec
from runplane.domain.states import RunState
from runplane.services.inputs import InputPolicy
from runplane.services.logs import outputs_prefix
from worker_agent.inputs import InputCache, InputUnavailable

OWNER = {"owner": "a"}


@pytest.fixture
def datasets(aws_stack):
    """A bucket of data sets beside the stack's own, as an operator would allow for inputs."""
    name = f"{aws_stack.settings.prefix}-datasets"
    aws_stack.objects.client.create_bucket(Bucket=name)
    return aws_stack.objects.within(name)


def new_cache(stack, root, datasets):
    policy = InputPolicy({"*": frozenset({datasets.bucket})}, stack.data_bucket)
    return InputCache(root, stack.objects, stack.store, policy=policy)


@pytest.fixture
def cache(aws_stack, datasets, tmp_path):
    datasets.put_bytes("data/train.csv", b"a,b\n1,2\n")
    datasets.put_bytes("data/set/x.txt", b"x" * 1000)
    datasets.put_bytes("data/set/sub/y.txt", b"y" * 1000)
    return new_cache(aws_stack, tmp_path / "cache", datasets)


def finished_run(stack, state=RunState.SUCCEEDED, files=None, owner="a"):
    run = stack.store.create(
        Run(
            id=f"r-src{os.urandom(4).hex()}",
            owner=owner,
            queue="default",
            created_at=1,
            attempt=1,
            spec=RunSpec(command="x"),
        )
    )
    for path, data in (files or {}).items():
        stack.objects.put_bytes(outputs_prefix(run.id, 1) + path, data)
    return stack.store.update(run, Expect(), {"state": state})


def test_s3_file_and_prefix(cache, datasets):
    bucket = datasets.bucket
    one = cache.fetch(f"s3://{bucket}/data/train.csv", "u1", **OWNER)
    assert one.downloaded
    assert one.path.read_bytes() == b"a,b\n1,2\n"
    tree = cache.fetch(f"s3://{bucket}/data/set", "u1", **OWNER)
    assert sorted(str(p.relative_to(tree.path)) for p in tree.path.rglob("*.txt")) == ["sub/y.txt", "x.txt"]
    again = cache.fetch(f"s3://{bucket}/data/train.csv", "u2", **OWNER)
    assert (again.downloaded, again.key) == (False, one.key)


def test_changed_object_is_a_new_entry(cache, datasets):
    source = f"s3://{datasets.bucket}/data/train.csv"
    first = cache.fetch(source, "u", **OWNER)
    datasets.put_bytes("data/train.csv", b"new\n")
    second = cache.fetch(source, "u", **OWNER)
    assert second.key != first.key
    assert second.path.read_bytes() == b"new\n"


def test_run_outputs(cache, aws_stack):
    run = finished_run(aws_stack, files={"model/w.bin": b"weights", "log.txt": b"l"})
    whole = cache.fetch(f"run:{run.id}", "u", **OWNER)
    assert (whole.path / "model" / "w.bin").read_bytes() == b"weights"
    part = cache.fetch(f"run:{run.id}/model/w.bin", "u", **OWNER)
    assert part.path.read_bytes() == b"weights"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("s3://{bucket}/nope.csv", "nothing there"),
        ("run:r-missing", "does not exist"),
    ],
)
def test_unavailable(cache, datasets, source, message):
    with pytest.raises(InputUnavailable, match=message):
        cache.fetch(source.format(bucket=datasets.bucket), "u", **OWNER)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("s3://{own}/runs/", "the stack's own bucket cannot be an input"),
        ("s3://no-such-bucket/x", "bucket no-such-bucket is not one the operator allows"),
        ("s3://{datasets}/", "not the whole bucket"),
    ],
)
def test_the_agent_refuses_what_the_operator_does_not_allow(cache, aws_stack, datasets, source, message):
    """Checked again on the worker, before a byte is read: a run stored by other means than the API
    (or by an older one) cannot read the stack's own bucket, which holds every user's outputs."""
    aws_stack.objects.put_bytes("runs/r-x/outputs/1/secret", b"private")
    with pytest.raises(InputUnavailable, match=message):
        cache.fetch(source.format(own=aws_stack.data_bucket, datasets=datasets.bucket), "u", **OWNER)
    assert not list(cache.root.glob("*/done"))


def test_the_agent_refuses_another_users_run_as_if_it_did_not_exist(cache, aws_stack):
    theirs = finished_run(aws_stack, files={"w.bin": b"private"}, owner="bob")
    with pytest.raises(InputUnavailable, match=f"run {theirs.id} does not exist"):
        cache.fetch(f"run:{theirs.id}", "u", **OWNER)


def test_unfinished_run_is_unavailable(cache, aws_stack):
    run = finished_run(aws_stack, state=RunState.RUNNING)
    with pytest.raises(InputUnavailable, match="is running, not succeeded"):
        cache.fetch(f"run:{run.id}", "u", **OWNER)


def test_an_input_larger_than_the_room_left_is_refused_before_it_is_read(cache, aws_stack, datasets):
    """The store's listed size is held against what the run's disk has left, for an object, a
    prefix (all its objects together) and a run's outputs: nothing is downloaded."""
    bucket = datasets.bucket
    with pytest.raises(InputUnavailable, match=rf"s3://{bucket}/data/set is 2000, more than the 1k of the run's"):
        cache.fetch(f"s3://{bucket}/data/set", "u", **OWNER, max_bytes=1024)
    run = finished_run(aws_stack, files={"w.bin": b"w" * 2048})
    with pytest.raises(InputUnavailable, match=r"is 2k, more than the 2047 of the run's disk left for its inputs"):
        cache.fetch(f"run:{run.id}", "u", **OWNER, max_bytes=2047)
    assert not list(cache.root.glob("*/done")) and not list(cache.root.glob(".partial-*"))
    exact = cache.fetch(f"run:{run.id}", "u", **OWNER, max_bytes=2048)  # exactly what is left: taken
    assert (exact.size, (exact.path / "w.bin").stat().st_size) == (2048, 2048)


def test_an_input_that_grew_since_it_was_listed_stops_downloading(cache, datasets):
    """An object replaced by a larger one between its listing and its download: the download
    stops once past the room left, and nothing of it stays in the cache."""
    source = f"s3://{datasets.bucket}/data/train.csv"
    resolved = cache.resolve(source, "a")
    datasets.put_bytes("data/train.csv", b"z" * (4 * 1024**2))
    with pytest.raises(InputUnavailable, match="grew since it was listed, more than the 1m of the run's disk"):
        cache._download(resolved, cache.root / "entry", source, 1024**2)
    assert not (cache.root / "entry").exists() and not list(cache.root.glob(".partial-*"))


@pytest.mark.parametrize("cloud", ["aws_stack", "azure_stack", "local_stack"])
def test_a_download_stops_past_its_most_bytes_on_every_cloud(request, cloud, tmp_path):
    objects = request.getfixturevalue(cloud).objects
    objects.put_bytes("big/blob", b"b" * (3 * 1024**2))
    into = tmp_path / "downloads"
    into.mkdir()
    with pytest.raises(PayloadTooLarge, match="object big/blob holds"):
        objects.download_file("big/blob", into / "blob", max_bytes=1024**2)
    assert list(into.iterdir()) == []  # no file, not even a part of one
    objects.download_file("big/blob", into / "blob", max_bytes=3 * 1024**2)  # exactly: downloaded
    assert (into / "blob").stat().st_size == 3 * 1024**2


def test_s3_inputs_on_one_machine_are_folders_of_its_objects_directory(local_stack, tmp_path):
    """On the local cloud, an operator's data set is a folder of the state directory's objects
    (objects/<bucket>/...): the agent reads it as it reads a bucket, and a link there is no input."""
    data = local_stack.objects.root / "objects" / "lab-datasets" / "data"
    (data / "set").mkdir(parents=True)
    (data / "train.csv").write_bytes(b"a,b\n1,2\n")
    (data / "set" / "x.txt").write_bytes(b"x")
    (tmp_path / "private").write_bytes(b"not a data set")
    os.symlink(tmp_path / "private", data / "set" / "private")
    datasets = local_stack.objects.within("lab-datasets")
    cache = new_cache(local_stack, tmp_path / "cache", datasets)
    one = cache.fetch("s3://lab-datasets/data/train.csv", "u1", **OWNER)
    assert one.path.read_bytes() == b"a,b\n1,2\n"
    tree = cache.fetch("s3://lab-datasets/data/set", "u1", **OWNER)
    assert sorted(str(p.relative_to(tree.path)) for p in tree.path.rglob("*")) == ["x.txt"]
    with pytest.raises(InputUnavailable, match="nothing there"):
        cache.fetch("s3://lab-datasets/data/set/private", "u1", **OWNER)


def test_eviction_is_lru_and_spares_entries_in_use(cache, datasets):
    bucket = datasets.bucket
    for i in range(3):
        datasets.put_bytes(f"big/{i}", bytes(20_000))
    a = cache.fetch(f"s3://{bucket}/big/0", "run-a", **OWNER)
    b = cache.fetch(f"s3://{bucket}/big/1", "run-b", **OWNER)
    c = cache.fetch(f"s3://{bucket}/big/2", "run-c", **OWNER)
    for used_at, fetched in ((1_000, a), (2_000, b), (3_000, c)):  # last used: a, then b, then c
        os.utime(cache.root / fetched.key / "done", (used_at, used_at))  # the cache's LRU clock
    cache.release(b.key, "run-b")
    cache.release(c.key, "run-c")
    cache.max_bytes = 55_000  # three entries of ~24 KiB on disk each: one must go
    removed = cache.evict()
    assert removed == [b.key]  # a is older but still used by run-a
    assert a.path.exists() and c.path.exists() and not b.path.exists()
    cache.release(a.key, "run-a")
    cache.max_bytes = 30_000  # room for one entry: the least recently used goes
    assert cache.evict() == [a.key]
    assert c.path.exists()


def _race(root, endpoint, prefix, source, barrier, results):
    from runplane.bootstrap import aws_clients, build_stack
    from runplane.settings import StackSettings

    settings = StackSettings(prefix=prefix, aws_endpoint_url=endpoint, input_buckets=source[5:].partition("/")[0])
    stack = build_stack(settings, aws_clients(settings))
    barrier.wait()
    cache = InputCache(root, stack.objects, stack.store, policy=stack.ports.inputs)
    fetched = cache.fetch(source, f"p{os.getpid()}", **OWNER)
    results.put((fetched.downloaded, fetched.path.read_bytes()[:4]))


def test_two_agents_racing_download_once(aws_stack, datasets, tmp_path):
    datasets.put_bytes("shared/blob", os.urandom(4) + bytes(3_000_000))
    source = f"s3://{datasets.bucket}/shared/blob"
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(
            target=_race,
            args=(
                tmp_path / "nfs-cache",
                aws_stack.settings.aws_endpoint_url,
                aws_stack.settings.prefix,
                source,
                barrier,
                results,
            ),
        )
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    outcome = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert sorted(d for d, _ in outcome) == [False, True]  # one downloaded, the other waited and reused
    assert outcome[0][1] == outcome[1][1]
    assert len(list((tmp_path / "nfs-cache").glob("*/done"))) == 1
