"""A run's secrets are masked in its shipped output (worker_agent/masking.py, logship.py), and go
into its container's environment only (container_spec.py)."""

import random
import re
from pathlib import Path

import pytest

from runplane.adapters.local.files import FileObjectStore
from runplane.domain.runs import Run, RunSpec
from runplane.domain.secrets import MASK
from runplane.services.logs import log_prefix
from worker_agent.container_spec import container_spec
from worker_agent.logship import RunLogs
from worker_agent.masking import Masker, masked_patterns
from worker_agent.run_config import ExecutorConfig

M = MASK.encode()


def streamed(values, pieces):
    """What a masker of ``values`` ships of ``pieces`` read one after the other, then the end."""
    masker = Masker(values)
    return b"".join(masker.feed(piece) for piece in pieces) + masker.end()


def splits(data: bytes):
    """``data`` split in two at every place, and in three at a few."""
    for i in range(len(data) + 1):
        yield [data[:i], data[i:]]
    for i in range(0, len(data), 3):
        for j in range(i, len(data), 5):
            yield [data[:i], data[i:j], data[j:]]


def test_a_value_split_across_reads_is_masked_wherever_the_read_ends():
    data = b"token=s3cr3t-value; done\n"
    for pieces in splits(data):
        out = streamed(["s3cr3t-value"], pieces)
        assert out == b"token=" + M + b"; done\n", pieces


def test_a_value_arriving_one_byte_at_a_time_is_masked_and_little_is_held_back():
    value = "0123456789abcdef"
    data = f"a {value} b {value}{value} c".encode()
    masker = Masker([value])
    out = b""
    for fed, byte in enumerate(data, 1):
        out += masker.feed(bytes([byte]))
        if M not in out:  # before the first value, everything but the last len-1 bytes is shipped
            assert fed - len(out) <= len(value) - 1
    out += masker.end()
    assert out == b"a " + M + b" b " + M + M + b" c"  # one mask per occurrence
    assert value.encode() not in out


def test_overlapping_values_are_masked_as_one_and_leave_no_part_of_either():
    values = ["abcdef", "defghi"]
    data = b"xx abcdefghi yy abcdef zz defghi"
    for pieces in splits(data):
        out = streamed(values, pieces)
        assert re.fullmatch(rb"xx (\*\*\*)+ yy \*\*\* zz \*\*\*", out), (pieces, out)


def test_a_longer_value_holding_a_shorter_one_is_masked_whole():
    out = streamed(["pass", "password123"], [b"the password123 and pass"])
    assert out == b"the " + M + b" and " + M


def test_unicode_values_split_inside_a_character_are_masked():
    value = "pässwörd-🔑-ключ"
    data = f"«{value}»\n".encode()
    for pieces in splits(data):
        out = streamed([value], pieces)
        assert out.decode() == f"«{MASK}»\n"


def test_each_line_of_a_value_of_several_lines_is_masked_and_short_lines_are_not():
    key = "-----BEGIN KEY-----\nAAAAbbbbCCCC\nxy\n    \n-----END KEY-----\n"
    assert masked_patterns([key]) == sorted(
        [key.strip().encode(), b"-----BEGIN KEY-----", b"-----END KEY-----", b"AAAAbbbbCCCC"],
        key=lambda b: (-len(b), b),
    )
    printed = b"line: AAAAbbbbCCCC\nxy    z\n" + key.encode()
    out = streamed([key], [printed[:23], printed[23:]])
    assert out == b"line: " + M + b"\nxy    z\n" + M + b"\n"


def test_values_shorter_than_the_least_masked_length_are_not_masked():
    masker = Masker(["abc", "1", ""])
    assert not masker
    assert masker.feed(b"abc 1") + masker.end() == b"abc 1"


def test_streamed_masking_equals_masking_the_whole_output_at_once():
    rng = random.Random(29)
    alphabet = "abcdefghij"  # values of letters the filler never has: no overlaps across the two
    for _ in range(200):
        values = ["".join(rng.choice(alphabet) for _ in range(rng.randint(4, 12))) for _ in range(rng.randint(1, 4))]
        parts = []
        for _ in range(rng.randint(1, 30)):
            parts.append(
                rng.choice(values) if rng.random() < 0.3 else "".join(rng.choices("xyz \n", k=rng.randint(0, 9)))
            )
        data = "".join(parts).encode()
        whole = Masker(values)
        expected = whole.feed(data) + whole.end()
        cuts = sorted(rng.sample(range(len(data) + 1), min(len(data) + 1, rng.randint(1, 8))))
        pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        out = streamed(values, pieces)
        assert out == expected
        assert all(v.encode() not in out for v in values)


SECRET_42 = "hf_" + "Zq8vYtR2mXw5Kp9LsD3nBc7GhJ4fVa6EuT1yQo0Ie"


def test_a_line_with_no_beginning_of_a_value_goes_out_with_the_read_that_brought_it():
    masker = Masker([SECRET_42])
    assert masker.feed(b"epoch 1 loss 0.51\n") == b"epoch 1 loss 0.51\n"  # nothing waits for the next write
    assert masker.feed(b"step 2 h") == b"step 2 "  # "h" may begin the value: it waits, alone
    assert masker.feed(b"ello\n") == b"hello\n"
    assert masker.feed(b"tok=" + SECRET_42[:20].encode()) == b"tok="
    assert masker.feed(SECRET_42[20:].encode() + b" done\n") == M + b" done\n"
    assert masker.end() == b""


def _longest_beginning(data, patterns):
    """The longest end of ``data`` that begins some pattern and is not all of it (brute force)."""
    return next(
        (data[-k:] for k in range(len(data), 0, -1) if any(len(p) > k and p.startswith(data[-k:]) for p in patterns)),
        b"",
    )


def test_what_is_held_back_is_exactly_the_longest_end_of_the_output_that_begins_a_value():
    rng = random.Random(2929)
    checked = 0
    for _ in range(400):
        values = ["".join(rng.choices("ab", k=rng.choice([4, 5, 9, 17, 30]))) for _ in range(rng.randint(1, 3))]
        value = rng.choice(values)
        data = ("".join(rng.choices("abx", k=rng.randint(0, 40))) + value[: rng.randint(0, len(value) - 1)]).encode()
        patterns = masked_patterns(values)
        if any(p in data for p in patterns):
            continue  # a value whole in the output: what is held back may then be part of a mask
        masker = Masker(values)
        out = masker.feed(data)
        held = _longest_beginning(data, patterns)
        assert out + held == data, (values, data)
        assert masker.end() == held
        checked += 1
    assert checked > 100


def _masked_at_once(data, values):
    """Reference masking of a whole output: every occurrence of every pattern, those that overlap
    joined (two that only touch are not), one mask each."""
    found = sorted(
        (at, at + len(p)) for p in masked_patterns(values) for at in range(len(data)) if data.startswith(p, at)
    )
    joined = []
    for start, end in found:
        if joined and start < joined[-1][1]:
            joined[-1][1] = max(joined[-1][1], end)
        else:
            joined.append([start, end])
    out, at = b"", 0
    for start, end in joined:
        out, at = out + data[at:start] + M, end
    return out + data[at:]


def test_overlapping_and_long_values_streamed_in_any_pieces_are_masked_as_all_at_once():
    rng = random.Random(29029)
    for _ in range(300):
        values = ["".join(rng.choices("abc", k=rng.choice([4, 6, 15, 16, 17, 40]))) for _ in range(rng.randint(1, 4))]
        parts = [rng.choice(values) if rng.random() < 0.4 else "".join(rng.choices("abcz\n", k=rng.randint(0, 12)))]
        for _ in range(rng.randint(0, 12)):
            value = rng.choice(values)  # often a value cut short, or two overlapping
            parts.append(value[: rng.randint(1, len(value))] if rng.random() < 0.5 else value)
        data = "".join(parts).encode()
        expected = _masked_at_once(data, values)
        cuts = sorted(rng.sample(range(len(data) + 1), min(len(data) + 1, rng.randint(1, 12))))
        pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        assert streamed(values, pieces) == expected, (values, pieces)
        assert streamed(values, [bytes([b]) for b in data]) == expected, (values, data)


def test_at_most_a_thousand_lines_are_masked_the_longest_first_and_each_whole_value_still_is():
    lines = [f"line-{i:05d}" + "x" * (i % 7) for i in range(1500)]
    value = "\n".join(lines)
    patterns = masked_patterns([value, "short-secret"])
    longest = sorted((line.encode() for line in lines), key=lambda b: (-len(b), b))
    assert patterns == sorted([value.encode(), b"short-secret", *longest[:1000]], key=lambda b: (-len(b), b))
    kept, dropped = longest[999], longest[1000]
    out = streamed([value, "short-secret"], [kept + b" " + dropped + b" short-secret\n", value.encode()])
    assert out == M + b" " + dropped + b" " + M + b"\n" + M


class _Stream:
    """An attached container's output as docker-py gives it: (stdout, stderr) pairs, then closed."""

    def __init__(self, pairs):
        self.pairs = pairs
        self.closed = False

    def __iter__(self):
        return iter(self.pairs)

    def close(self):
        self.closed = True


def _shipped(objects, run_id, stream):
    prefix = log_prefix(run_id, 1, stream)
    return b"".join(objects.get_bytes(o.key) for o in sorted(objects.list(prefix), key=lambda o: o.key))


def test_run_logs_ship_the_secrets_masked_and_the_stderr_tail_holds_none(tmp_path):
    objects = FileObjectStore(tmp_path, "data", lambda: b"k" * 32, "http://127.0.0.1:1")
    logs = RunLogs(objects, "r-1", 1, lambda: 0.0, 1.0, 1 << 20)
    logs.mask(["hunter2-token", "xyz"])
    stream = _Stream([(b"len=13 hunter2-", None), (None, b"error: hunt"), (b"token xyz\n", b"er2-token!")])
    logs.follow(stream)
    logs.flush()
    assert stream.closed
    assert _shipped(objects, "r-1", "stdout") == b"len=13 " + M + b" xyz\n"
    assert _shipped(objects, "r-1", "stderr") == b"error: " + M + b"!"
    assert logs.stderr_tail() == b"error: " + M + b"!"
    assert logs.received == len(b"len=13 hunter2-error: hunttoken xyz\ner2-token!")


def test_run_logs_without_secrets_ship_each_read_as_it_comes(tmp_path):
    objects = FileObjectStore(tmp_path, "data", lambda: b"k" * 32, "http://127.0.0.1:1")
    logs = RunLogs(objects, "r-2", 1, lambda: 0.0, 1.0, 1 << 20)
    logs.mask([])
    assert logs.maskers == {}
    logs.ship("stdout", b"partial secr")  # nothing held back: there is nothing to mask
    assert logs.shippers["stdout"].pending() == len(b"partial secr")


def test_run_logs_ship_a_line_of_a_run_with_secrets_with_the_read_that_brought_it(tmp_path):
    objects = FileObjectStore(tmp_path, "data", lambda: b"k" * 32, "http://127.0.0.1:1")
    logs = RunLogs(objects, "r-3", 1, lambda: 0.0, 1.0, 1 << 20, secrets=[SECRET_42])
    logs.ship("stdout", b"epoch 1 loss 0.51\n")
    assert logs.shippers["stdout"].pending() == len(b"epoch 1 loss 0.51\n")


def _run(**secrets):
    spec = RunSpec(command="true", image="img", env={"A": "1"}, secrets=secrets, resources={"memory": "64m"})
    return Run(id="r-1", owner="u", queue="q", attempt=1, created_at=0, spec=spec)


@pytest.mark.parametrize("secrets", [{}, {"TOKEN": "s3cr3t-value"}])
def test_secret_values_go_into_the_environment_and_nowhere_else_in_the_container(tmp_path, secrets):
    config = ExecutorConfig(worker_id="w", work_dir=tmp_path)
    run = _run(**dict.fromkeys(secrets, "mytoken"))
    spec = container_spec(run, "img", config, Path("/o"), None, secrets=secrets)
    assert {k: spec["environment"][k] for k in ("A", *secrets)} == {"A": "1", **secrets}
    rest = {k: v for k, v in spec.items() if k != "environment"}
    assert "s3cr3t-value" not in repr(rest)
    assert "s3cr3t-value" not in repr({k: v for k, v in spec["environment"].items() if k not in secrets})
