"""Cloud-agnostic glue for the dispatcher and reaper entrypoints: events in, services called."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from runplane import metrics
from runplane.bootstrap import Stack
from runplane.domain.errors import InvalidRequest, NotFound, RunplaneError
from runplane.domain.models import SWEEP_PREFIX, DispatchEvent
from runplane.services import dependencies, sweeps
from runplane.services.dispatch import Decision, DispatchPorts, PoolFigures, dispatch_pool
from runplane.services.reap import ReapReport, reap

log = logging.getLogger(__name__)


class PoolDispatcher:
    """Dispatches each pool at most once per invocation, however many events name it."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.results: dict[str, Decision | RunplaneError] = {}
        self.sweeps_moved: set[str] = set()
        self.upstreams_told: set[str] = set()

    def pool(self, name: str) -> Decision:
        if name not in self.results:
            pool = self.stack.pools.get(name)
            if pool is None:
                raise InvalidRequest(f"unknown pool {name!r}")
            try:
                ports = DispatchPorts(
                    self.stack.store, self.stack.workers, self.stack.pool_states, self.stack.backend(pool)
                )
                self.results[name] = dispatch_pool(
                    pool,
                    ports,
                    self.stack.agent_args(pool),
                    self.stack.clock(),
                    self.stack.settings.worker_stale_seconds,
                )
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
        """For a batch processor: one queue record (``.body``) -> dispatch its pool."""

        def handle(record: Any) -> Decision | None:
            try:
                event = DispatchEvent.model_validate_json(record.body)
            except ValidationError:
                log.warning("ignoring unreadable dispatcher event: %.200s", record.body)
                return None
            if event.sweep is not None:
                self.sweep(event.sweep)
            if event.upstream is not None:
                self.upstream(event.upstream)
            if event.ended is not None:  # once what waits for it was told (a failure retries the record)
                end = event.ended
                metrics.run_ended(event.pool, end.state, end.reason, end.to_running)
                if event.sweep is None and event.upstream is None:
                    return None  # a slot freed: nothing to launch (idle workers leave by themselves)
            if self.stack.pools.get(event.pool) is None:
                log.warning("ignoring event for unknown pool %s", event.pool)
                return None
            return self.pool(event.pool)

        return handle

    def sweep(self, sweep_id: str) -> None:
        """Move a sweep on once per invocation (a member of it ended). An unknown sweep is
        ignored; a store failure raises (the event is tried again)."""
        if sweep_id in self.sweeps_moved:
            return
        try:
            sweeps.advance(self.stack.sweep_ports, sweep_id)
        except NotFound:
            log.warning("ignoring event for unknown sweep %.80s", sweep_id)
        self.sweeps_moved.add(sweep_id)

    def upstream(self, upstream: str) -> None:
        """A run or sweep (``sweep:<id>``) ended: resolve what waits for it, once per invocation.
        A store failure raises (the event is tried again)."""
        if upstream in self.upstreams_told:
            return
        ports = self.stack.sweep_ports.waits
        for dependent in dependencies.dependents_of(ports, upstream):
            if dependent.startswith(SWEEP_PREFIX):
                self.sweep(dependent.removeprefix(SWEEP_PREFIX))
                continue
            try:
                dependencies.resolve(ports, dependent)
            except NotFound:
                continue
        self.upstreams_told.add(upstream)

    def all_waiting(self) -> dict[str, int] | dict[str, str]:
        """The scheduled pass over waiting runs (what a lost event would have done)."""
        try:
            return dependencies.resolve_waiting(self.stack.sweep_ports.waits)
        except RunplaneError as e:
            return {"error": e.message}

    def all_sweeps(self) -> dict[str, str]:
        """The scheduled pass over unfinished sweeps (what a lost event would have done)."""
        try:
            return sweeps.advance_unfinished(self.stack.sweep_ports)
        except RunplaneError as e:
            return {"error": e.message}

    def all_pools(self) -> dict[str, str]:
        """The scheduled pass: every pool, failures reported rather than raised."""
        out = {}
        for pool in self.stack.pools.pools:
            try:
                out[pool.name] = self.pool(pool.name).reason
            except RunplaneError as e:
                out[pool.name] = f"error: {e.message}"
        return out


def run_reaper(stack: Stack) -> ReapReport:
    return reap(
        stack.store, stack.queue, stack.pools, stack.clock(), stack.settings.rehint_seconds, quotas=stack.quotas
    )
