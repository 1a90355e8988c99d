"""The order a pool's queued runs start in: fair tags at submit (docs/scheduling.md).

Within one priority, runs start in the order of their fair tag (start-time fair queueing). The
pool's *virtual time* V is the tag of the first queued run of that priority (0 when none waits).
Each user has a lane per pool (``Lane``): the tag their next run would take and the lead they had
over the line, which halves every ``Pool.fair_share_half_life`` seconds. A run's tag is V plus the
user's lead, and the lane moves one past it: a user who queued 500 runs holds tags V..V+499, and a
newcomer's first run gets V, so it starts within the next two.
"""

from __future__ import annotations

import logging

from runplane.domain.errors import ConditionFailed, RunplaneError
from runplane.domain.models import Lane, Pool
from runplane.ports import QuotaStore, RunStore

log = logging.getLogger(__name__)

MAX_TRIES = 3
"""Lane writes lost to the same user's submits at the same moment before a run keeps the tag it
computed last (never a failed submit over it)."""


def lead(lane: Lane, virtual: float, now: float, half_life: float) -> float:
    """How far ahead of the line (``virtual``) the user's next run goes: what is left of the lead
    their lane had, halved every ``half_life`` seconds since, and never past the lane's tag (runs
    that started since moved the line up to it) nor below 0. A user without a lane has none."""
    if lane.version == 0:
        return 0.0
    decayed = lane.lead * 2 ** (-max(0.0, now - lane.at) / half_life)
    return max(0.0, min(lane.tag - virtual, decayed))


def fair_tag(store: RunStore, quotas: QuotaStore, pool: Pool, user: str, priority: int, now: float) -> float:
    """The fair tag of a run ``user`` submits now to ``pool`` at ``priority``, moving the user's
    lane past it. One head query, one lane read and one conditional lane write; a write lost to a
    racing submit of the same user reads the lane again (``MAX_TRIES`` in all). The quota store
    failing costs fairness, never the submit: the run then takes the tag computed so far."""
    first = store.head(pool.name, 1, priority)
    virtual = first[0].fair_tag if first else 0.0
    tag = virtual
    for _ in range(MAX_TRIES):
        try:
            lane = quotas.lane(pool.name, user)
            tag = virtual + lead(lane, virtual, now, pool.fair_share_half_life)
            quotas.save_lane(lane.model_copy(update={"tag": tag + 1, "lead": tag + 1 - virtual, "at": now}))
        except ConditionFailed:
            continue
        except RunplaneError as e:
            log.warning("fair share of %s in pool %s not recorded: %s", user, pool.name, e)
        return tag
    log.info("fair share of %s in pool %s: lane busy, run tagged %s", user, pool.name, tag)
    return tag
