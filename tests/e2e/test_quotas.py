"""Quotas on the local stack: agents are processes on the "manual" pool, on the real Docker
engine. A user's max_running holds however many workers are free; the runs that wait say why
(the quota) and start as the running one ends, whichever way it ends."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import uuid
from typing import Any

import pytest

from runplane import bootstrap
from runplane.client import Client
from runplane.domain.errors import ConditionFailed
from runplane.domain.expect import Expect
from runplane.domain.quotas import Quota
from runplane.domain.states import RunState
from runplane.services.auth import register_token
from tests.conftest import TERMINAL, api_status, wait_for, wait_state
from tests.gate import GATE, open_gate, output_dir

pytestmark = pytest.mark.docker

ACTIVE = frozenset({"preparing", "running", "uploading"})


@pytest.fixture
def capped(devstack):
    """A user of its own (the local stack is shared by the whole session) with max_running 1:
    its client; the quota is removed afterwards."""
    name = f"q{uuid.uuid4().hex[:8]}"
    stack = bootstrap.stack()
    register_token(stack.tokens, f"{name}-token", name, now=time.time())
    stack.quotas.put(Quota(kind="user", name=name, max_running=1, updated_at=time.time(), updated_by="admin"))
    yield Client(devstack.api_url, f"{name}-token")
    stack.quotas.delete("user", name)


def submit(client: Client, command: str) -> dict[str, Any]:
    return client.request("POST", "/v1/runs", {"command": command, "queue": "manual"})


def get(client: Client, run_id: str) -> dict[str, Any]:
    return client.request("GET", f"/v1/runs/{run_id}")


class Overlaps:
    """Watches runs in a thread for as long as the test runs, and records every pair of them
    seen active at once. Reads are one after another, so a pair counts only when proven: run A
    active at one attempt in two reads, with a read of run B active between them."""

    def __init__(self, client: Client, run_ids: list[str]) -> None:
        self.client = client
        self.run_ids = run_ids
        self.found: list[tuple[str, str]] = []
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Overlaps:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _read(self) -> dict[str, tuple[str, int]]:
        return {
            run_id: (view["state"], view["attempt"]) for run_id in self.run_ids for view in [get(self.client, run_id)]
        }

    def _watch(self) -> None:
        while not self._stop.is_set():
            first, second = self._read(), self._read()
            self.rounds += 1
            for i, a in enumerate(self.run_ids):
                if first[a][0] not in ACTIVE or first[a] != second[a]:
                    continue
                # every other run was read once between a's two reads: in the first round if it
                # comes after a, in the second if before (its other read may be from before a
                # started or after it ended, and proves nothing)
                for j, b in enumerate(self.run_ids):
                    between = first[b] if j > i else second[b]
                    if b != a and between[0] in ACTIVE:
                        self.found.append((a, b))


def without_reaper(run_ids: list[str]) -> None:
    """Keep the reaper from re-sending these queued runs' hints (it does once a hint is a minute
    old): whatever starts them is the hint the end of the running run sends."""
    store = bootstrap.stack().store
    for run_id in run_ids:
        run = store.get(run_id)
        with contextlib.suppress(ConditionFailed):  # claimed meanwhile
            store.update(
                run, Expect(states=frozenset({RunState.QUEUED}), attempt=run.attempt), {"hinted_at": time.time() + 3600}
            )


def running(client: Client, run_ids: list[str]) -> list[str]:
    return [r for r in run_ids if get(client, r)["state"] == "running"]


def waiting_on_quota(client: Client, run_ids: list[str]) -> bool:
    views = [get(client, r) for r in run_ids]
    return all(v["state"] == "queued" and (v["waiting_reason"] or "").startswith("quota:") for v in views)


def test_max_running_one_runs_one_at_a_time_with_three_free_workers(capped, agents, tmp_path):
    for _ in range(3):
        agents("--idle-seconds", "120")
    runs = [submit(capped, f"echo started; {GATE}")["id"] for _ in range(3)]
    with Overlaps(capped, runs) as watch:
        for turn in range(3):
            current = wait_for(lambda: running(capped, runs), 90, 0.2, f"run {turn + 1} of 3 to start")
            assert len(current) == 1
            others = [r for r in runs if r not in current and get(capped, r)["state"] == "queued"]
            assert len(others) == 2 - turn
            # the runs that wait say why: the quota, though two workers are free
            wait_for(lambda others=others: waiting_on_quota(capped, others), 60, 0.2, "the quota as the reason")
            for view in [get(capped, r) for r in others]:
                assert view["waiting_reason"] == f"quota: {view['owner']} runs 1 of at most 1 run(s) at once"
            without_reaper(others)
            open_gate(output_dir(tmp_path / "work", current[0]))
            assert wait_state(capped, current[0], TERMINAL, timeout=60)["state"] == "succeeded"
        wait_for(lambda: watch.rounds >= 2, 30, 0.1, "the watcher to read every run")
    assert watch.found == []
    done = [get(capped, r) for r in runs]
    assert [d["state"] for d in done] == ["succeeded"] * 3
    spans = sorted((d["started_at"], d["finished_at"]) for d in done)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, f"two runs overlapped: {spans}"


def test_killing_the_running_run_lets_the_next_start(capped, agents, tmp_path):
    agents("--idle-seconds", "120")
    agents("--idle-seconds", "120")
    first, second = (submit(capped, f"echo started; {GATE}")["id"] for _ in range(2))
    holder = wait_for(lambda: running(capped, [first, second]), 90, 0.2, "one run to start")[0]
    other = second if holder == first else first
    wait_for(lambda: waiting_on_quota(capped, [other]), 60, 0.2, "the other run to wait on the quota")
    without_reaper([other])
    capped.request("POST", f"/v1/runs/{holder}/kill")
    assert wait_state(capped, holder, TERMINAL, timeout=60)["state"] == "killed"
    # its share freed: the other starts, on the hint the end of the killed run sent
    wait_state(capped, other, {"running"}, timeout=60)
    open_gate(output_dir(tmp_path / "work", other))
    assert wait_state(capped, other, TERMINAL, timeout=60)["state"] == "succeeded"


def test_submit_charges_a_group_of_the_callers_own_and_refuses_what_can_never_fit(capped, devstack, bob):
    carol = Client(devstack.api_url, "carol-token")  # of the group vision only
    body = {"command": "true", "queue": "parked"}
    run = carol.request("POST", "/v1/runs", body)
    assert run["group"] == "vision"
    carol.request("POST", f"/v1/runs/{run['id']}/kill")
    mine = bob.request("POST", "/v1/runs", body)
    assert mine["group"] is None
    bob.request("POST", f"/v1/runs/{mine['id']}/kill")
    # a group the caller is not in is refused, whoever asks
    for client, group in ((carol, "audio"), (bob, "vision")):
        status, code, message = api_status(
            lambda c=client, g=group: c.request("POST", "/v1/runs", {**body, "group": g})
        )
        assert (status, code, message) == (422, "not_allowed", f"you are not in group {group}")
    status, _, message = api_status(lambda: carol.request("POST", "/v1/runs", {**body, "group": "Not A Group"}))
    assert status == 422 and "group" in message
    # a run that alone exceeds its owner's quota would wait forever: refused at once
    fits = capped.request("POST", "/v1/runs", body)
    capped.request("POST", f"/v1/runs/{fits['id']}/kill")
    name = fits["owner"]
    bootstrap.stack().quotas.put(Quota(kind="user", name=name, max_cpus=1, updated_at=time.time()))
    status, code, message = api_status(lambda: capped.request("POST", "/v1/runs", {**body, "resources": {"cpus": 2}}))
    assert (status, code, message) == (
        422,
        "not_allowed",
        f"quota: {name} allows at most 1 CPUs at once; this run asks 2",
    )
