"""Condition expressions of the runs table's conditional writes: what ``Expect`` asks of the stored
run, and what a move holds the stored run to."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any

from runplane.domain.expect import Expect
from runplane.domain.runs import Run


def expect_conditions(expect: Expect, names: dict[str, str], values: dict[str, Any]) -> builtins.list[str]:
    """The condition expressions of ``expect`` (its names and values added to ``names``, ``values``)."""
    conditions: builtins.list[str] = []
    if expect.states is not None:
        names["#state"] = "state"
        keys = []
        for i, state in enumerate(sorted(expect.states)):
            values[f":s{i}"] = {"S": str(state)}
            keys.append(f":s{i}")
        conditions.append(f"#state IN ({', '.join(keys)})")
    if expect.attempt is not None:
        names["#attempt"] = "attempt"
        values[":attempt"] = {"N": str(expect.attempt)}
        conditions.append("#attempt = :attempt")
    if expect.worker_id is not None:
        names["#worker"] = "worker_id"
        values[":worker"] = {"S": expect.worker_id}
        conditions.append("#worker = :worker")
    if expect.unkilled:
        names["#killed"] = "kill_requested"
        values[":killed"] = {"BOOL": True}
        conditions.append("(attribute_not_exists(#killed) OR #killed <> :killed)")
    if expect.waiting is not None:
        names["#waits"] = "waiting_on"
        values[":nothing"] = {"N": "0"}
        waits = "(attribute_exists(#waits) AND size(#waits) > :nothing)"
        conditions.append(waits if expect.waiting else f"NOT {waits}")
    if expect.queue is not None:
        names["#xqueue"] = "queue"
        values[":xqueue"] = {"S": expect.queue}
        conditions.append("#xqueue = :xqueue")
    return conditions


def filed_as(run: Run, changes: Mapping[str, Any], names: dict[str, str], values: dict[str, Any]) -> builtins.list[str]:
    """Conditions that hold a move to the state and waits of ``run`` that ``changes`` leave: what
    the moved run is filed under (``qs``) derives from them."""
    conditions: builtins.list[str] = []
    if "state" not in changes:
        names["#mstate"] = "state"
        values[":mstate"] = {"S": str(run.state)}
        conditions.append("#mstate = :mstate")
    if "waiting_on" not in changes:
        names["#mwaits"] = "waiting_on"
        values[":mnone"] = {"N": "0"}
        waits = "(attribute_exists(#mwaits) AND size(#mwaits) > :mnone)"
        conditions.append(waits if run.waiting_on else f"NOT {waits}")
    return conditions
