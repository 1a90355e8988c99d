"""What the routes of several resources share: path parameters, cursors and examples' helpers."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from runplane.api.routing import PathParam, Query
from runplane.domain.common import RUN_ID_PATTERN
from runplane.services.watch import MAX_WAIT_SECONDS, REVISION_PATTERN

ID_PATTERN = f"^{RUN_ID_PATTERN}$"
RUN_ID = {"run_id": PathParam(ID_PATTERN, "run", "the run's id")}
SWEEP_ID = {"sweep_id": PathParam(ID_PATTERN, "sweep", "the sweep's id")}

CURSOR_PATTERN = r"^[A-Za-z0-9_=-]{1,4096}$"
"""What every ``next_cursor`` looks like (base64url, or a member's index)."""
CURSOR_HELP = "the next_cursor of the previous page"
BAD_CURSOR = "a cursor of that form that is not the next_cursor of a page of this listing"

LOCATION = {"Location": "the address of what was made"}


class WatchQuery(Query):
    """A read that may wait for a change (``runplane.services.watch``)."""

    wait: float = Field(
        0,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description=f"seconds (0 to {MAX_WAIT_SECONDS}, fractions too) to hold the answer until it changes from "
        "since; unchanged at the end, the same answer comes (ask again)",
    )
    since: str | None = Field(
        None,
        pattern=REVISION_PATTERN,
        description="the revision of the answer you last had; absent, a wait is for a change from how it is now",
    )
    messages: ClassVar = {"since": "since must be the revision of an earlier answer, not {value}"}
