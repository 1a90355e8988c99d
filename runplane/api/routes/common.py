"""What the routes of several resources share: path parameters, cursors and examples' helpers."""

from __future__ import annotations

from runplane.api.routing import PathParam
from runplane.domain.common import RUN_ID_PATTERN

ID_PATTERN = f"^{RUN_ID_PATTERN}$"
RUN_ID = {"run_id": PathParam(ID_PATTERN, "run", "the run's id")}
SWEEP_ID = {"sweep_id": PathParam(ID_PATTERN, "sweep", "the sweep's id")}

CURSOR_PATTERN = r"^[A-Za-z0-9_=-]{1,4096}$"
"""What every ``next_cursor`` looks like (base64url, or a member's index)."""
CURSOR_HELP = "the next_cursor of the previous page"
BAD_CURSOR = "a cursor of that form that is not the next_cursor of a page of this listing"

LOCATION = {"Location": "the address of what was made"}
