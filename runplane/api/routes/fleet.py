"""The fleet: pools with their backlog and workers, and the workers themselves."""

from __future__ import annotations

from pydantic import Field

from runplane.api.models import PoolList, WorkerList
from runplane.api.routes.common import BAD_CURSOR
from runplane.api.routing import Answer, Call, Query, operation
from runplane.api.views import pool_view, worker_view
from runplane.domain import errors
from runplane.domain.common import NAME_PATTERN
from runplane.services.overview import WORKER_CURSOR_PATTERN, pool_figures, workers_page

MAX_WORKERS_PAGE = 100
"""The workers a page holds unless ``?limit=`` says otherwise."""


@operation(
    "GET",
    "/v1/pools",
    operation_id="listPools",
    summary="Pools with backlog, workers (as the dispatcher last counted them) and launches",
    scope="runs:read",
    answers={200: Answer(PoolList)},
)
def pools(call: Call) -> PoolList:
    return PoolList(
        pools=[pool_view(f.pool, f.backlog, f.workers, f.record, f.stack_retention) for f in pool_figures(call.ports)]
    )


class WorkersQuery(Query):
    pool: str | None = Field(None, description="only this pool's", pattern=NAME_PATTERN)
    limit: int = Field(MAX_WORKERS_PAGE, ge=1, le=500, description=f"default {MAX_WORKERS_PAGE}")
    cursor: str | None = Field(
        None, description="the next_cursor of the previous page", json_schema_extra={"pattern": WORKER_CURSOR_PATTERN}
    )
    messages = {"pool": "pool must be a pool name: lowercase letters, digits and '-'"}


@operation(
    "GET",
    "/v1/workers",
    operation_id="listWorkers",
    summary="Workers and their last heartbeat (run ids: only your own runs'), a page at a time",
    scope="runs:read",
    query=WorkersQuery,
    answers={200: Answer(WorkerList)},
    valid_refusals={errors.BadRequest: BAD_CURSOR},
)
def workers(call: Call, query: WorkersQuery) -> WorkerList:
    found, cursor = workers_page(call.ports, call.principal, query.pool, query.limit, query.cursor)
    return WorkerList(workers=[worker_view(w) for w in found], next_cursor=cursor)
