"""Runs: submit, list, read, kill, reprioritise, keep, and read logs and outputs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from runplane.api.models import LogPage, OutputFile, OutputPage, RunPage, RunView
from runplane.api.pages import page_reply
from runplane.api.requests import KeepRequest, SetPriority
from runplane.api.routes.common import (
    BAD_CURSOR,
    CURSOR_HELP,
    CURSOR_PATTERN,
    ID_PATTERN,
    LOCATION,
    RUN_ID,
    WatchQuery,
)
from runplane.api.routes.examples import KEEP_EXAMPLES, PRIORITY_403, PRIORITY_EXAMPLES, RUN_EXAMPLES
from runplane.api.routing import Answer, Call, Query, Reply, operation
from runplane.api.views import run_view
from runplane.domain import errors
from runplane.domain.common import NAME_PATTERN
from runplane.domain.runs import LABEL_KEY_PATTERN, MAX_LABEL_VALUE, RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import USER_PATTERN
from runplane.metrics import emit
from runplane.services import listings, retention, runs, watch
from runplane.services.logs import MAX_OUTPUTS_PAGE
from runplane.services.overview import run_logs, run_outputs


@operation(
    "POST",
    "/v1/runs",
    operation_id="submitRun",
    summary="Submit a run",
    scope="runs:write",
    body=RunSpec,
    examples=RUN_EXAMPLES,
    idempotency="a retry with the same key and body returns the same run (200)",
    answers={
        201: Answer(RunView, headers=LOCATION),
        200: Answer(RunView, "replayed: the run this Idempotency-Key made", LOCATION),
    },
    raises=(errors.NotFound, errors.Conflict, errors.PayloadTooLarge),
    notes={403: PRIORITY_403},
    valid_refusals={
        errors.NotFound: "an input, after or from_checkpoint names a run that does not exist (or another user's), "
        "or a secret that does not exist (or is not the caller's to use), or an upload the caller did not upload",
        errors.Conflict: "the Idempotency-Key was used for another request, or from_checkpoint names a run with no "
        "checkpoint yet",
        errors.PayloadTooLarge: "the run's spec is too large, or an upload it names is over max_upload_bytes",
        errors.Unschedulable: "no pool can fit it, or it waits for a run that ended without success",
        errors.UnknownName: "a queue that is no configured pool",
        errors.NotAllowed: "a bucket it reads is not allowed, a group that is not the caller's, a quota or cap, or "
        "a pool to fall back to that does not exist or cannot take it",
    },
)
def submit(call: Call, body: RunSpec, key: str | None) -> Reply:
    result = runs.submit_run(call.ports, call.principal, body, key)
    if result.created:
        emit("RunsSubmitted", 1, "api")
    headers = {"Location": f"/v1/runs/{result.run.id}"}
    return Reply(run_view(call.ports, result.run), 201 if result.created else 200, headers)


LABEL_FILTER_PATTERN = f"{LABEL_KEY_PATTERN.removesuffix('$')}=.{{0,{MAX_LABEL_VALUE}}}$"


class RunsQuery(Query):
    state: RunState | None = None
    queue: str | None = Field(None, description="only this pool's", json_schema_extra={"pattern": NAME_PATTERN})
    owner: str | None = Field(
        None, description="another user's runs (admins only)", json_schema_extra={"pattern": USER_PATTERN}
    )
    sweep: str | None = Field(
        None,
        description="the members of this sweep released so far, in index order (with owner or queue: those of "
        "theirs, none when the sweep's are others)",
        json_schema_extra={"pattern": ID_PATTERN},
    )
    label: str | None = Field(
        None,
        description="only runs with this label, key=value (a page may come back short, even empty, with a "
        "cursor to go on)",
        json_schema_extra={"pattern": LABEL_FILTER_PATTERN},
    )
    limit: int = Field(50, ge=1, le=500)
    cursor: str | None = Field(None, description=CURSOR_HELP, json_schema_extra={"pattern": CURSOR_PATTERN})
    messages = {"state": f"unknown state {{value}}; states are {[s.value for s in RunState]}"}


@operation(
    "GET",
    "/v1/runs",
    operation_id="listRuns",
    summary="List your runs (an admin: anyone's), newest first; pages stay under 5 MB",
    scope="runs:read",
    query=RunsQuery,
    answers={200: Answer(RunPage)},
    raises=(errors.NotFound,),
    valid_refusals={
        errors.BadRequest: BAD_CURSOR,
        errors.NotFound: "no such sweep, or another user's",
    },
)
def list_runs(call: Call, query: RunsQuery) -> Reply:
    page = listings.runs_page(
        call.ports, call.principal, owner=query.owner, state=query.state, queue=query.queue, sweep=query.sweep,
        label=query.label, limit=query.limit, cursor=query.cursor,
    )  # fmt: skip
    return page_reply(_run_page, [run_view(call.ports, r) for r in page.items], page.next_cursor, page.resume)


def _run_page(views: list[RunView], cursor: str | None) -> RunPage:
    return RunPage(runs=views, next_cursor=cursor)


@operation(
    "GET",
    "/v1/runs/{run_id}",
    operation_id="getRun",
    summary="One run; a queued one says why it waits. With wait and since: as soon as it changes",
    scope="runs:read",
    path_params=RUN_ID,
    query=WatchQuery,
    answers={200: Answer(RunView)},
)
def get_run(call: Call, run_id: str, query: WatchQuery) -> RunView:
    run, reason = watch.watched_run(call.ports, call.principal, run_id, query.since, query.wait)
    return run_view(call.ports, run, waiting_reason=reason)


@operation(
    "POST",
    "/v1/runs/{run_id}/kill",
    operation_id="killRun",
    summary="Kill a run: a queued one at once, a running one within seconds",
    scope="runs:write",
    path_params=RUN_ID,
    answers={202: Answer(RunView)},
    raises=(errors.Conflict,),
)
def kill(call: Call, run_id: str) -> RunView:
    return run_view(call.ports, runs.kill_and_release(call.ports, call.principal, run_id))


@operation(
    "POST",
    "/v1/runs/{run_id}/priority",
    operation_id="setRunPriority",
    summary="Change a queued run's priority (a user: up to the pool's max_user_priority)",
    scope="runs:write",
    path_params=RUN_ID,
    body=SetPriority,
    examples=PRIORITY_EXAMPLES,
    answers={200: Answer(RunView, "changed; the run as it is now")},
    raises=(errors.Conflict,),
    notes={403: PRIORITY_403 + ", or its owner is no longer in the group it is charged to or allowed its inputs"},
    valid_refusals={
        errors.Conflict: "the run is no longer queued",
        errors.NotAllowed: "the run's group or inputs are no longer allowed to its owner",
    },
)
def set_priority(call: Call, run_id: str, body: SetPriority) -> RunView:
    return run_view(call.ports, runs.set_priority(call.ports, call.principal, run_id, body.priority))


@operation(
    "POST",
    "/v1/runs/{run_id}/keep",
    operation_id="keepRun",
    summary="Keep a run (its outputs, logs and record outlive its pool's retention) or let it go",
    scope="runs:write",
    path_params=RUN_ID,
    body=KeepRequest,
    examples=KEEP_EXAMPLES,
    answers={200: Answer(RunView, "the run as it is now; its retention says whether it is kept")},
)
def keep(call: Call, run_id: str, body: KeepRequest) -> RunView:
    return run_view(call.ports, retention.keep(call.ports, call.principal, run_id, body.keep))


ATTEMPT_HELP = "which attempt's (1 to the run's attempt; default: the latest)"


class LogsQuery(Query):
    stream: Literal["stdout", "stderr"] = "stdout"
    offset: int = Field(0, ge=0, le=2**62)
    attempt: int | None = Field(None, description=ATTEMPT_HELP, json_schema_extra={"minimum": 1})
    messages = {"stream": "stream must be stdout or stderr"}


@operation(
    "GET",
    "/v1/runs/{run_id}/logs",
    operation_id="readLogs",
    summary="Read stdout or stderr from an offset, also while the run goes",
    scope="runs:read",
    path_params=RUN_ID,
    query=LogsQuery,
    answers={200: Answer(LogPage)},
    valid_refusals={errors.InvalidRequest: "an attempt the run has not had"},
)
def logs(call: Call, run_id: str, query: LogsQuery) -> LogPage:
    page = run_logs(call.ports, call.principal, run_id, query.stream, query.offset, query.attempt)
    return LogPage(data=page.data, next_offset=page.next_offset, complete=page.complete)


class OutputsQuery(Query):
    limit: int = Field(MAX_OUTPUTS_PAGE, ge=1, le=MAX_OUTPUTS_PAGE)
    cursor: str | None = Field(None, description=CURSOR_HELP, json_schema_extra={"pattern": CURSOR_PATTERN})
    attempt: int | None = Field(None, description=ATTEMPT_HELP, json_schema_extra={"minimum": 1})


@operation(
    "GET",
    "/v1/runs/{run_id}/outputs",
    operation_id="listOutputs",
    summary="Output files with download URLs, a page at a time",
    scope="runs:read",
    path_params=RUN_ID,
    query=OutputsQuery,
    answers={200: Answer(OutputPage)},
    valid_refusals={
        errors.BadRequest: BAD_CURSOR + " (or of another attempt)",
        errors.InvalidRequest: "an attempt the run has not had",
    },
)
def outputs(call: Call, run_id: str, query: OutputsQuery) -> OutputPage:
    page, over = run_outputs(call.ports, call.principal, run_id, query.cursor, query.limit, query.attempt)
    files = [OutputFile.model_validate(f) for f in page.files]
    return OutputPage(files=files, next_cursor=page.next_cursor, complete=over)
