"""The tables of a stack, named once: ``StackNames`` holds them; each cloud's names (``AwsNames``,
``AzureNames``) add its other resources and how it derives a name the settings leave empty."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Self

from runplane.settings import StackSettings


@dataclass(frozen=True)
class StackNames:
    """The names of one stack's tables. A table left empty is named ``derive(role)``, its role being
    the field's name without ``_table`` (``runs_table``: ``runs``); one given is ``check_table``ed.
    ``StackSettings`` has a field of the same name for each (``RUNPLANE_RUNS_TABLE``, ...)."""

    prefix: str = "runplane"
    runs_table: str = ""
    workers_table: str = ""
    tokens_table: str = ""
    pools_table: str = ""
    quotas_table: str = ""
    secrets_table: str = ""
    sessions_table: str = ""

    def __post_init__(self) -> None:
        for field, role in TABLES.items():
            given = getattr(self, field)
            object.__setattr__(self, field, self.check_table(given) if given else self.derive(role))

    def derive(self, role: str) -> str:
        """The name of the table (or other resource) of ``role`` in a stack of this prefix."""
        raise NotImplementedError

    def check_table(self, name: str) -> str:
        """``name`` as given, or InvalidRequest when the cloud would refuse it as a table's."""
        return name

    @property
    def tables(self) -> tuple[str, ...]:
        """Every table of the stack."""
        return tuple(getattr(self, field) for field in TABLES)

    @classmethod
    def named(cls, settings: StackSettings, **others: Any) -> Self:
        """The names ``settings`` give (with ``others``: the cloud's other resources)."""
        return cls(prefix=settings.prefix, **{field: getattr(settings, field) for field in TABLES}, **others)


TABLES: dict[str, str] = {
    f.name: f.name.removesuffix("_table") for f in dataclasses.fields(StackNames) if f.name.endswith("_table")
}
"""Each table's field (in ``StackNames`` and ``StackSettings``) -> its role: ``runs_table`` -> ``runs``."""
