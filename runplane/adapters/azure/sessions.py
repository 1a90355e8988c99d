"""Table storage sessions: one entity per slot of a run (PartitionKey the run, RowKey the slot)."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any

from azure.core.exceptions import AzureError
from azure.data.tables import TableClient

from runplane.adapters.azure.tables import failure, get_entity, key, packed, select, unpack, write_versioned
from runplane.adapters.records import jsonable, record
from runplane.adapters.session_records import check_session_changes, readable, session_slot
from runplane.domain.errors import ConditionFailed, Conflict, NotFound
from runplane.domain.sessions import Session, SessionState

__all__ = ["TableSessionStore", "row_key"]

_LOST_RACES = 32
"""How often a write reads again after another writer changed the entity since its read (a
bounded loop: each retry follows a write that succeeded)."""


def row_key(slot: int) -> str:
    """A slot's RowKey: two digits, so that the partition lists the run's slots in order."""
    return f"{slot:02d}"


class TableSessionStore:
    """Sessions, one entity per slot: PartitionKey the run id (``key``-escaped), RowKey the slot
    (``row_key``), ``id`` and ``state`` beside the session packed as JSON over properties. Every
    write is conditional on the entity's ETag as read (none: the slot was empty), so of writers
    that race, one wins and the others read again and decide on what is there now."""

    def __init__(self, table: TableClient) -> None:
        self.table = table

    def _read(self, run_id: str, slot: int) -> tuple[Session | None, Any | None]:
        entity = get_entity(self.table, key(run_id), row_key(slot), "read session")
        return _session(entity, run_id), entity

    def _entity(self, session: Session) -> dict[str, Any]:
        return {
            "PartitionKey": key(session.run_id),
            "RowKey": row_key(session.slot),
            "id": session.id,
            "state": str(session.state),
            **packed(session, f"session {session.id}"),
        }

    def create(self, session: Session) -> Session:
        for _ in range(_LOST_RACES):
            held, entity = self._read(session.run_id, session.slot)
            what = f"slot {session.slot} of run {session.run_id} holds "
            if entity is not None and held is None:
                raise Conflict(what + "a session")
            if held is not None and not held.state.over:
                raise Conflict(what + f"session {held.id}", session=held)
            etag = str(entity.metadata["etag"]) if entity is not None else ""
            try:
                write_versioned(self.table, self._entity(session), etag, ConditionFailed("raced"), "store session")
            except ConditionFailed:
                continue
            return session
        raise ConditionFailed(f"slot {session.slot} of run {session.run_id} kept changing; try again")

    def get(self, session_id: str) -> Session:
        run_id, slot = session_slot(session_id)
        found, _ = self._read(run_id, slot)
        if found is None or found.id != session_id:
            raise NotFound(f"session {session_id} not found")
        return found

    def update(self, session: Session, states: frozenset[SessionState], changes: Mapping[str, Any]) -> Session:
        check_session_changes(changes)
        for _ in range(_LOST_RACES):
            current, entity = self._read(session.run_id, session.slot)
            if entity is None or current is None or current.id != session.id:
                raise NotFound(f"session {session.id} not found")
            if current.state not in states:
                raise ConditionFailed(f"session {session.id} is {current.state}", session=current)
            data = unpack(entity)  # as stored: fields this release does not know are written back
            data.update({field: jsonable(value) for field, value in changes.items()})
            new = record(Session, data)
            etag = str(entity.metadata["etag"])
            try:
                write_versioned(self.table, self._entity(new), etag, ConditionFailed("raced"), "update session")
            except ConditionFailed:
                continue
            return new
        raise ConditionFailed(f"session {session.id} kept changing; try again")

    def forget(self, run_id: str) -> int:
        found = select(self.table, "PartitionKey eq @run", {"run": key(run_id)}, "list sessions")
        for entity in found:
            try:
                self.table.delete_entity(entity["PartitionKey"], entity["RowKey"])  # quiet when gone
            except AzureError as e:
                raise failure(e, "delete session") from e
        return len(found)

    def for_run(self, run_id: str) -> builtins.list[Session]:
        entities = select(self.table, "PartitionKey eq @run", {"run": key(run_id)}, "list sessions")
        found = (_session(entity, run_id) for entity in sorted(entities, key=lambda e: str(e["RowKey"])))
        return [s for s in found if s is not None]


def _session(entity: Mapping[str, Any] | None, run_id: str) -> Session | None:
    if entity is None:
        return None
    try:
        data = unpack(entity)
    except (KeyError, ValueError, TypeError):
        data = "not a session"
    return readable(data, f"a slot of run {run_id}")
