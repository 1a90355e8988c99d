"""DynamoDB runs: one table keyed by ``id``, every change a conditional write."""

from __future__ import annotations

import base64
import builtins
import json
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from runplane.adapters.aws.clients import error_code
from runplane.adapters.aws.conditions import expect_conditions, filed_as
from runplane.adapters.aws.dynamodb import (
    BY_OWNER,
    BY_PURGE,
    BY_QUEUE_STATE,
    BY_RANK,
    PURGE_DUE,
    PURGE_QUEUE,
    fields,
    key_cursor,
    start_key,
    to_dynamo,
    translate,
)
from runplane.adapters.aws.purges import PURGE_SOURCES, purge_index
from runplane.adapters.aws.resources import RUNS_TTL_ATTRIBUTE
from runplane.adapters.records import check_changes, jsonable, record
from runplane.domain.errors import AlreadyExists, BackendError, ConditionFailed, Conflict, NotFound
from runplane.domain.expect import Expect
from runplane.domain.ranks import rank_key, rank_prefix
from runplane.domain.records import MAX_RUN_EVENTS, add_event, bound_changes
from runplane.domain.retention import purge_due, ttl_at
from runplane.domain.runs import (
    MAX_DEPENDENTS,
    WAITING,
    Event,
    Run,
    RunSpec,
    listed_state,
    run_rank,
)
from runplane.domain.states import RunState
from runplane.ports import LIST_BUDGET, Page


def _qs(queue: str, state: RunState | str) -> str:
    return f"{queue}#{state}"


_STORAGE = ("qs", "rank", PURGE_QUEUE, PURGE_DUE, RUNS_TTL_ATTRIBUTE)
"""The attributes of a run's item that only the store reads: keys of its indexes, its TTL."""


MAX_TIMELINE_TRIES = 20
"""How often a write whose run's full timeline changed under it reads it again and tries again."""


class _TimelineMoved(Exception):
    """A run's timeline changed between its read and a write that replaces it whole, or a field its
    retention index derives from changed between its read and a write that derives it again."""

    def __init__(self, current: Run) -> None:
        super().__init__(current.id)
        self.current = current


class DynamoRunStore:
    """Runs in one table keyed by ``id``, with three indexes: by owner, by queue+state (newest
    first) and by rank (queue+state, then ``rank``: ``run_rank`` of the run, the order a pool's
    queued runs start in)."""

    def __init__(self, table: str, client: Any, list_budget: int = LIST_BUDGET) -> None:
        self.table = table
        self.client = client
        self.list_budget = list_budget

    def _item(self, run: Run) -> dict[str, Any]:
        data = jsonable(run)
        data["qs"] = _qs(run.queue, listed_state(run))
        data["rank"] = run_rank(run)
        if (due := purge_due(run)) is not None:
            data[PURGE_QUEUE], data[PURGE_DUE] = run.queue, due
        if (expires := ttl_at(run)) is not None:
            data[RUNS_TTL_ATTRIBUTE] = expires
        return {k: to_dynamo(v) for k, v in data.items()}

    @staticmethod
    def _run(item: Mapping[str, Any]) -> Run:
        return fields(Run, item, *_STORAGE)

    def create(self, run: Run) -> Run:
        try:
            self.client.put_item(
                TableName=self.table,
                Item=self._item(run),
                ConditionExpression="attribute_not_exists(id)",
            )
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                raise AlreadyExists(f"run {run.id} exists", run=self.get(run.id)) from e
            raise translate(e, "store run") from e
        except BotoCoreError as e:
            raise translate(e, "store run") from e
        return run

    def get(self, run_id: str) -> Run:
        try:
            resp = self.client.get_item(TableName=self.table, Key={"id": {"S": run_id}}, ConsistentRead=True)
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "read run") from e
        if "Item" not in resp or "kind" in resp["Item"]:  # a sweep's record shares the table
            raise NotFound(f"run {run_id} not found")
        return self._run(resp["Item"])

    def update(self, run: Run, expect: Expect, changes: Mapping[str, Any], event: Event | None = None) -> Run:
        check_changes(changes)
        return self._write(run, expect, None, bound_changes(changes), event)

    def move(self, run: Run, expect: Expect, queue: str, changes: Mapping[str, Any], event: Event | None = None) -> Run:
        check_changes(changes)
        return self._write(run, expect, queue, bound_changes(changes), event)

    def _write(self, run: Run, expect: Expect, queue: str | None, bounded: dict[str, Any], event: Event | None) -> Run:
        """``update`` (``queue`` None) or ``move``: the conditional write, tried again on a copy read
        anew while only what the write derives from the copy (its timeline, its queue and what the
        run is filed under, what the retention index derives from) changed under it."""
        if event is not None and "events" in bounded:  # a timeline given whole: the event goes last
            bounded["events"], event = add_event(bounded["events"], event), None
        seen, left = run.events, run.queue
        for _ in range(MAX_TIMELINE_TRIES):
            try:
                return self._update(run, expect, bounded, event, seen, queue)
            except _TimelineMoved as moved:
                seen = moved.current.events
                run = moved.current
                if queue is not None and run.queue != left:  # a move is from the pool its copy names
                    raise ConditionFailed(f"run {run.id} is on pool {run.queue}, not {left}", run=run) from None
        raise BackendError(f"update run {run.id}: {MAX_TIMELINE_TRIES} concurrent writes won over this one; retry")

    def _update(
        self,
        run: Run,
        expect: Expect,
        changes: Mapping[str, Any],
        event: Event | None,
        seen: builtins.list[Event],
        queue: str | None = None,
    ) -> Run:
        """One conditional write of ``changes`` and ``event``, where ``seen`` is the run's timeline
        as last read. Below ``MAX_RUN_EVENTS`` the event is appended; at it, the timeline is written
        whole (``add_event``), on the condition that it is still the one read. With ``queue``, the
        run moves to that pool: ``queue``, ``qs`` and ``pq`` are written anew from ``run``, on the
        condition that what they derive from is still as in ``run``. Every write that derives keys
        from ``run.queue`` holds the stored queue to it, so a copy from before a move never files a
        run under the pool it left. Raises _TimelineMoved when only those conditions failed,
        ConditionFailed when ``expect`` does not hold."""
        names: dict[str, str] = {"#id": "id"}
        values: dict[str, Any] = {}
        sets: list[str] = []
        conditions = ["attribute_exists(#id)", *expect_conditions(expect, names, values)]
        for i, (field, value) in enumerate(changes.items()):
            names[f"#f{i}"] = field
            values[f":v{i}"] = to_dynamo(jsonable(value))
            sets.append(f"#f{i} = :v{i}")
        filed_in = run.queue if queue is None else queue
        derives = queue is not None or any(field in changes for field in ("state", "waiting_on", *PURGE_SOURCES))
        if derives:
            names["#queue"] = "queue"
            values[":rq"] = {"S": run.queue}
            conditions.append("#queue = :rq")
        if queue is not None:
            values[":nq"] = {"S": queue}
            sets.append("#queue = :nq")
            conditions += filed_as(run, changes, names, values)
        if queue is not None or "state" in changes or "waiting_on" in changes:
            # a queued run that still waits for others is filed apart from the line (a change of
            # ``waiting_on`` alone is made only to a queued run: its write expects that state)
            filed = run.model_copy(update={k: changes[k] for k in ("state", "waiting_on") if k in changes})
            names["#qs"] = "qs"
            values[":qs"] = {"S": _qs(filed_in, listed_state(filed))}
            sets.append("#qs = :qs")
        # What the rank is made of: priority and fair tag change only here, id and created_at never.
        # Unless they change, the stored rank stays; a run stored before ranks existed gets one.
        spec = changes.get("spec", run.spec)
        priority = (spec if isinstance(spec, RunSpec) else record(RunSpec, spec)).priority
        names["#rank"] = "rank"
        tag = float(changes.get("fair_tag", run.fair_tag))
        values[":rank"] = {"S": rank_key(priority, tag, run.created_at, run.id)}
        moves = "spec" in changes or "fair_tag" in changes
        sets.append("#rank = :rank" if moves else "#rank = if_not_exists(#rank, :rank)")
        removes: list[str] = []
        if queue is not None or any(field in changes for field in PURGE_SOURCES):
            conditions += purge_index(run, changes, names, values, sets, removes, filed_in)
        if event is not None:
            names["#events"] = "events"
            if len(seen) < MAX_RUN_EVENTS:
                values[":ev"] = to_dynamo(jsonable(add_event([], event)))
                values[":empty"] = {"L": []}
                values[":room"] = {"N": str(MAX_RUN_EVENTS)}
                sets.append("#events = list_append(if_not_exists(#events, :empty), :ev)")
                conditions.append("(attribute_not_exists(#events) OR size(#events) < :room)")
            else:  # full: the first event and the latest ones, if the timeline is still the one read
                last = seen[-1]
                names |= {"#at": "at", "#message": "message"}
                values[":events"] = to_dynamo(jsonable(add_event(seen, event)))
                values |= {":seen": {"N": str(len(seen))}, ":at": to_dynamo(last.at), ":message": {"S": last.message}}
                sets.append("#events = :events")
                tail = f"#events[{len(seen) - 1}]"
                conditions.append(f"size(#events) = :seen AND {tail}.#at = :at AND {tail}.#message = :message")
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "Key": {"id": {"S": run.id}},
            "ConditionExpression": " AND ".join(conditions),
            "ExpressionAttributeNames": names,
            "ReturnValues": "ALL_NEW",
        }
        if sets:
            kwargs["UpdateExpression"] = "SET " + ", ".join(sets)
        if removes:
            kwargs["UpdateExpression"] = f"{kwargs.get('UpdateExpression', '')} REMOVE {', '.join(removes)}".strip()
        if values:
            kwargs["ExpressionAttributeValues"] = values
        try:
            resp = self.client.update_item(**kwargs)
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                current = self.get(run.id)  # raises NotFound when the run is gone
                if ("#events" in names or derives) and expect.holds(current):
                    raise _TimelineMoved(current) from e
                raise ConditionFailed(
                    f"run {run.id} is {current.state} at attempt {current.attempt}", run=current
                ) from e
            raise translate(e, "update run") from e
        except BotoCoreError as e:
            raise translate(e, "update run") from e
        return self._run(resp["Attributes"])

    def follow(self, run_id: str, dependent: str) -> Run:
        unfinished = [str(s) for s in RunState if not s.terminal]
        values: dict[str, Any] = {f":s{i}": {"S": s} for i, s in enumerate(unfinished)}
        values |= {":d": {"L": [{"S": dependent}]}, ":one": {"S": dependent}, ":empty": {"L": []}}
        values[":most"] = {"N": str(MAX_DEPENDENTS)}
        states = ", ".join(f":s{i}" for i in range(len(unfinished)))
        try:
            resp = self.client.update_item(
                TableName=self.table,
                Key={"id": {"S": run_id}},
                UpdateExpression="SET #deps = list_append(if_not_exists(#deps, :empty), :d)",
                ConditionExpression=(
                    f"attribute_exists(#id) AND attribute_not_exists(#kind) AND #state IN ({states})"
                    " AND (attribute_not_exists(#deps) OR (NOT contains(#deps, :one) AND size(#deps) < :most))"
                ),
                ExpressionAttributeNames={"#id": "id", "#kind": "kind", "#state": "state", "#deps": "dependents"},
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
            )
        except ClientError as e:
            if error_code(e) != "ConditionalCheckFailedException":
                raise translate(e, "follow run") from e
            current = self.get(run_id)  # raises NotFound when there is no such run
            if dependent in current.dependents:
                return current
            if current.state.terminal:
                raise ConditionFailed(f"run {run_id} has ended: {current.state}", run=current) from e
            raise Conflict(f"run {run_id} already has {MAX_DEPENDENTS} runs and sweeps waiting for it") from e
        except BotoCoreError as e:
            raise translate(e, "follow run") from e
        return self._run(resp["Attributes"])

    def waiting(self, queue: str, limit: int = 100, cursor: str | None = None) -> Page:
        return self.list(queue=queue, state=WAITING, limit=limit, cursor=cursor)

    def list(
        self,
        *,
        owner: str | None = None,
        queue: str | None = None,
        state: RunState | str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page:
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        filters: list[str] = []
        if owner is not None:
            index, key_attr = BY_OWNER, "owner"
            names["#k"] = "owner"
            values[":k"] = {"S": owner}
            if state is not None:
                names["#state"] = "state"
                values[":state"] = {"S": str(state)}
                filters.append("#state = :state")
            if queue is not None:
                names["#queue"] = "queue"
                values[":queue"] = {"S": queue}
                filters.append("#queue = :queue")
        elif queue is not None and state is not None:
            index, key_attr = BY_QUEUE_STATE, "qs"
            names["#k"] = "qs"
            values[":k"] = {"S": _qs(queue, state)}
        else:
            raise ValueError("list needs an owner, or a queue and a state")
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": index,
            "KeyConditionExpression": "#k = :k",
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
            "ScanIndexForward": False,
        }
        if filters:
            kwargs["FilterExpression"] = " AND ".join(filters)
        start = start_key(cursor, key_attr, values[":k"]["S"]) if cursor else None
        runs: list[Run] = []
        last_key: dict[str, Any] | None = None
        examined = 0
        while True:
            if start:
                kwargs["ExclusiveStartKey"] = start
            wanted = max(limit - len(runs), 1) if not filters else max(limit * 2, 20)
            kwargs["Limit"] = max(1, min(wanted, self.list_budget - examined))
            try:
                resp = self.client.query(**kwargs)
            except (ClientError, BotoCoreError) as e:
                raise translate(e, "list runs") from e
            examined += int(resp.get("ScannedCount", 0))
            for item in resp.get("Items", []):
                run = self._run(item)
                runs.append(run)
                last_key = {
                    "id": {"S": run.id},
                    key_attr: item[key_attr],
                    "created_at": item["created_at"],
                }
                if len(runs) == limit:
                    return Page(runs, key_cursor(last_key))
            start = resp.get("LastEvaluatedKey")
            if not start:
                return Page(runs, None)
            if examined >= self.list_budget:  # a short page; the cursor goes on where the reading stopped
                return Page(runs, key_cursor(start))

    def cursor_after(self, run: Run, owner: str | None = None) -> str:
        return cursor_after(run, owner)

    def _query(self, kwargs: dict[str, Any], limit: int, doing: str) -> builtins.list[Run]:
        """At most ``limit`` runs of a query, page after page (a page stops at 1 MB, or holds fewer
        than asked where a filter left some out)."""
        runs: builtins.list[Run] = []
        while len(runs) < limit:
            kwargs["Limit"] = limit - len(runs)
            try:
                resp = self.client.query(**kwargs)
            except (ClientError, BotoCoreError) as e:
                raise translate(e, doing) from e
            runs.extend(self._run(item) for item in resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                break
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        return runs[:limit]

    def head(self, queue: str, limit: int, priority: int | None = None) -> builtins.list[Run]:
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": BY_RANK,
            "KeyConditionExpression": "#k = :k",
            "ExpressionAttributeNames": {"#k": "qs"},
            "ExpressionAttributeValues": {":k": {"S": _qs(queue, RunState.QUEUED)}},
            "ScanIndexForward": True,
        }
        if priority is not None:
            kwargs["KeyConditionExpression"] += " AND begins_with(#r, :r)"
            kwargs["ExpressionAttributeNames"]["#r"] = "rank"
            kwargs["ExpressionAttributeValues"][":r"] = {"S": rank_prefix(priority)}
        return self._query(kwargs, limit, "read the head of the queue")

    def count(self, queue: str, state: RunState, cap: int = 10000) -> int:
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": BY_QUEUE_STATE,
            "KeyConditionExpression": "qs = :k",
            "ExpressionAttributeValues": {":k": {"S": _qs(queue, state)}},
            "Select": "COUNT",
        }
        total = 0
        while total < cap:
            try:
                resp = self.client.query(**kwargs)
            except (ClientError, BotoCoreError) as e:
                raise translate(e, "count runs") from e
            total += int(resp.get("Count", 0))
            if "LastEvaluatedKey" not in resp:
                break
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        return min(total, cap)

    def due(self, queue: str, now: float, limit: int = 100) -> builtins.list[Run]:
        ended = _ended()
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": BY_PURGE,
            "KeyConditionExpression": "#pq = :q AND #pd <= :now",
            # a run an older release retried keeps its pd: ended runs only
            "FilterExpression": f"#state IN ({', '.join(ended)})",
            "ExpressionAttributeNames": {"#pq": PURGE_QUEUE, "#pd": PURGE_DUE, "#state": "state"},
            "ExpressionAttributeValues": {":q": {"S": queue}, ":now": to_dynamo(now), **ended},
            "ScanIndexForward": True,
        }
        return self._query(kwargs, limit, "read the runs due for the retention sweep")

    def delete(self, run_id: str, now: float) -> None:
        # The state too, beside the index's time: a release before retention that retries a run
        # leaves its pd in place.
        ended = _ended()
        values: dict[str, Any] = {":now": to_dynamo(now), ":kept": {"BOOL": True}, **ended}
        try:
            self.client.delete_item(
                TableName=self.table,
                Key={"id": {"S": run_id}},
                ConditionExpression=(
                    "attribute_exists(#id) AND attribute_not_exists(#kind) AND #pd <= :now"
                    f" AND #state IN ({', '.join(ended)})"
                    " AND (attribute_not_exists(#kept) OR #kept <> :kept)"
                ),
                ExpressionAttributeNames={
                    "#id": "id",
                    "#kind": "kind",
                    "#pd": PURGE_DUE,
                    "#kept": "kept",
                    "#state": "state",
                },
                ExpressionAttributeValues=values,
            )
        except ClientError as e:
            if error_code(e) != "ConditionalCheckFailedException":
                raise translate(e, "delete run") from e
            current = self.get(run_id)  # raises NotFound when the run is gone
            raise ConditionFailed(f"run {run_id} is not due for deletion", run=current) from e
        except BotoCoreError as e:
            raise translate(e, "delete run") from e


def _ended() -> dict[str, Any]:
    """The ended states as expression values (``:e0``...), to write ``#state IN (...)`` with."""
    return {f":e{i}": {"S": str(s)} for i, s in enumerate(s for s in RunState if s.terminal)}


def cursor_after(run: Run, owner: str | None) -> str:
    """The cursor of a page that ends with ``run``: of the owner's listing when ``owner`` is
    given, else of the run's queue and state."""
    key_attr, value = ("owner", owner) if owner is not None else ("qs", _qs(run.queue, listed_state(run)))
    return base64.urlsafe_b64encode(
        json.dumps({"id": run.id, key_attr: value, "created_at": run.created_at}).encode()
    ).decode()
