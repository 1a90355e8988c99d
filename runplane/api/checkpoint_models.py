"""What the API answers about a run's checkpoint: ``GET /v1/runs/{id}/checkpoint``, its newest
complete checkpoint and its files, a page at a time, each with a download URL."""

from __future__ import annotations

from pydantic import Field

from runplane.api.models import Timestamp, WireModel


class CheckpointFileView(WireModel):
    path: str = Field(description="relative to the checkpoint directory, /-separated")
    size: int = Field(description="bytes")
    mode: int = Field(description="its permission bits (0o644 is 420)")
    url: str = Field(description="a presigned URL that downloads it for a limited time")


class CheckpointPage(WireModel):
    run_id: str = Field(description="the run asked about")
    series: str = Field(description="the run whose series holds the checkpoint (itself, or its from_checkpoint run)")
    seq: int = Field(description="the checkpoint's number in that series")
    attempt: int = Field(description="the attempt that synced it")
    created_at: Timestamp
    total_bytes: int = Field(description="the size of all its files")
    file_count: int = Field(description="how many files it holds")
    dirs: list[str] = Field(description="its directories (on the first page only; empty ones are restored too)")
    files: list[CheckpointFileView]
    next_cursor: str | None = Field(description="pass as cursor for the next page (of the same checkpoint); null: last")
