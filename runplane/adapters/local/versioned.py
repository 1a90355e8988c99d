"""The one conditional write of records guarded by their version, for the stores of one machine."""

from __future__ import annotations

from collections.abc import Sequence

from runplane.adapters.local.db import Database
from runplane.domain.errors import ConditionFailed


def read_versioned(db: Database, table: str, where: str, key: Sequence[object]) -> tuple[int | None, str]:
    """The stored ``version`` (None: no row, or none readable) and data of the row of ``table``
    that ``where`` (an SQL condition on ``key``) finds; ``""`` as data when there is no row."""
    found = db.connection().execute(f"SELECT version, data FROM {table} WHERE {where}", tuple(key)).fetchone()  # noqa: S608 - names are ours
    if found is None:
        return None, ""
    version, data = found
    return (version if isinstance(version, int) else None), str(data)


def put_versioned(
    db: Database, table: str, columns: dict[str, object], version: int, data: str, changed: ConditionFailed
) -> None:
    """Write the row of ``table`` keyed by ``columns`` (name -> value) at ``version`` + 1 with
    ``data``, if the stored version is ``version`` (0: no row, or a row without one); raises
    ``changed`` when it is not (another writer came first). One transaction."""
    where = " AND ".join(f"{name} = ?" for name in columns)
    names = [*columns, "version", "data"]
    insert = f"INSERT OR REPLACE INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})"  # noqa: S608 - names are ours
    with db.write() as c:
        found = c.execute(f"SELECT version FROM {table} WHERE {where}", tuple(columns.values())).fetchone()  # noqa: S608
        stored = found[0] if found is not None and isinstance(found[0], int) else 0
        if stored != version:
            raise changed
        c.execute(insert, (*columns.values(), version + 1, data))
