"""Sweeps: make, list, read, widen or narrow, kill and retry."""

from __future__ import annotations

from pydantic import Field

from runplane.api.models import SweepPage, SweepRetried, SweepView
from runplane.api.pages import page_reply
from runplane.api.requests import SweepPatch
from runplane.api.routes.common import BAD_CURSOR, CURSOR_HELP, CURSOR_PATTERN, LOCATION, SWEEP_ID, WatchQuery
from runplane.api.routes.examples import PRIORITY_403, RELEASE_403, SWEEP_EXAMPLES
from runplane.api.routing import Answer, Call, Query, Reply, operation
from runplane.api.views import sweep_view
from runplane.domain import errors
from runplane.domain.sweeps import SweepSpec
from runplane.domain.tenancy import USER_PATTERN
from runplane.metrics import emit
from runplane.services import listings, shown_sweeps, watch


@operation(
    "POST",
    "/v1/sweeps",
    operation_id="createSweep",
    summary="Make a sweep: one run per point of a parameter grid (times count), up to 10,000",
    scope="runs:write",
    body=SweepSpec,
    examples=SWEEP_EXAMPLES,
    idempotency="a retry with the same key and body returns the same sweep (200)",
    answers={
        201: Answer(SweepView, headers=LOCATION),
        200: Answer(SweepView, "replayed: the sweep this Idempotency-Key made", LOCATION),
    },
    raises=(errors.NotFound, errors.Conflict),
    notes={403: PRIORITY_403},
    valid_refusals={
        errors.NotFound: "an input or after names a run that does not exist (or another user's), or a secret "
        "that does not exist (or is not the caller's to use), or an upload the caller did not upload",
        errors.Conflict: "the Idempotency-Key was used for another request",
        errors.PayloadTooLarge: "its largest member's spec is too large, or an upload named is over max_upload_bytes",
        errors.Unschedulable: "no pool can fit its members, or they wait for a run that ended without success",
        errors.UnknownName: "a queue that is no configured pool",
        errors.NotAllowed: "a bucket they read is not allowed, a group that is not the caller's, too many open sweeps",
    },
)
def create_sweep(call: Call, body: SweepSpec, key: str | None) -> Reply:
    shown = shown_sweeps.create(call.ports, call.principal, body, key)
    if shown.created:
        emit("SweepsCreated", 1, "api")
    headers = {"Location": f"/v1/sweeps/{shown.sweep.id}"}
    return Reply(sweep_view(shown), 201 if shown.created else 200, headers)


class SweepsQuery(Query):
    owner: str | None = Field(
        None, description="another user's sweeps (admins only)", json_schema_extra={"pattern": USER_PATTERN}
    )
    limit: int = Field(20, ge=1, le=100)
    cursor: str | None = Field(None, description=CURSOR_HELP, json_schema_extra={"pattern": CURSOR_PATTERN})


@operation(
    "GET",
    "/v1/sweeps",
    operation_id="listSweeps",
    summary="Your sweeps (an admin: anyone's), newest first, counted as last recorded",
    scope="runs:read",
    query=SweepsQuery,
    answers={200: Answer(SweepPage)},
    valid_refusals={errors.BadRequest: BAD_CURSOR},
)
def list_sweeps(call: Call, query: SweepsQuery) -> Reply:
    page = listings.sweeps_page(call.ports, call.principal, owner=query.owner, limit=query.limit, cursor=query.cursor)
    # a sweep's spec may be large: its page is held to the budget too
    return page_reply(_sweep_page, [sweep_view(s) for s in page.items], page.next_cursor, page.resume)


def _sweep_page(views: list[SweepView], cursor: str | None) -> SweepPage:
    return SweepPage(sweeps=views, next_cursor=cursor)


@operation(
    "GET",
    "/v1/sweeps/{sweep_id}",
    operation_id="getSweep",
    summary="One sweep: members by state and failure reason. With wait and since: as soon as its record changes",
    scope="runs:read",
    path_params=SWEEP_ID,
    query=WatchQuery,
    answers={200: Answer(SweepView)},
)
def get_sweep(call: Call, sweep_id: str, query: WatchQuery) -> SweepView:
    return sweep_view(watch.watched_sweep(call.ports, call.principal, sweep_id, query.since, query.wait))


@operation(
    "PATCH",
    "/v1/sweeps/{sweep_id}",
    operation_id="updateSweep",
    summary="Change max_parallel while the sweep goes",
    scope="runs:write",
    path_params=SWEEP_ID,
    body=SweepPatch,
    examples={"four": {"summary": "4 at once", "value": {"max_parallel": 4}}},
    answers={200: Answer(SweepView)},
    raises=(errors.Conflict,),
    notes={403: RELEASE_403},
    valid_refusals={errors.Conflict: "the sweep has ended"},
)
def patch_sweep(call: Call, sweep_id: str, body: SweepPatch) -> SweepView:
    return sweep_view(shown_sweeps.set_max_parallel(call.ports, call.principal, sweep_id, body.max_parallel))


@operation(
    "POST",
    "/v1/sweeps/{sweep_id}/kill",
    operation_id="killSweep",
    summary="End every unfinished member (running ones within seconds)",
    scope="runs:write",
    path_params=SWEEP_ID,
    answers={202: Answer(SweepView)},
    raises=(errors.Conflict,),
)
def kill_sweep(call: Call, sweep_id: str) -> SweepView:
    return sweep_view(shown_sweeps.kill(call.ports, call.principal, sweep_id))


@operation(
    "POST",
    "/v1/sweeps/{sweep_id}/retry",
    operation_id="retrySweep",
    summary="Run again the members whose latest try failed, was killed or timed out",
    scope="runs:write",
    path_params=SWEEP_ID,
    answers={200: Answer(SweepRetried)},
    raises=(errors.Conflict, errors.PayloadTooLarge),
    notes={403: RELEASE_403},
)
def retry_sweep(call: Call, sweep_id: str) -> SweepRetried:
    shown = shown_sweeps.retry(call.ports, call.principal, sweep_id)
    return SweepRetried(**sweep_view(shown).model_dump(), retried=shown.retried)
