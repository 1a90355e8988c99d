"""A run's checkpoint: the files of its newest complete checkpoint, a page at a time, each with a
download URL (docs/checkpoints.md)."""

from __future__ import annotations

from pydantic import Field

from runplane.api.checkpoint_models import CheckpointFileView, CheckpointPage
from runplane.api.models import timestamp
from runplane.api.routes.common import BAD_CURSOR, CURSOR_HELP, CURSOR_PATTERN, RUN_ID
from runplane.api.routing import Answer, Call, Query, operation
from runplane.domain import errors
from runplane.services.checkpoints import MAX_CHECKPOINT_PAGE, checkpoint_page


class CheckpointQuery(Query):
    limit: int = Field(MAX_CHECKPOINT_PAGE, ge=1, le=MAX_CHECKPOINT_PAGE)
    cursor: str | None = Field(None, description=CURSOR_HELP, json_schema_extra={"pattern": CURSOR_PATTERN})


@operation(
    "GET",
    "/v1/runs/{run_id}/checkpoint",
    operation_id="readCheckpoint",
    summary="The files of a run's newest checkpoint with download URLs, a page at a time",
    scope="runs:read",
    path_params=RUN_ID,
    query=CheckpointQuery,
    answers={200: Answer(CheckpointPage)},
    valid_refusals={
        errors.NotFound: "the run has no checkpoint yet (nor one it starts from)",
        errors.BadRequest: BAD_CURSOR + " (or of another run)",
        errors.Conflict: "the checkpoint a cursor goes on with is no longer kept (a newer one replaced it): list "
        "again from the start",
    },
)
def checkpoint(call: Call, run_id: str, query: CheckpointQuery) -> CheckpointPage:
    part = checkpoint_page(call.ports, call.principal, run_id, query.cursor, query.limit)
    manifest = part.manifest
    files = [
        CheckpointFileView(path=f.path, size=f.size, mode=f.mode, url=url)
        for f, url in zip(part.files, part.urls, strict=True)
    ]
    return CheckpointPage(
        run_id=part.run.id,
        series=manifest.series,
        seq=manifest.seq,
        attempt=manifest.attempt,
        created_at=timestamp(manifest.created_at),
        total_bytes=manifest.total_bytes,
        file_count=len(manifest.files),
        dirs=[d.path for d in manifest.dirs] if part.first else [],
        files=files,
        next_cursor=part.next_cursor,
    )
