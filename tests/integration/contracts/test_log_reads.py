"""Log reads cost what they return, not what the stream holds: on S3 (moto) and Blob (Azurite), the
agent's own shipper writes a log of many chunks, and each read is counted at the real store."""

import uuid

from runplane.domain.runs import Event, Run, RunSpec
from runplane.domain.states import RunState
from runplane.services.logs import MAX_CHUNK, MAX_CHUNKS_READ, MAX_READ, PROBE, log_chunk_key, read_logs
from worker_agent.logship import LogShipper


class CountingStore:
    """The stack's real object store, counting the listings and GETs asked of it."""

    def __init__(self, inner):
        self.inner = inner
        self.reset()

    def reset(self):
        self.lists, self.listed, self.gets = 0, 0, 0

    def get_bytes(self, key):
        self.gets += 1
        return self.inner.get_bytes(key)

    def list_page(self, prefix, cursor, limit):
        found, after = self.inner.list_page(prefix, cursor, limit)
        self.lists, self.listed = self.lists + 1, self.listed + len(found)
        return found, after

    def list(self, prefix):
        found = self.inner.list(prefix)
        self.lists, self.listed = self.lists + 1, self.listed + len(found)
        return found

    def __getattr__(self, name):
        return getattr(self.inner, name)


def ended_run(attempt=1):
    return Run(
        id=f"r-logs-{uuid.uuid4().hex[:8]}",
        owner="alice",
        queue="default",
        spec=RunSpec(command="echo"),
        created_at=1000.0,
        events=[Event(at=1000.0, state=RunState.QUEUED, message="submitted")],
        state=RunState.SUCCEEDED,
        attempt=attempt,
    )


def ship(objects, run, pieces):
    """Write ``pieces`` as the agent does: one flush (one chunk or more) per piece."""
    shipper = LogShipper(objects, run.id, run.attempt, "stdout", clock=lambda: 0.0)
    for piece in pieces:
        shipper.write(piece)
        shipper.flush()
    return b"".join(pieces)


def test_paging_reads_every_byte_in_order_and_no_read_lists_the_stream(stack):
    """250 small chunks (a run that prints a little each second) and one write larger than a chunk:
    paging from 0 by next_offset returns every byte in order; a read at a next_offset lists nothing
    and fetches at most MAX_CHUNKS_READ chunks; only the read at the end lists, a few keys."""
    run = ended_run()
    pieces = [f"line {i:03d} {'x' * (i % 37)}\n".encode() for i in range(250)]
    pieces.insert(120, b"y" * (MAX_CHUNK + 1000))  # the shipper splits it in two chunks
    written = ship(stack.objects, run, pieces)
    assert len(stack.objects.list(f"runs/{run.id}/logs/1/stdout/")) == 252

    objects = CountingStore(stack.objects)
    got, offset, reads = b"", 0, []
    while True:
        objects.reset()
        page = read_logs(objects, run, "stdout", offset)
        reads.append((offset, objects.lists, objects.listed, objects.gets, len(page.data)))
        got += page.data.encode()
        if page.complete:
            break
        assert page.data and page.next_offset > offset, reads[-1]
        offset = page.next_offset
    assert got == written
    assert page.next_offset == len(written)
    assert len(reads) > 252 // MAX_CHUNKS_READ
    for at, lists, listed, gets, size in reads:
        assert lists == 0 and gets <= MAX_CHUNKS_READ and size <= MAX_READ, (at, lists, listed, gets)
    objects.reset()
    end = read_logs(objects, run, "stdout", len(written))  # where a follower waits for more
    assert (end.data, end.next_offset, end.complete) == ("", len(written), True)
    assert objects.listed <= 2 * PROBE, objects.listed  # of the stream's 252 chunks


def test_an_offset_inside_a_chunk_is_found_with_a_few_keys(stack):
    """An offset no chunk starts at (typed by hand, or where a page cut an older agent's chunk)
    reads on from inside its chunk, listing a few keys of the stream's 200."""
    run = ended_run()
    written = ship(stack.objects, run, [f"{i:04d}:{'z' * (i % 11)}\n".encode() for i in range(200)])
    objects = CountingStore(stack.objects)
    for offset in (3, 1001, len(written) - 2, 500):
        objects.reset()
        page = read_logs(objects, run, "stdout", offset, max_bytes=64)
        assert page.data.encode() == written[offset : offset + len(page.data)] and page.data, offset
        assert written[offset:].startswith(page.data.encode())
        assert objects.listed <= 6 * PROBE and objects.gets <= MAX_CHUNKS_READ + 1, (offset, objects.listed)
    objects.reset()
    past = read_logs(objects, run, "stdout", len(written) + 12345)
    assert (past.data, past.next_offset, past.complete) == ("", len(written) + 12345, True)
    objects.reset()
    assert read_logs(objects, run, "stdout", 2**62).next_offset == 2**62  # the largest the API takes
    assert objects.listed == 0


def test_a_log_an_older_agent_wrote_in_large_chunks_reads_whole(stack):
    """Older agents wrote chunks larger than a page: the first page cuts one, the next read finds
    it from inside, and the pages still join up to the whole log."""
    run = ended_run(attempt=2)
    big, small = b"a" * (MAX_READ + 300_000), b"tail\n"
    stack.objects.put_bytes(log_chunk_key(run.id, 2, "stdout", 0), big)
    stack.objects.put_bytes(log_chunk_key(run.id, 2, "stdout", len(big)), small)
    first = read_logs(stack.objects, run, "stdout", 0)
    assert (len(first.data), first.next_offset, first.complete) == (MAX_READ, MAX_READ, False)
    rest = read_logs(stack.objects, run, "stdout", first.next_offset)
    assert rest.data.encode() == big[MAX_READ:] + small and rest.next_offset == len(big) + len(small)
    assert rest.complete


def test_a_running_log_read_at_its_end_is_not_complete(stack):
    run = ended_run().model_copy(update={"state": RunState.RUNNING})
    written = ship(stack.objects, run, [b"one\n", b"two\n"])
    page = read_logs(stack.objects, run, "stdout", 0)
    assert (page.data.encode(), page.complete) == (written, False)
    assert read_logs(stack.objects, run, "stdout", page.next_offset) == type(page)("", len(written), False)
