import pytest
from pydantic import ValidationError

from runplane.domain.asks import Resources
from runplane.domain.errors import InvalidRequest, Unschedulable
from runplane.domain.pools import Pool, choose_pool, load_pools
from runplane.domain.ranks import rank_key
from runplane.domain.runs import RunSpec
from runplane.domain.states import TERMINAL_STATES, TRANSITIONS, RunState, can_transition, states_leading_to
from runplane.domain.units import format_bytes, format_duration, parse_bytes, parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [("512m", 512 * 2**20), ("2g", 2 * 2**30), ("1.5GiB", int(1.5 * 2**30)), ("100", 100), (4096, 4096), ("1k", 1024)],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["lots", "5x", "", "-1m", True])
def test_parse_bytes_rejects(bad):
    with pytest.raises(ValueError, match=r"^(cannot read size|a size must be a number of bytes)"):
        parse_bytes(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("90s", 90), ("1h", 3600), ("1h30m", 5400), ("2d", 172800), (45, 45), ("12", 12), ("250ms", 0.25)],
)
def test_parse_duration(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["soon", "1h and more", "h", "-5"])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError, match=f"cannot read duration '{bad}'"):
        parse_duration(bad)


def test_formatting_round_trips():
    assert format_bytes(parse_bytes("512m")) == "512m"
    assert format_duration(parse_duration("1h30m")) == "1h30m"
    assert format_duration(59) == "59s"


def test_terminal_states_have_no_way_out():
    for state in TERMINAL_STATES:
        assert TRANSITIONS[state] == frozenset()
        for other in RunState:
            assert not can_transition(state, other)


def test_only_listed_transitions():
    assert can_transition(RunState.QUEUED, RunState.PREPARING)
    assert not can_transition(RunState.QUEUED, RunState.RUNNING)
    assert not can_transition(RunState.QUEUED, RunState.SUCCEEDED)
    assert can_transition(RunState.RUNNING, RunState.QUEUED)  # re-queue after a lost lease
    assert not can_transition(RunState.RUNNING, RunState.SUCCEEDED)  # success passes through uploading
    assert states_leading_to(RunState.SUCCEEDED) == {RunState.UPLOADING}
    assert set(RunState) == {s for s in TRANSITIONS}


def test_state_names_are_the_api_spelling():
    assert [s.value for s in RunState] == [
        "queued",
        "preparing",
        "running",
        "uploading",
        "succeeded",
        "failed",
        "killed",
        "timed_out",
    ]


def test_runspec_parses_sizes_and_rejects_extras():
    spec = RunSpec.model_validate({"command": "echo", "resources": {"memory": "512m", "disk": "1g", "time": "90s"}})
    assert spec.resources.memory == 512 * 2**20
    assert spec.resources.time == 90
    with pytest.raises(ValidationError, match="Extra inputs"):
        RunSpec.model_validate({"command": "echo", "comand": "typo"})


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"command": "  "}, "command is blank"),
        ({"command": "x", "env": {"1BAD": "v"}}, "not valid"),
        ({"command": "x", "env": {"RUNPLANE_RUN_ID": "v"}}, "reserved"),
        ({"command": "x", "inputs": {"data": "http://x"}}, "s3://"),
        ({"command": "x", "resources": {"gpus": -1}}, "greater than or equal"),
        ({"command": "x", "queue": "Bad Name"}, "pattern"),
    ],
)
def test_runspec_errors_say_what_is_wrong(body, fragment):
    with pytest.raises(ValidationError, match="1 validation error for RunSpec") as info:
        RunSpec.model_validate(body)
    assert fragment in str(info.value)


POOLS = load_pools(
    """
pools:
  - {name: small, cpus: 2, memory: 4g, default_image: img}
  - {name: large, cpus: 16, memory: 64g, default_image: img}
  - {name: gpu, cpus: 8, gpus: 4, gpu_type: a100, memory: 128g, default_image: img, max_time: 1d}
"""
)


def test_choose_smallest_pool_that_fits():
    assert choose_pool(POOLS, Resources(cpus=1), None).name == "small"
    assert choose_pool(POOLS, Resources(cpus=8, memory=parse_bytes("32g")), None).name == "large"
    assert choose_pool(POOLS, Resources(gpus=1), None).name == "gpu"


def test_unfit_request_names_the_largest_pool():
    with pytest.raises(Unschedulable, match=r"no pool can run this request \(asks 8 gpus, pool has 4\)") as info:
        choose_pool(POOLS, Resources(gpus=8), None)
    assert "gpu: 8 cpus, 4 gpu (a100), 128g memory" in info.value.message
    with pytest.raises(Unschedulable, match="asks 2 gpus, pool has 0"):
        choose_pool(POOLS, Resources(gpus=2), "small")
    with pytest.raises(Unschedulable, match="allows at most"):
        choose_pool(POOLS, Resources(gpus=1, time=3 * 86400), "gpu")


def test_unknown_queue_lists_pools():
    with pytest.raises(InvalidRequest, match="pools are: small, large, gpu"):
        choose_pool(POOLS, Resources(), "nope")


def test_pool_config_errors_are_readable(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text("pools:\n  - {name: a, cpus: 1, memory: 1g, default_image: x, min_workers: 3, max_workers: 1}\n")
    with pytest.raises(ValueError, match="min_workers > max_workers"):
        load_pools(str(path))
    with pytest.raises(ValueError, match="cannot read pools file"):
        load_pools(str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="duplicate pool names"):
        load_pools(
            "pools:\n  - {name: a, cpus: 1, memory: 1g, default_image: x}\n"
            "  - {name: a, cpus: 1, memory: 1g, default_image: x}\n"
        )


def test_pool_accepts_human_units():
    pool = Pool.model_validate({"name": "p", "cpus": 1, "memory": "2g", "default_image": "x", "idle_seconds": "5m"})
    assert pool.memory == 2 * 2**30
    assert pool.idle_seconds == 300


def test_which_workers_take_a_run_by_tag_and_group():
    from runplane.domain.runs import Run, RunSpec
    from runplane.domain.workers import Worker, refuses

    def run(tag=None, groups=(), group=None):
        spec = RunSpec.model_validate({"command": "x", **({"tag": tag} if tag else {})})
        return Run(id="r", owner="ann", owner_groups=list(groups), group=group, spec=spec, queue="p", created_at=0)

    plain, tagged = run(), run(tag="a100-box")
    assert refuses(None, False, None, plain) is None
    assert refuses(None, False, None, tagged) == "the run asks for a worker tagged a100-box"
    assert refuses("a100-box", False, None, tagged) is None
    assert refuses("a100-box", False, None, plain) is None  # a tagged worker also takes untagged runs
    assert refuses("a100-box", True, None, plain) == "this worker takes only runs tagged a100-box"
    assert refuses("other", False, None, tagged) == "the run asks for a worker tagged a100-box"
    assert refuses(None, False, "vision", plain) == "this worker serves group vision only and ann is not in it"
    # a group's worker takes only runs charged to the group, not any run of one of its members
    assert refuses(None, False, "vision", run(groups=["nlp", "vision"], group="vision")) is None
    assert refuses(None, False, "vision", run(groups=["nlp", "vision"], group="nlp")) == (
        "this worker serves group vision only and the run is charged to group nlp"
    )
    assert refuses(None, False, "vision", run(groups=["nlp", "vision"])) == (
        "this worker serves group vision only and the run is charged to no group"
    )
    worker = Worker(id="w", pool="p", started_at=0, heartbeat_at=0, tag="a100-box", tag_exclusive=True)
    assert worker.refuses(tagged) is None and worker.refuses(plain) is not None


def test_rank_keys_sort_as_their_tags_whatever_the_tag():
    """A tag beyond the rank's fixed width, or below 0, is held at its edge: the strings never
    sort out of the numbers' order (an unclamped 1e13 sorts before 5.0)."""
    tags = [-3.0, 0.0, 5.0, 9_999_999_999_998.0, 1e13, 1e20]
    keys = [rank_key(50, tag, 100.0, "r-a") for tag in tags]
    assert sorted(keys) == keys
    assert len({len(k) for k in keys}) == 1
    assert rank_key(50, 1e20, 100.0, "r-a") < rank_key(40, 0.0, 100.0, "r-a")


def test_text_in_other_scripts_and_emoji_passes_where_hidden_characters_do_not():
    """A command keeps what real text needs (other scripts, emoji joined by U+200D, Persian's
    U+200C); a name refuses even those joiners, and both refuse every format character."""
    persian = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"  # with its zero-width non-joiner
    for command in ("echo שלום", "echo 👩\u200d🔬", f"echo {persian}", "echo 👍🏽 é"):
        assert RunSpec(command=command).command == command
    with pytest.raises(ValidationError, match="u200d"):
        RunSpec(command="x", name="a\u200db")
    for hidden in ("\u202e", "\u2066", "\u200b", "\U000e0041", "\u2028", "\u00ad", "\u3164"):
        with pytest.raises(ValidationError, match="changes how text is shown"):
            RunSpec(command=f"echo {hidden}")
