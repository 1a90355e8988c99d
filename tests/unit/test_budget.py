"""Bounded work, the pure parts: a budget of calls, ports that charge it on every call, what one
resolve of a waiting run may cost, and the window of open members one ``advance`` of a sweep reads
(the ended member first, then a window that moves on each period until every member was read),
and the continuation events that carry the rest being read whatever release wrote them."""

import dataclasses
from pathlib import Path

import pytest
from pydantic import ValidationError

from runplane.domain.messages import DispatchEvent
from runplane.domain.pools import Pool
from runplane.domain.runs import MAX_INPUTS, MAX_UPSTREAMS, Run, RunSpec
from runplane.domain.sweeps import OPEN, PENDING, SUCCEEDED, Sweep, SweepSpec
from runplane.domain.wire import stored
from runplane.services import dependencies, dispatch, sweep_advance
from runplane.services.budget import Budget, meter, metered


class Port:
    name = "a port"

    def __init__(self):
        self.got = []

    def read(self, key):
        self.got.append(key)
        return key.upper()


def test_a_budget_affords_what_is_left_and_says_so_after_each_charge():
    budget = Budget(3)
    assert budget.affords(3) and not budget.affords(4)
    budget.charge(2)
    assert (budget.used, budget.left) == (2, 1)
    assert budget.affords(1) and not budget.affords(2)
    budget.charge(2)  # an overrun is recorded, never hidden
    assert (budget.used, budget.left) == (4, 0) and not budget.affords(1)


def test_a_metered_port_charges_each_call_and_passes_it_on():
    budget, port = Budget(10), Port()
    counted = meter(port, budget)
    assert [counted.read("a"), counted.read("b")] == ["A", "B"]
    assert port.got == ["a", "b"] and budget.used == 2
    assert counted.name == "a port" and budget.used == 2  # reading a value is no call


@dataclasses.dataclass(frozen=True)
class Ports:
    store: object
    queue: object
    quotas: object | None
    clock: object


def test_metered_ports_charge_their_stores_and_queues_only():
    budget, store, queue = Budget(10), Port(), Port()
    ports = metered(Ports(store, queue, None, "the clock"), budget)
    ports.store.read("x")
    ports.queue.read("y")
    assert budget.used == 2 and (store.got, queue.got) == (["x"], ["y"])
    assert ports.quotas is None and ports.clock == "the clock"


def test_a_resolve_costs_its_fixed_calls_and_one_per_run_waited_for():
    run = Run(id="r-1", owner="u", spec=RunSpec(command="x"), queue="q", created_at=1.0, waiting_on=["r-2", "r-3"])
    assert dependencies.resolve_cost(run) == dependencies.RESOLVE_CALLS + 2
    assert dependencies.MAX_WAITS == MAX_UPSTREAMS + MAX_INPUTS + 1


def sweep(status):
    return Sweep(
        id="s-1",
        owner="u",
        spec=SweepSpec(run=RunSpec(command="x"), count=len(status)),
        queue="q",
        created_at=0.0,
        status=status,
    )


def test_advance_reads_every_open_member_of_a_small_sweep():
    small = sweep(OPEN * 5 + PENDING * 3)
    assert sweep_advance._looked_at(small, None, 0.0) == [0, 1, 2, 3, 4]
    assert sweep_advance._looked_at(small, 3, 0.0) == [3, 0, 1, 2, 4]


def test_advance_reads_a_window_of_a_big_sweep_that_moves_each_period_to_cover_them_all():
    status = (OPEN + SUCCEEDED) * 250  # 250 open members, at the even indices
    big = sweep(status)
    seen: set[int] = set()
    for period in range(3):
        window = sweep_advance._looked_at(big, None, period * sweep_advance.ROTATE_SECONDS)
        assert len(window) == sweep_advance.LOOK_PER_ADVANCE and all(status[i] == OPEN for i in window)
        seen |= set(window)
    assert seen == set(big.indices(OPEN))
    # the member whose end this is comes first, within the same number of reads
    window = sweep_advance._looked_at(big, 498, 0.0)
    assert window[0] == 498 and len(window) == sweep_advance.LOOK_PER_ADVANCE
    assert sweep_advance._looked_at(big, 1, 0.0)[0] != 1  # a member not open is not read for itself


def test_the_published_worst_cases_are_the_codes():
    text = (Path(__file__).resolve().parents[2] / "docs" / "scheduling.md").read_text()
    for name, value in {
        "RESOLVE_CALLS": dependencies.RESOLVE_CALLS,
        "MAX_WAITS": dependencies.MAX_WAITS,
        "ADVANCE_CALLS": sweep_advance.ADVANCE_CALLS,
        "LOOK_CALLS": sweep_advance.LOOK_CALLS,
        "RELEASE_CALLS": sweep_advance.RELEASE_CALLS,
        "BURY_CALLS": sweep_advance.BURY_CALLS,
        "LOOK_PER_ADVANCE": sweep_advance.LOOK_PER_ADVANCE,
        "RELEASE_PER_ADVANCE": sweep_advance.RELEASE_PER_ADVANCE,
        "POOL_CALLS": dispatch.POOL_CALLS,
    }.items():
        assert f"`{name}` = {value:,}" in text, f"docs/scheduling.md does not give {name} = {value:,}"


def test_an_event_of_another_release_is_still_read_and_a_continuation_says_where_it_goes_on():
    body = '{"v": 1, "pool": "p", "upstream": "r-1", "skip": 40, "member": 3, "sweep": "s-1", "added_later": 1}'
    event = stored(DispatchEvent, body)
    assert (event.upstream, event.skip, event.sweep, event.member) == ("r-1", 40, "s-1", 3)
    assert DispatchEvent.model_validate_json('{"v": 1, "pool": "p", "upstream": "r-1"}').skip == 0


def test_a_pools_caps_are_at_most_what_one_check_counts():
    assert (
        Pool(
            name="p", cpus=1, memory="1g", default_image="img", max_waiting_runs=1000, max_open_sweeps=500
        ).max_open_sweeps
        == 500
    )
    for too_many in ({"max_waiting_runs": 1001}, {"max_open_sweeps": 501}):
        with pytest.raises(ValidationError, match="less than or equal"):
            Pool(name="p", cpus=1, memory="1g", default_image="img", **too_many)


def test_each_round_of_the_schedule_reads_the_next_window_of_a_big_sweep():
    big = sweep(OPEN * 200)
    by_turn = [sweep_advance._looked_at(big, None, 0.0, turn) for turn in (7, 8)]  # the same minute
    assert set(by_turn[0]) | set(by_turn[1]) == set(range(200))
