"""DynamoDB adapters: runs (conditional writes), workers, tokens, pool records, quotas."""

from __future__ import annotations

import base64
import builtins
import json
import logging
import re
import secrets
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import BotoCoreError, ClientError

from runplane.adapters.aws.clients import error_code
from runplane.domain.common import RUN_ID_PATTERN
from runplane.domain.cursors import decode_cursor
from runplane.domain.errors import AlreadyExists, BackendError, BadRequest, ConditionFailed, Conflict, NotFound
from runplane.domain.quotas import Lane, Quota, QuotaKind, UsageRecord, quota_key
from runplane.domain.records import MAX_RUN_EVENTS, add_event, bound_changes
from runplane.domain.runs import (
    MAX_DEPENDENTS,
    WAITING,
    Event,
    Run,
    RunSpec,
    listed_state,
    rank_key,
    rank_prefix,
    run_rank,
)
from runplane.domain.states import RunState
from runplane.domain.tenancy import ApiToken, UserRecord
from runplane.domain.workers import PoolRecord, Worker
from runplane.ports import LIST_BUDGET, Expect, Page

log = logging.getLogger(__name__)

_ser = TypeSerializer()
_de = TypeDeserializer()

BY_OWNER = "by_owner"
BY_QUEUE_STATE = "by_queue_state"
BY_RANK = "by_rank"
BY_POOL = "by_pool"
"""The workers table's index: a pool's workers."""


def _to_dynamo(value: Any) -> dict[str, Any]:
    return _ser.serialize(json.loads(json.dumps(value), parse_float=Decimal))  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _from_item(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _plain(_de.deserialize(v)) for k, v in item.items()}


def _qs(queue: str, state: RunState | str) -> str:
    return f"{queue}#{state}"


def _translate(e: Exception, what: str) -> Exception:
    """Our error for what DynamoDB (or botocore) answered: its code decides, and its own words
    (which may name tables, keys and attributes) are logged here, never carried to an answer."""
    code = error_code(e) if isinstance(e, ClientError) else e.__class__.__name__
    log.warning("%s: DynamoDB answered %s: %s", what, code, e)
    if code == "ValidationException":
        return BadRequest(f"{what}: the store refused the request")
    return BackendError(f"{what} failed: {code}")


MAX_TIMELINE_TRIES = 20
"""How often a write whose run's full timeline changed under it reads it again and tries again."""


class _TimelineMoved(Exception):
    """A run's timeline changed between its read and a write that replaces it whole."""

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
        data = run.model_dump(mode="json")
        data["qs"] = _qs(run.queue, listed_state(run))
        data["rank"] = run_rank(run)
        return {k: _to_dynamo(v) for k, v in data.items()}

    @staticmethod
    def _run(item: Mapping[str, Any]) -> Run:
        data = _from_item(item)
        data.pop("qs", None)
        data.pop("rank", None)
        return Run.model_validate(data)

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
            raise _translate(e, "store run") from e
        except BotoCoreError as e:
            raise _translate(e, "store run") from e
        return run

    def get(self, run_id: str) -> Run:
        try:
            resp = self.client.get_item(TableName=self.table, Key={"id": {"S": run_id}}, ConsistentRead=True)
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, "read run") from e
        if "Item" not in resp or "kind" in resp["Item"]:  # a sweep's record shares the table
            raise NotFound(f"run {run_id} not found")
        return self._run(resp["Item"])

    def update(self, run: Run, expect: Expect, changes: Mapping[str, Any], event: Event | None = None) -> Run:
        for field in changes:
            if field not in Run.model_fields or field in ("id", "owner", "queue", "created_at"):
                raise ValueError(f"cannot update field {field!r}")
        bounded = bound_changes(changes)
        if event is not None and "events" in bounded:  # a timeline given whole: the event goes last
            bounded["events"], event = add_event(bounded["events"], event), None
        seen = run.events
        for _ in range(MAX_TIMELINE_TRIES):
            try:
                return self._update(run, expect, bounded, event, seen)
            except _TimelineMoved as moved:
                seen = moved.current.events
        raise BackendError(f"update run {run.id}: {MAX_TIMELINE_TRIES} concurrent writes won over this one; retry")

    def _update(
        self, run: Run, expect: Expect, changes: Mapping[str, Any], event: Event | None, seen: builtins.list[Event]
    ) -> Run:
        """One conditional write of ``changes`` and ``event``, where ``seen`` is the run's timeline
        as last read. Below ``MAX_RUN_EVENTS`` the event is appended; at it, the timeline is written
        whole (``add_event``), on the condition that it is still the one read. Raises _TimelineMoved
        when only that condition failed, ConditionFailed when ``expect`` does not hold."""
        names: dict[str, str] = {"#id": "id"}
        values: dict[str, Any] = {}
        sets: list[str] = []
        for i, (field, value) in enumerate(changes.items()):
            names[f"#f{i}"] = field
            values[f":v{i}"] = _to_dynamo(_jsonable(value))
            sets.append(f"#f{i} = :v{i}")
        if "state" in changes or "waiting_on" in changes:
            # a queued run that still waits for others is filed apart from the line (a change of
            # ``waiting_on`` alone is made only to a queued run: its write expects that state)
            filed = run.model_copy(update={k: changes[k] for k in ("state", "waiting_on") if k in changes})
            names["#qs"] = "qs"
            values[":qs"] = {"S": _qs(run.queue, listed_state(filed))}
            sets.append("#qs = :qs")
        # What the rank is made of: priority and fair tag change only here, id and created_at never.
        # Unless they change, the stored rank stays; a run stored before ranks existed gets one.
        spec = changes.get("spec", run.spec)
        priority = (spec if isinstance(spec, RunSpec) else RunSpec.model_validate(spec)).priority
        names["#rank"] = "rank"
        tag = float(changes.get("fair_tag", run.fair_tag))
        values[":rank"] = {"S": rank_key(priority, tag, run.created_at, run.id)}
        moves = "spec" in changes or "fair_tag" in changes
        sets.append("#rank = :rank" if moves else "#rank = if_not_exists(#rank, :rank)")
        conditions = ["attribute_exists(#id)", *_conditions(expect, names, values)]
        if event is not None:
            names["#events"] = "events"
            if len(seen) < MAX_RUN_EVENTS:
                values[":ev"] = _to_dynamo([add_event([], event)[0].model_dump(mode="json")])
                values[":empty"] = {"L": []}
                values[":room"] = {"N": str(MAX_RUN_EVENTS)}
                sets.append("#events = list_append(if_not_exists(#events, :empty), :ev)")
                conditions.append("(attribute_not_exists(#events) OR size(#events) < :room)")
            else:  # full: the first event and the latest ones, if the timeline is still the one read
                last = seen[-1]
                names |= {"#at": "at", "#message": "message"}
                values[":events"] = _to_dynamo([e.model_dump(mode="json") for e in add_event(seen, event)])
                values |= {":seen": {"N": str(len(seen))}, ":at": _to_dynamo(last.at), ":message": {"S": last.message}}
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
        if values:
            kwargs["ExpressionAttributeValues"] = values
        try:
            resp = self.client.update_item(**kwargs)
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                current = self.get(run.id)  # raises NotFound when the run is gone
                if "#events" in names and expect.holds(current):
                    raise _TimelineMoved(current) from e
                raise ConditionFailed(
                    f"run {run.id} is {current.state} at attempt {current.attempt}", run=current
                ) from e
            raise _translate(e, "update run") from e
        except BotoCoreError as e:
            raise _translate(e, "update run") from e
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
                raise _translate(e, "follow run") from e
            current = self.get(run_id)  # raises NotFound when there is no such run
            if dependent in current.dependents:
                return current
            if current.state.terminal:
                raise ConditionFailed(f"run {run_id} has ended: {current.state}", run=current) from e
            raise Conflict(f"run {run_id} already has {MAX_DEPENDENTS} runs and sweeps waiting for it") from e
        except BotoCoreError as e:
            raise _translate(e, "follow run") from e
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
        start = _decode_cursor(cursor, key_attr, values[":k"]["S"]) if cursor else None
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
                raise _translate(e, "list runs") from e
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
                    return Page(runs, _encode_cursor(last_key))
            start = resp.get("LastEvaluatedKey")
            if not start:
                return Page(runs, None)
            if examined >= self.list_budget:  # a short page; the cursor goes on where the reading stopped
                return Page(runs, _encode_cursor(start))

    def cursor_after(self, run: Run, owner: str | None = None) -> str:
        return cursor_after(run, owner)

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
        runs: builtins.list[Run] = []
        while len(runs) < limit:
            kwargs["Limit"] = limit - len(runs)
            try:
                resp = self.client.query(**kwargs)
            except (ClientError, BotoCoreError) as e:
                raise _translate(e, "read the head of the queue") from e
            runs.extend(self._run(item) for item in resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:  # a page stops at 1 MB: big runs may need more than one
                break
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        return runs[:limit]

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
                raise _translate(e, "count runs") from e
            total += int(resp.get("Count", 0))
            if "LastEvaluatedKey" not in resp:
                break
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        return min(total, cap)


def _conditions(expect: Expect, names: dict[str, str], values: dict[str, Any]) -> builtins.list[str]:
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
    return conditions


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, builtins.list):
        return [_jsonable(v) for v in value]
    if isinstance(value, RunState):
        return str(value)
    return value


def _encode_cursor(key: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(_from_item(key)).encode()).decode()


def cursor_after(run: Run, owner: str | None) -> str:
    """The cursor of a page that ends with ``run``: of the owner's listing when ``owner`` is
    given, else of the run's queue and state."""
    key_attr, value = ("owner", owner) if owner is not None else ("qs", _qs(run.queue, listed_state(run)))
    return base64.urlsafe_b64encode(
        json.dumps({"id": run.id, key_attr: value, "created_at": run.created_at}).encode()
    ).decode()


_CURSOR_ID = re.compile(RUN_ID_PATTERN)


def _decode_cursor(cursor: str, key_attr: str, key_value: str) -> dict[str, Any]:
    """The start key a cursor holds, checked to be one of this very listing (same index, same
    partition): anything else is a BadRequest, never a query DynamoDB would refuse."""
    try:
        data = decode_cursor(cursor)  # NaN and Infinity fail the range check
        if (
            not isinstance(data, dict)
            or set(data) != {"id", key_attr, "created_at"}
            or not isinstance(data["id"], str)
            or not _CURSOR_ID.fullmatch(data["id"])
            or data[key_attr] != key_value
            or isinstance(data["created_at"], bool)
            or not isinstance(data["created_at"], int | float)
            or not 0 <= data["created_at"] < 1e11
        ):
            raise TypeError
        return {k: _to_dynamo(v) for k, v in data.items()}
    except (ValueError, TypeError) as e:
        raise BadRequest("cursor is not valid; pass the next_cursor of a previous page") from e


class DynamoWorkerRegistry:
    """Worker heartbeats; stale records expire through the table's TTL attribute. An item holds
    the keys (``id``, and ``pool`` for the index), ``expires_at`` and the record as one JSON
    document, which a listing reads back in one piece."""

    def __init__(self, table: str, client: Any, ttl_seconds: int = 3600) -> None:
        self.table = table
        self.client = client
        self.ttl_seconds = ttl_seconds

    def put(self, worker: Worker) -> None:
        item = {
            "id": {"S": worker.id},
            "pool": {"S": worker.pool},
            "expires_at": {"N": str(int(time.time()) + self.ttl_seconds)},
            "doc": {"S": worker.model_dump_json()},
        }
        try:
            self.client.put_item(TableName=self.table, Item=item)
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, "record worker") from e

    def get(self, worker_id: str) -> Worker:
        try:
            resp = self.client.get_item(TableName=self.table, Key={"id": {"S": worker_id}})
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, "read worker") from e
        if "Item" not in resp:
            raise NotFound(f"worker {worker_id} not found")
        return _worker(resp["Item"])

    def list(self, pool: str | None = None) -> list[Worker]:
        """Every worker (a scan), or a pool's (one query of the ``by_pool`` index: its cost does not
        grow with the workers of other pools)."""
        kwargs: dict[str, Any] = {"TableName": self.table}
        operation = "scan"
        if pool is not None:
            operation = "query"
            kwargs["IndexName"] = BY_POOL
            kwargs["KeyConditionExpression"] = "#p = :p"
            kwargs["ExpressionAttributeNames"] = {"#p": "pool"}
            kwargs["ExpressionAttributeValues"] = {":p": {"S": pool}}
        workers: list[Worker] = []
        try:
            for page in self.client.get_paginator(operation).paginate(**kwargs):
                workers.extend(_worker(item) for item in page.get("Items", []))
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, "list workers") from e
        return sorted(workers, key=lambda w: w.id)

    def page(self, pool: str | None, limit: int, after: str | None = None) -> tuple[builtins.list[Worker], str | None]:
        """A scan (or, for a pool, a query of ``by_pool``: in id order) that stops at ``limit``."""
        kwargs: dict[str, Any] = {"TableName": self.table, "Limit": limit}
        operation = self.client.scan
        if pool is not None:
            operation = self.client.query
            kwargs["IndexName"] = BY_POOL
            kwargs["KeyConditionExpression"] = "#p = :p"
            kwargs["ExpressionAttributeNames"] = {"#p": "pool"}
            kwargs["ExpressionAttributeValues"] = {":p": {"S": pool}}
        if after is not None:
            kwargs["ExclusiveStartKey"] = {"id": {"S": after}, **({"pool": {"S": pool}} if pool is not None else {})}
        workers: builtins.list[Worker] = []
        try:
            while len(workers) < limit:  # a page may stop short of Limit at 1 MB
                kwargs["Limit"] = limit - len(workers)
                resp = operation(**kwargs)
                workers.extend(_worker(item) for item in resp.get("Items", []))
                if "LastEvaluatedKey" not in resp:
                    return workers, None
                kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, "list workers") from e
        return workers, workers[-1].id if workers else None

    def delete(self, worker_id: str) -> None:
        try:
            self.client.delete_item(TableName=self.table, Key={"id": {"S": worker_id}})
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, "delete worker") from e


def _worker(item: Mapping[str, Any]) -> Worker:
    if "doc" in item:
        return Worker.model_validate_json(item["doc"]["S"])
    data = _from_item(item)  # written with one attribute a field, before the document
    data.pop("expires_at", None)
    return Worker.model_validate(data)


class DynamoTokenStore:
    """API tokens, stored under the SHA-256 of their secret; the document as JSON. The stack's own
    secret is one more item, under a key no hash can take."""

    SECRET_KEY = "stack-secret"  # noqa: S105 - a key name, not a secret
    USER_PREFIX = "user:"
    """Users' records (``UserRecord``) are items under ``user:<name>``: no SHA-256 is one."""

    def __init__(self, table: str, client: Any) -> None:
        self.table = table
        self.client = client

    def lookup(self, token_hash: str) -> ApiToken | None:
        if token_hash == self.SECRET_KEY:
            return None
        try:
            resp = self.client.get_item(TableName=self.table, Key={"token_hash": {"S": token_hash}})
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, "read token") from e
        return _token(resp.get("Item"))

    def put(self, token_hash: str, token: ApiToken) -> None:
        item = {"token_hash": {"S": token_hash}, "id": {"S": token.id}, "doc": {"S": token.model_dump_json()}}
        try:
            self.client.put_item(TableName=self.table, Item=item)
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, "store token") from e

    def _scan(self, **kwargs: Any) -> list[dict[str, Any]]:
        # strongly consistent: a release refuses a run on what this read says (``authority.Owners``),
        # and a revoke must find a token made a moment ago
        items: list[dict[str, Any]] = []
        try:
            pages = self.client.get_paginator("scan").paginate(TableName=self.table, ConsistentRead=True, **kwargs)
            for page in pages:
                items.extend(page.get("Items", []))
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, "list tokens") from e
        return items

    def list(self) -> list[ApiToken]:
        tokens = [_token(item) for item in self._scan() if "doc" in item]
        return sorted((t for t in tokens if t is not None), key=lambda t: (t.created_at, t.id))

    def delete(self, token_id: str) -> bool:
        found = self._scan(
            FilterExpression="#id = :id",
            ExpressionAttributeNames={"#id": "id"},
            ExpressionAttributeValues={":id": {"S": token_id}},
        )
        for item in found:
            try:
                self.client.delete_item(TableName=self.table, Key={"token_hash": item["token_hash"]})
            except (ClientError, BotoCoreError) as e:
                raise _translate(e, "delete token") from e
        return bool(found)

    def user(self, name: str) -> UserRecord | None:
        key = {"token_hash": {"S": self.USER_PREFIX + name}}
        try:
            item = self.client.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item")
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, "read user") from e
        return UserRecord.read(item.get("user_doc", {}).get("S") if item else None)

    def put_user(self, record: UserRecord) -> None:
        # "user_doc", not "doc": a release that lists tokens reads no token in it
        item = {"token_hash": {"S": self.USER_PREFIX + record.user}, "user_doc": {"S": record.model_dump_json()}}
        try:
            self.client.put_item(TableName=self.table, Item=item)
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, "store user") from e

    def secret(self) -> bytes:
        key = {"token_hash": {"S": self.SECRET_KEY}}
        for _ in range(2):
            try:
                item = self.client.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item")
                if item:
                    return base64.b64decode(item["secret"]["S"])
                self.client.put_item(
                    TableName=self.table,
                    Item={**key, "secret": {"S": base64.b64encode(secrets.token_bytes(32)).decode()}},
                    ConditionExpression="attribute_not_exists(token_hash)",
                )
            except ClientError as e:
                if error_code(e) != "ConditionalCheckFailedException":  # lost the race: read the winner's
                    raise _translate(e, "read the stack secret") from e
            except BotoCoreError as e:
                raise _translate(e, "read the stack secret") from e
        raise BackendError("the stack secret could not be read or made; retry")


def _token(item: Mapping[str, Any] | None) -> ApiToken | None:
    """The token of an item; None for none, or for an item that does not hold a valid token."""
    if not item or "doc" not in item:
        return None
    try:
        return ApiToken.model_validate_json(item["doc"]["S"])
    except ValueError:
        return None


class DynamoPoolStateStore:
    """The dispatcher's per-pool records: one item per pool, the document as JSON, written only
    when the stored ``version`` is the one the writer read."""

    def __init__(self, table: str, client: Any) -> None:
        self.table = table
        self.client = client

    def get(self, pool: str) -> PoolRecord:
        try:
            resp = self.client.get_item(TableName=self.table, Key={"pool": {"S": pool}}, ConsistentRead=True)
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, "read pool record") from e
        item = resp.get("Item")
        if not item:
            return PoolRecord(pool=pool)
        return PoolRecord.model_validate_json(item["doc"]["S"])

    def save(self, record: PoolRecord) -> PoolRecord:
        stored = record.model_copy(update={"version": record.version + 1})
        item = {
            "pool": {"S": record.pool},
            "version": {"N": str(stored.version)},
            "doc": {"S": stored.model_dump_json()},
        }
        try:
            self.client.put_item(
                TableName=self.table,
                Item=item,
                ConditionExpression="attribute_not_exists(#p) OR #v = :v",
                ExpressionAttributeNames={"#p": "pool", "#v": "version"},
                ExpressionAttributeValues={":v": {"N": str(record.version)}},
            )
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                raise ConditionFailed(
                    f"pool {record.pool}: record changed since version {record.version}", pool=record.pool
                ) from e
            raise _translate(e, "write pool record") from e
        except BotoCoreError as e:
            raise _translate(e, "write pool record") from e
        return stored


class DynamoQuotaStore:
    """Quotas and usage records in one table keyed by ``id``: ``quota#user:alice`` holds alice's
    quota, ``usage#user:alice`` what she holds and has used, ``lane#gpu#50#alice`` her place in the
    fair share of pool gpu at priority 50; each document as JSON. Usage records and lanes are written only while
    their stored ``version`` is the one the writer read."""

    QUOTA, USAGE, LANE = "quota#", "usage#", "lane#"

    def __init__(self, table: str, client: Any) -> None:
        self.table = table
        self.client = client

    def _read(self, item_id: str, what: str) -> dict[str, Any] | None:
        try:
            resp = self.client.get_item(TableName=self.table, Key={"id": {"S": item_id}}, ConsistentRead=True)
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, what) from e
        item: dict[str, Any] | None = resp.get("Item")
        return item

    def _scan(self, prefix: str, what: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        try:
            for page in self.client.get_paginator("scan").paginate(
                TableName=self.table,
                ConsistentRead=True,
                FilterExpression="begins_with(#id, :p)",
                ExpressionAttributeNames={"#id": "id"},
                ExpressionAttributeValues={":p": {"S": prefix}},
            ):
                items.extend(page.get("Items", []))
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, what) from e
        return items

    def get(self, kind: QuotaKind, name: str) -> Quota | None:
        key = quota_key(kind, name)
        return _quota(self._read(self.QUOTA + key, "read quota"), key)

    def put(self, quota: Quota) -> None:
        item = {"id": {"S": self.QUOTA + quota.key}, "doc": {"S": quota.model_dump_json()}}
        try:
            self.client.put_item(TableName=self.table, Item=item)
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, "store quota") from e

    def delete(self, kind: QuotaKind, name: str) -> bool:
        try:
            resp = self.client.delete_item(
                TableName=self.table, Key={"id": {"S": self.QUOTA + quota_key(kind, name)}}, ReturnValues="ALL_OLD"
            )
        except (ClientError, BotoCoreError) as e:
            raise _translate(e, "delete quota") from e
        return bool(resp.get("Attributes"))

    def list(self) -> list[Quota]:
        items = self._scan(self.QUOTA, "list quotas")
        found = (_quota(item, item["id"]["S"].removeprefix(self.QUOTA)) for item in items)
        return sorted((q for q in found if q is not None), key=_subject_order)

    def usage(self, kind: QuotaKind, name: str) -> UsageRecord:
        key = quota_key(kind, name)
        return _usage(self._read(self.USAGE + key, "read usage"), kind, name)

    def save_usage(self, record: UsageRecord) -> UsageRecord:
        stored = record.model_copy(update={"version": record.version + 1})
        self._put_versioned(self.USAGE + record.key, record.version, stored.model_dump_json(), f"usage of {record.key}")
        return stored

    def _put_versioned(self, item_id: str, version: int, doc: str, what: str) -> None:
        """Put ``doc`` at ``version`` + 1 if the stored version is ``version`` (0: none stored, or an
        item without one). Raises ConditionFailed when it is not."""
        item = {"id": {"S": item_id}, "version": {"N": str(version + 1)}, "doc": {"S": doc}}
        condition: dict[str, Any] = {"ExpressionAttributeNames": {"#v": "version"}}
        if version == 0:
            condition["ConditionExpression"] = "attribute_not_exists(#v)"
        else:
            condition["ConditionExpression"] = "#v = :v"
            condition["ExpressionAttributeValues"] = {":v": {"N": str(version)}}
        try:
            self.client.put_item(TableName=self.table, Item=item, **condition)
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                raise ConditionFailed(f"{what}: changed since version {version}", key=item_id.partition("#")[2]) from e
            raise _translate(e, f"write {what}") from e
        except BotoCoreError as e:
            raise _translate(e, f"write {what}") from e

    def lane(self, pool: str, user: str, priority: int) -> Lane:
        item = self._read(f"{self.LANE}{pool}#{priority}#{user}", "read lane")
        return _lane(item, pool, user, priority)

    def save_lane(self, lane: Lane) -> Lane:
        stored = lane.model_copy(update={"version": lane.version + 1})
        item_id = f"{self.LANE}{lane.pool}#{lane.priority}#{lane.user}"
        what = f"lane {lane.pool}/{lane.priority}/{lane.user}"
        self._put_versioned(item_id, lane.version, stored.model_dump_json(), what)
        return stored

    def list_usage(self) -> builtins.list[UsageRecord]:  # ``list`` here is the method above
        records = []
        for item in self._scan(self.USAGE, "list usage"):
            kind, _, name = item["id"]["S"].removeprefix(self.USAGE).partition(":")
            if kind in ("user", "group"):
                records.append(_usage(item, kind, name))
        return sorted(records, key=_subject_order)


def _subject_order(subject: Quota | UsageRecord) -> tuple[bool, str]:
    """Users first, each kind by name."""
    return subject.kind != "user", subject.name


def _quota(item: Mapping[str, Any] | None, key: str) -> Quota | None:
    """The quota of an item; None for none, or for an item that does not hold a valid quota of
    ``key``."""
    if not item or "doc" not in item:
        return None
    try:
        quota = Quota.model_validate_json(item["doc"]["S"])
    except (ValueError, KeyError):
        return None
    return quota if quota.key == key else None


def _lane(item: Mapping[str, Any] | None, pool: str, user: str, priority: int) -> Lane:
    """The lane of an item. None, or an item that does not hold a valid lane of ``pool``,
    ``user`` and ``priority``, reads as a fresh lane at the stored version, so the next write
    replaces it."""
    fresh = Lane(pool=pool, user=user, priority=priority)
    if not item:
        return fresh
    try:
        version = int(item["version"]["N"])
    except (KeyError, ValueError):
        return fresh
    try:
        lane = Lane.model_validate_json(item["doc"]["S"])
    except (ValueError, KeyError):
        return fresh.model_copy(update={"version": version})
    if (lane.pool, lane.user, lane.priority, lane.version) != (pool, user, priority, version):
        return fresh.model_copy(update={"version": version})
    return lane


def _usage(item: Mapping[str, Any] | None, kind: QuotaKind, name: str) -> UsageRecord:
    """The usage record of an item. None, or an item that does not hold a valid record of
    ``kind`` ``name``, reads as a fresh record at the stored version, so the next write replaces it."""
    fresh = UsageRecord(kind=kind, name=name)
    if not item:
        return fresh
    try:
        version = int(item["version"]["N"])
    except (KeyError, ValueError):
        return fresh
    try:
        record = UsageRecord.model_validate_json(item["doc"]["S"])
    except (ValueError, KeyError):
        record = None
    if record is None or record.key != fresh.key or record.version != version:
        return fresh.model_copy(update={"version": version})
    return record
