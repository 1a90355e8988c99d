"""The SQLite stores' conditional writes race across processes, as the stack's own processes (the
front, the functions, every agent) write one database: each process opens the database itself,
and nothing but SQLite's write transactions stands between them. No write is lost, no run is
claimed twice, no id is created twice."""

import multiprocessing
import random
import traceback

from runplane.adapters.local.db import Database
from runplane.adapters.local.runs import SqliteRunStore
from runplane.adapters.local.sweeps import SqliteSweepStore
from runplane.domain.errors import AlreadyExists, ConditionFailed
from runplane.domain.runs import Run, RunSpec
from runplane.domain.sweeps import PENDING, Sweep, SweepSpec
from runplane.services import lifecycle

PROCESSES = 8
RUNS = 24
IDS = 16
SAVES = 6


def _run(run_id: str, created_at: float) -> Run:
    return Run(id=run_id, owner="alice", spec=RunSpec(command="true"), queue="default", created_at=created_at)


def _racer(state_dir, n, start, results):
    """One process of the race: creates each contested id, claims every queued run it can, follows
    the shared run once and adds its marks to the shared sweep, reading again when another process
    wrote first. Sends back what it won, or the traceback of what went wrong."""
    try:
        db = Database.at(state_dir)  # this process's own database object and connections
        runs, sweeps = SqliteRunStore(db), SqliteSweepStore(db)
        order = list(range(RUNS))
        random.Random(n).shuffle(order)
        start.wait()
        claimed, created = [], []
        for i in range(IDS):
            try:
                runs.create(_run(f"r-same-{i}", 2000.0 + n))
                created.append(i)
            except AlreadyExists:
                pass
        for i in order:
            try:
                lifecycle.claim(runs, runs.get(f"r-race-{i}"), 0, f"w{n}", 60.0, 1000.0)
                claimed.append(i)
            except ConditionFailed:
                pass
        runs.follow("r-followed", f"r-from-{n}")
        for k in range(SAVES):
            sweep = sweeps.get("s-race")
            while True:
                try:
                    sweeps.save(sweep.model_copy(update={"dependents": [*sweep.dependents, f"r-{n}-{k}"]}))
                    break
                except ConditionFailed as e:
                    sweep = e.details["sweep"]
        results.put((n, claimed, created, None))
    except BaseException:
        results.put((n, [], [], traceback.format_exc()))


def test_processes_racing_on_one_database_never_claim_twice_create_twice_or_lose_a_write(tmp_path):
    state_dir = tmp_path / "state"
    db = Database.at(state_dir)
    runs, sweeps = SqliteRunStore(db), SqliteSweepStore(db)
    for i in range(RUNS):
        runs.create(_run(f"r-race-{i}", 1000.0 + i))
    runs.create(_run("r-followed", 999.0))
    spec = SweepSpec(run=RunSpec(command="true"), count=1)
    sweeps.create(Sweep(id="s-race", owner="alice", spec=spec, queue="default", created_at=999.0, status=PENDING))

    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(PROCESSES), context.Queue()
    racers = [context.Process(target=_racer, args=(state_dir, n, start, results)) for n in range(PROCESSES)]
    for racer in racers:
        racer.start()
    got = [results.get(timeout=60) for _ in racers]
    for racer in racers:
        racer.join(timeout=10)

    assert [error for *_, error in got if error] == []
    winners: dict[int, list[int]] = {}
    makers: dict[int, list[int]] = {}
    for n, claimed, created, _ in got:
        for i in claimed:
            winners.setdefault(i, []).append(n)
        for i in created:
            makers.setdefault(i, []).append(n)
    assert {i: len(w) for i, w in winners.items()} == dict.fromkeys(range(RUNS), 1)  # each claimed exactly once
    for i, [n] in winners.items():
        stored = runs.get(f"r-race-{i}")
        assert (stored.worker_id, stored.attempt) == (f"w{n}", 1)
    assert {i: len(m) for i, m in makers.items()} == dict.fromkeys(range(IDS), 1)  # each made exactly once
    for i, [n] in makers.items():
        assert runs.get(f"r-same-{i}").created_at == 2000.0 + n  # and it is the winner's run
    assert sorted(runs.get("r-followed").dependents) == sorted(f"r-from-{n}" for n in range(PROCESSES))
    final = sweeps.get("s-race")
    assert sorted(final.dependents) == sorted(f"r-{n}-{k}" for n in range(PROCESSES) for k in range(SAVES))
    assert final.version == 1 + PROCESSES * SAVES
