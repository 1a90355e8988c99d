"""The shared input cache against the moto server: sources, reuse, eviction, and two
processes racing for the same input downloading it once."""

import multiprocessing
import os
import time

import pytest

from runplane.domain.models import Run, RunSpec, RunState
from runplane.ports import Expect
from runplane.services.logs import outputs_prefix
from worker_agent.inputs import InputCache, InputUnavailable


@pytest.fixture
def cache(aws_stack, tmp_path):
    objects = aws_stack.objects
    objects.put_bytes("data/train.csv", b"a,b\n1,2\n")
    objects.put_bytes("data/set/x.txt", b"x" * 1000)
    objects.put_bytes("data/set/sub/y.txt", b"y" * 1000)
    return InputCache(tmp_path / "cache", objects, aws_stack.store)


def finished_run(stack, state=RunState.SUCCEEDED, files=None):
    run = stack.store.create(
        Run(
            id=f"r-src{os.urandom(4).hex()}",
            owner="a",
            queue="default",
            created_at=1,
            attempt=1,
            spec=RunSpec(command="x"),
        )
    )
    for path, data in (files or {}).items():
        stack.objects.put_bytes(outputs_prefix(run.id, 1) + path, data)
    return stack.store.update(run, Expect(), {"state": state})


def test_s3_file_and_prefix(cache, aws_stack):
    bucket = aws_stack.objects.bucket
    one = cache.fetch(f"s3://{bucket}/data/train.csv", "u1")
    assert one.downloaded
    assert one.path.read_bytes() == b"a,b\n1,2\n"
    tree = cache.fetch(f"s3://{bucket}/data/set", "u1")
    assert sorted(str(p.relative_to(tree.path)) for p in tree.path.rglob("*.txt")) == ["sub/y.txt", "x.txt"]
    again = cache.fetch(f"s3://{bucket}/data/train.csv", "u2")
    assert (again.downloaded, again.key) == (False, one.key)


def test_changed_object_is_a_new_entry(cache, aws_stack):
    source = f"s3://{aws_stack.objects.bucket}/data/train.csv"
    first = cache.fetch(source, "u")
    aws_stack.objects.put_bytes("data/train.csv", b"new\n")
    second = cache.fetch(source, "u")
    assert second.key != first.key
    assert second.path.read_bytes() == b"new\n"


def test_run_outputs(cache, aws_stack):
    run = finished_run(aws_stack, files={"model/w.bin": b"weights", "log.txt": b"l"})
    whole = cache.fetch(f"run:{run.id}", "u")
    assert (whole.path / "model" / "w.bin").read_bytes() == b"weights"
    part = cache.fetch(f"run:{run.id}/model/w.bin", "u")
    assert part.path.read_bytes() == b"weights"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("s3://{bucket}/nope.csv", "nothing there"),
        ("run:r-missing", "does not exist"),
        ("s3://no-such-bucket/x", "cannot list"),
    ],
)
def test_unavailable(cache, aws_stack, source, message):
    with pytest.raises(InputUnavailable, match=message):
        cache.fetch(source.format(bucket=aws_stack.objects.bucket), "u")


def test_unfinished_run_is_unavailable(cache, aws_stack):
    run = finished_run(aws_stack, state=RunState.RUNNING)
    with pytest.raises(InputUnavailable, match="is running, not succeeded"):
        cache.fetch(f"run:{run.id}", "u")


def test_eviction_is_lru_and_spares_entries_in_use(cache, aws_stack):
    bucket = aws_stack.objects.bucket
    for i in range(3):
        aws_stack.objects.put_bytes(f"big/{i}", bytes(20_000))
    a = cache.fetch(f"s3://{bucket}/big/0", "run-a")
    time.sleep(0.01)
    b = cache.fetch(f"s3://{bucket}/big/1", "run-b")
    time.sleep(0.01)
    c = cache.fetch(f"s3://{bucket}/big/2", "run-c")
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

    settings = StackSettings(prefix=prefix, aws_endpoint_url=endpoint)
    stack = build_stack(settings, aws_clients(settings))
    barrier.wait()
    fetched = InputCache(root, stack.objects, stack.store).fetch(source, f"p{os.getpid()}")
    results.put((fetched.downloaded, fetched.path.read_bytes()[:4]))


def test_two_agents_racing_download_once(aws_stack, tmp_path):
    aws_stack.objects.put_bytes("shared/blob", os.urandom(4) + bytes(3_000_000))
    source = f"s3://{aws_stack.objects.bucket}/shared/blob"
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
