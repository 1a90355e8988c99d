"""Cloud-agnostic glue for the dispatcher and reaper entrypoints: events in, services called."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from runplane import metrics
from runplane.domain.errors import InvalidRequest, NotFound, OutOfTime, RunplaneError
from runplane.domain.messages import DispatchEvent
from runplane.domain.runs import SWEEP_PREFIX
from runplane.domain.wire import stored
from runplane.domain.workers import PoolRecord
from runplane.ports import Ports
from runplane.services import dependencies, fallback, retention, skew, sweep_advance
from runplane.services.budget import Budget, metered
from runplane.services.dispatch import Decision, PoolFigures, dispatch_pool
from runplane.services.reap import ReapReport, reap

log = logging.getLogger(__name__)


SCHEDULE_RECORD = "@schedule"
"""The pool-state record where the schedule keeps where its last pass stopped (no pool's name)."""
TIME_LEFT_MARGIN = 10.0
"""Seconds an invocation keeps in hand: a record met later is failed alone (and tried again)."""
SWEEP_TIME_LEFT_MARGIN = 15.0
"""Seconds a reaper invocation keeps in hand: the retention sweep begins no run with less left."""


class PoolDispatcher:
    """Dispatches each pool at most once per invocation, however many events name it. Work on
    waiting runs and sweeps is bounded by the stack's ``schedule_calls`` a pass and
    ``event_calls`` an event. ``time_left`` (seconds, the host's) makes a record met too late fail
    alone, so that one long event never times the others of its batch out."""

    def __init__(self, ports: Ports, *, time_left: Callable[[], float] | None = None) -> None:
        self.ports = ports
        self.schedule_calls = ports.settings.schedule_calls
        self.event_calls = ports.settings.event_calls
        self.time_left = time_left
        self.results: dict[str, Decision | RunplaneError] = {}
        self.sweeps_moved: set[tuple[str, int | None]] = set()
        self.upstreams_told: set[tuple[str, int]] = set()

    def pool(self, name: str) -> Decision:
        if name not in self.results:
            pool = self.ports.pools.get(name)
            if pool is None:
                raise InvalidRequest(f"unknown pool {name!r}")
            try:
                self.results[name] = dispatch_pool(self.ports, pool)
            except RunplaneError as e:
                self.results[name] = e
            result = self.results[name]
            figures = result.figures if isinstance(result, Decision) else result.details.get("figures")
            if isinstance(figures, PoolFigures):
                metrics.pool_figures(name, figures)
        result = self.results[name]
        if isinstance(result, RunplaneError):
            raise result
        return result

    def record_handler(self) -> Callable[[Any], Decision | None]:
        """For a batch processor: one queue record (``.body``) -> dispatch its pool. Each record
        has its own budget; one that raises fails alone."""

        def handle(record: Any) -> Decision | None:
            if self.time_left is not None and self.time_left() < TIME_LEFT_MARGIN:
                raise OutOfTime("too little time left in this invocation; the event is tried again")
            try:
                event = stored(DispatchEvent, record.body)
            except ValidationError:
                log.warning("ignoring unreadable dispatcher event: %.200s", record.body)
                return None
            if event.fallback is not None:  # a run's time on its pool is up: nothing else to do for the pool
                fallback.on_timer(self.ports, event)
                return None
            budget = Budget(self.event_calls)
            if event.sweep is not None:
                self.sweep(event.sweep, event.member, budget)
            if event.upstream is not None:
                self.upstream(event.upstream, event.skip, budget, pool=event.pool)
            if event.ended is not None:  # once what waits for it was told (a failure retries the record)
                end = event.ended
                metrics.run_ended(event.pool, end.state, end.reason, end.to_running)
                if event.sweep is None and event.upstream is None:
                    return None  # a slot freed: nothing to launch (idle workers leave by themselves)
            if self.ports.pools.get(event.pool) is None:
                log.warning("ignoring event for unknown pool %s", event.pool)
                return None
            if event.sweep is None and event.upstream is None:
                return self.pool(event.pool)
            try:
                return self.pool(event.pool)
            except RunplaneError as e:
                # what it told is done, and its continuation sent: tried again, it would send another
                # (the schedule dispatches the pool within a period)
                log.warning("pool %s not dispatched after an event it told: %s", event.pool, e)
                return None

        return handle

    def _ports(self, budget: Budget | None) -> Ports:
        return self.ports if budget is None else metered(self.ports, budget)

    def sweep(self, sweep_id: str, member: int | None = None, budget: Budget | None = None) -> None:
        """Move a sweep on once per invocation and member whose end this is. An unknown sweep is
        ignored; a store failure raises (the event is tried again)."""
        if (sweep_id, member) in self.sweeps_moved:
            return
        try:
            sweep_advance.advance(self._ports(budget), sweep_id, member, budget)
        except NotFound:
            log.warning("ignoring event for unknown sweep %.80s", sweep_id)
        self.sweeps_moved.add((sweep_id, member))

    def upstream(self, upstream: str, skip: int = 0, budget: Budget | None = None, *, pool: str | None = None) -> None:
        """A run or sweep (``sweep:<id>``) ended: resolve what waits for it, from the ``skip``-th on,
        while ``budget`` affords the next; an event to the dispatcher carries the rest. A store
        failure raises (the event is tried again)."""
        if (upstream, skip) in self.upstreams_told:
            return
        budget = budget or Budget(self.event_calls)
        waits = self._ports(budget)
        found = dependencies.dependents_of(waits, upstream)
        for place in range(skip, len(found)):
            dependent = found[place]
            first = place == skip  # each event tells one at least, whatever it costs: the chain always moves
            if dependent.startswith(SWEEP_PREFIX):
                if not first and not budget.affords(sweep_advance.LOOK_CALLS + sweep_advance.RELEASE_CALLS):
                    self._go_on(upstream, place, pool)
                    break
                self.sweep(dependent.removeprefix(SWEEP_PREFIX), budget=budget)
                continue
            if not first and not budget.affords(dependencies.RESOLVE_CALLS):
                self._go_on(upstream, place, pool)
                break
            try:
                run = waits.store.get(dependent)
                if not first and not budget.affords(dependencies.resolve_cost(run) - 1):  # read already
                    self._go_on(upstream, place, pool)
                    break
                dependencies.resolve(waits, run)
            except NotFound:
                continue
        self.upstreams_told.add((upstream, skip))

    def _go_on(self, upstream: str, skip: int, pool: str | None) -> None:
        """Leave what waits for ``upstream`` from the ``skip``-th on to an event of its own (on
        ``pool``'s behalf: the pool of the event that told of the end)."""
        if pool is None:
            pool = self.ports.pools.pools[0].name if self.ports.pools.pools else "default"
        self.ports.queue.notify(DispatchEvent(pool=pool, reason="dependents continue", upstream=upstream, skip=skip))

    def schedule(self) -> dict[str, Any]:
        """The scheduled pass: every pool first, then waiting runs (half of ``schedule_calls``) and
        unfinished sweeps (the rest), each going on where the previous pass stopped (kept in the
        ``SCHEDULE_RECORD`` record). What a lost event would have done happens within passes;
        however many waiting runs or sweeps one tenant has, the pools are dispatched. It also keeps
        the record agents check their version against when they register (``skew.publish``)."""
        skew.publish(self.ports)
        pools = self.all_pools()
        try:
            record: PoolRecord | None = self.ports.pool_states.get(SCHEDULE_RECORD)
        except (RunplaneError, ValidationError) as e:  # unreadable: the passes go on from the start
            log.warning("where the last scheduled pass stopped is unknown; starting over: %s", e)
            record = None
        resume = dict(record.resume) if record is not None else {}
        first = Budget(self.schedule_calls // 2)
        waiting = self._waiting_pass(first, resume)
        then = Budget(self.schedule_calls - first.used)
        moved = self._sweeps_pass(then, resume)
        if record is not None and resume != record.resume:
            try:
                self.ports.pool_states.save(record.model_copy(update={"resume": resume}))
            except RunplaneError as e:  # another pass wrote first: the next goes on from where that one stopped
                log.info("where this pass stopped was not kept: %s", e)
        return {"pools": pools, "waiting": waiting, "sweeps": moved, "calls": first.used + then.used}

    def _waiting_pass(self, budget: Budget, resume: dict[str, str]) -> dict[str, int] | dict[str, str]:
        """Waiting runs within ``budget``, from and then to ``resume``'s ``waiting_*``."""
        start = None
        if "waiting_pool" in resume:
            start = dependencies.Mark(resume["waiting_pool"], resume.get("waiting_cursor") or None)
        try:
            done = dependencies.resolve_waiting(self._ports(budget), budget, start)
        except RunplaneError as e:
            return {"error": e.message}
        resume.pop("waiting_pool", None)
        resume.pop("waiting_cursor", None)
        if done.resume is not None:
            resume["waiting_pool"] = done.resume.pool
            if done.resume.cursor:
                resume["waiting_cursor"] = done.resume.cursor
        return done.seen

    def _sweeps_pass(self, budget: Budget, resume: dict[str, str]) -> dict[str, str]:
        """Unfinished sweeps within ``budget``, from and then to ``resume``'s ``sweeps_after``
        (the creation time and id of the last sweep a pass looked at) and ``sweeps_turn`` (the
        round: each round reads the next window of a big sweep's open members)."""
        after: tuple[float, str] | None = None
        created, _, sweep_id = resume.get("sweeps_after", "").partition(" ")
        try:
            after = (float(created), sweep_id) if sweep_id else None
        except ValueError:
            after = None
        turn = resume.get("sweeps_turn", "0")
        try:
            went = sweep_advance.advance_unfinished(
                self._ports(budget), budget, after, int(turn) if turn.isdigit() else 0
            )
        except RunplaneError as e:
            return {"error": e.message}
        resume.pop("sweeps_after", None)
        if went.resume is not None:
            resume["sweeps_after"] = f"{went.resume[0]!r} {went.resume[1]}"
        resume["sweeps_turn"] = str(went.turn)
        return went.moved

    def all_pools(self) -> dict[str, str]:
        """The scheduled pass: every pool, failures reported rather than raised."""
        out = {}
        for pool in self.ports.pools.pools:
            try:
                out[pool.name] = self.pool(pool.name).reason
            except RunplaneError as e:
                out[pool.name] = f"error: {e.message}"
        return out


def run_reaper(ports: Ports, *, time_left: Callable[[], float] | None = None) -> ReapReport:
    """A reaper pass (``reap``), then the retention sweep's (``retention.sweep``, within
    ``time_left``: seconds, the host's), whose failure never takes the reaper's report with it."""
    report = reap(ports)
    try:
        swept = retention.sweep(
            ports, out_of_time=lambda: time_left is not None and time_left() < SWEEP_TIME_LEFT_MARGIN
        )
    except Exception:  # the sweep's own errors are per run; this is what it could not foresee
        log.exception("retention sweep failed; the next pass tries again")
        return report
    report.retention = swept if swept else None
    return report
