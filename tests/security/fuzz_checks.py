"""The schemathesis check test_fuzz.py adds (loaded through SCHEMATHESIS_HOOKS): a request the
document calls valid is refused only as its operation says it may be. Beyond the answers any
request may get (401, 403, 404, 409), a 4xx must carry a status and an error code its operation
lists in ``x-valid-refusals`` (422 ``unschedulable``, say), so a refusal for the request's shape (422
``invalid_request``) of a request the document allows fails even where a semantic 422 is valid.

A waiting read's ``wait`` (0 to 20 seconds) is held to WAIT_CAP seconds when it is a number in its
bounds: a read of a run the fuzzer made would otherwise hold each case up to 20 s, the request
timeout. Out of bounds or of the wrong type it is sent as generated, and refused as it must be
(tests/integration/test_long_poll.py covers whole waits)."""

from typing import Any

import schemathesis
from schemathesis.specs.openapi.checks import is_unexpected_http_status_case

ANY_REQUEST = {401, 403, 404, 409}
WAIT_CAP = 0.2


@schemathesis.hook
def map_query(ctx: Any, query: Any) -> Any:
    wait = query.get("wait") if isinstance(query, dict) else None
    if isinstance(wait, int | float) and not isinstance(wait, bool) and WAIT_CAP < wait <= 20:
        query = {**query, "wait": WAIT_CAP}
    return query


@schemathesis.check
def refused_only_as_documented(ctx: Any, response: Any, case: Any) -> bool | None:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or is_unexpected_http_status_case(case):
        return None
    status = response.status_code
    if not 400 <= status < 500 or status in ANY_REQUEST:
        return None
    try:
        error = response.json()["error"]
        code, message = error["code"], error["message"]
    except (ValueError, KeyError, TypeError):
        code, message = None, response.text[:300]
    refusals = case.operation.definition.raw.get("x-valid-refusals", [])
    if not any(r.get("status") == status and r.get("code") == code for r in refusals):
        valid = ", ".join(f"{r.get('status')} {r.get('code')}" for r in refusals) or "none"
        raise AssertionError(
            f"a request the document calls valid was refused {status} {code}: {message}\n"
            f"the refusals this operation documents for valid requests: {valid}"
        )
    return None
