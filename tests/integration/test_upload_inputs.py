"""Upload inputs (``upload:<sha256>``) in the agent's input cache, on the stack of one machine: read
from the run owner's upload key only, checked against their SHA-256, unpacked once into an entry
keyed by it, and refused (nothing cached, nothing partial left) when hostile or too large."""

import hashlib
import io
import os
import tarfile

import pytest
from botocore.awsrequest import AWSResponse

from runplane.domain.units import format_bytes
from runplane.domain.uploads import upload_key
from worker_agent.inputs import InputCache, InputUnavailable, Resolved, upload_gone
from worker_agent.unpack import ENTRY_BYTES


def packed(files, extra=()):
    """A gzip'd tar of ``files`` (name -> bytes) and ``extra`` (TarInfo, data) members; its bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info, data in extra:
            tar.addfile(info, data)
    return buf.getvalue()


def uploaded(stack, owner, data):
    sha = hashlib.sha256(data).hexdigest()
    stack.objects.put_bytes(upload_key(owner, sha), data)
    return sha


def left_in(cache):
    """What the cache root holds: entries, locks and anything partial."""
    return sorted(p.name for p in cache.root.iterdir()) if cache.root.exists() else []


@pytest.fixture
def cache(local_stack, tmp_path):
    return InputCache(tmp_path / "cache", local_stack.objects, local_stack.store)


@pytest.mark.parametrize("cloud", ["aws_stack", "azure_stack", "local_stack"])
def test_an_upload_unpacks_once_into_an_entry_keyed_by_its_sha_on_every_cloud(request, cloud, tmp_path):
    stack = request.getfixturevalue(cloud)
    cache = InputCache(tmp_path / "cache", stack.objects, stack.store)
    files = {"train.py": b"print(open('data/x.csv').read())\n", "data/x.csv": b"a,b\n1,2\n"}
    sha = uploaded(stack, "alice", packed(files))
    first = cache.fetch(f"upload:{sha}", "u1", owner="alice")
    assert (first.key, first.downloaded, first.size) == (
        f"upload-{sha}",
        True,
        sum(map(len, files.values())) + len(files) * ENTRY_BYTES,
    )
    assert {str(p.relative_to(first.path)): p.read_bytes() for p in first.path.rglob("*") if p.is_file()} == files
    again = cache.fetch(f"upload:{sha}", "u2", owner="alice")
    assert (again.path, again.downloaded, again.size) == (first.path, False, first.size)
    assert left_in(cache) == [f"upload-{sha}", f"upload-{sha}.lock"]  # the archive itself is not kept


@pytest.mark.parametrize("cloud", ["aws_stack", "azure_stack", "local_stack"])
def test_another_users_upload_reads_as_one_that_does_not_exist_on_every_cloud(request, cloud, tmp_path):
    stack = request.getfixturevalue(cloud)
    cache = InputCache(tmp_path / "cache", stack.objects, stack.store)
    sha = uploaded(stack, "alice", packed({"a": b"x"}))
    with pytest.raises(InputUnavailable) as e:
        cache.fetch(f"upload:{sha}", "u1", owner="mallory")
    assert e.value.message == upload_gone(sha)
    assert cache.entries() == 0


@pytest.mark.parametrize("cloud", ["aws_stack", "azure_stack", "local_stack"])
def test_an_upload_deleted_since_the_run_was_submitted_fails_it_saying_to_upload_again(request, cloud, tmp_path):
    """Retention deletes an upload not used for a while: a run queued longer meets it gone."""
    stack = request.getfixturevalue(cloud)
    cache = InputCache(tmp_path / "cache", stack.objects, stack.store)
    sha = uploaded(stack, "alice", packed({"train.py": b"print(1)\n"}))
    stack.objects.delete([upload_key("alice", sha)])
    with pytest.raises(InputUnavailable) as e:
        cache.fetch(f"upload:{sha}", "u1", owner="alice")
    assert e.value.message == upload_gone(sha)
    assert f"upload {sha} is gone" in e.value.message and "upload the directory again" in e.value.message
    assert cache.entries() == 0


def test_s3s_403_for_a_missing_key_reads_as_a_gone_upload(aws_stack, tmp_path):
    """A worker whose role may read uploads/ but not list it: S3 answers a HEAD of a missing key 403, not 404.
    The S3 adapter and botocore take S3's own answer here (moto enforces no IAM), sent back
    before the request leaves."""
    sha = hashlib.sha256(b"never sent").hexdigest()
    client = aws_stack.objects.client

    def forbidden(request, **_):
        if request.method == "HEAD" and upload_key("alice", sha) in request.url:
            return AWSResponse(request.url, 403, {"x-amz-request-id": "r"}, _Empty())
        return None

    client.meta.events.register("before-send.s3.HeadObject", forbidden)
    try:
        with pytest.raises(InputUnavailable) as e:
            InputCache(tmp_path / "cache", aws_stack.objects, aws_stack.store).fetch(
                f"upload:{sha}", "u1", owner="alice"
            )
    finally:
        client.meta.events.unregister("before-send.s3.HeadObject", forbidden)
    # a 403 is also what a role without s3:GetObject on uploads/ gets: the message names that too
    assert e.value.message == upload_gone(sha, denied=True)
    assert "or this worker's role cannot read uploads/ (ReadUploads)" in e.value.message


class _Empty:
    """The body of an answer to a HEAD."""

    def stream(self, *_, **__):
        return iter(())


def test_stored_bytes_that_do_not_match_their_sha_are_refused(local_stack, cache):
    sha = hashlib.sha256(b"what was announced").hexdigest()
    local_stack.objects.put_bytes(upload_key("alice", sha), packed({"a": b"something else"}))
    with pytest.raises(InputUnavailable, match="does not match its SHA-256"):
        cache.fetch(f"upload:{sha}", "u1", owner="alice")
    assert left_in(cache) == [f"upload-{sha}.lock"]


def test_a_hostile_upload_is_refused_and_leaves_nothing(local_stack, cache, tmp_path):
    link = tarfile.TarInfo("out")
    link.type, link.linkname = tarfile.SYMTYPE, "../../../.."
    sha = uploaded(local_stack, "alice", packed({"ok.txt": b"fine"}, [(link, None)]))
    with pytest.raises(InputUnavailable) as e:
        cache.fetch(f"upload:{sha}", "u1", owner="alice")
    assert e.value.message == f"upload:{sha}: refused: the archive's link 'out' points out of the directory"
    assert left_in(cache) == [f"upload-{sha}.lock"]


def test_an_upload_unpacks_within_the_stacks_limit_and_the_runs_disk(local_stack, tmp_path):
    sha = uploaded(local_stack, "alice", packed({"zeros": bytes(50_000)}))
    small = InputCache(tmp_path / "small", local_stack.objects, local_stack.store, max_upload_bytes=2_000)
    with pytest.raises(InputUnavailable, match="more bytes than its limit"):  # 20 x 2 000 bytes at most
        small.fetch(f"upload:{sha}", "u1", owner="alice")
    roomy = InputCache(tmp_path / "roomy", local_stack.objects, local_stack.store, max_upload_bytes=10_000)
    with pytest.raises(InputUnavailable, match="more bytes than its limit"):  # the run's disk left: 40 000
        roomy.fetch(f"upload:{sha}", "u1", owner="alice", max_bytes=40_000)
    assert roomy.fetch(f"upload:{sha}", "u1", owner="alice").size == 50_000 + ENTRY_BYTES
    with pytest.raises(InputUnavailable, match=r"unpacks to 52\.8k, more than the 39\.1k"):  # cached, still too large
        roomy.fetch(f"upload:{sha}", "u2", owner="alice", max_bytes=40_000)


def test_a_cached_upload_serves_another_owner_only_once_their_own_archive_matched(local_stack, cache):
    data = packed({"secret.txt": b"alice's weights"})
    sha = uploaded(local_stack, "alice", data)
    first = cache.fetch(f"upload:{sha}", "alice-run", owner="alice")
    local_stack.objects.put_bytes(upload_key("bob", sha), b"junk whose MD5 the store checked")
    with pytest.raises(InputUnavailable, match="does not match its SHA-256"):
        cache.fetch(f"upload:{sha}", "bob-run", owner="bob")
    assert sorted(p.name for p in (cache.root / first.key / "users").iterdir()) == ["alice-run"]
    local_stack.objects.put_bytes(upload_key("carol", sha), data)  # the same content, uploaded by her
    theirs = cache.fetch(f"upload:{sha}", "carol-run", owner="carol")
    assert (theirs.path, theirs.downloaded, theirs.size) == (
        first.path,
        True,
        first.size,
    )  # checked, not unpacked again
    assert cache.fetch(f"upload:{sha}", "carol-run2", owner="carol").downloaded is False


def test_an_upload_is_fetched_within_the_stacks_upload_limit_when_the_run_sets_no_disk(local_stack, tmp_path):
    data = packed({"noise": os.urandom(5_000)})  # barely compresses: unpacks well within 20 x the limit
    sha = uploaded(local_stack, "alice", data)
    cache = InputCache(tmp_path / "cache", local_stack.objects, local_stack.store, max_upload_bytes=2_000)
    with pytest.raises(InputUnavailable) as e:  # refused as the store lists it, before a byte is read
        cache.fetch(f"upload:{sha}", "u1", owner="alice")
    assert e.value.message == f"upload:{sha} is {format_bytes(len(data))}, more than the 2000 an upload may be"
    # one that grew since it was listed (Azure cannot bind the length of a PUT) stops at the limit
    listed = Resolved(local_stack.objects, upload_key("alice", sha), True, sha, 1_000)
    with pytest.raises(InputUnavailable, match=r"grew since it was listed, more than the 2000 an upload"):
        cache._download_upload(listed, cache.root / f"upload-{sha}", f"upload:{sha}", sha, None, "alice")
    assert cache.entries() == 0
