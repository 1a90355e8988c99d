"""The order a pool's queued runs start in: fair tags at submit (docs/scheduling.md).

Within one priority, runs start in the order of their fair tag (start-time fair queueing). The
pool's *virtual time* V is the tag of the first queued run of that priority that is waiting for
the first time and not held back by a quota (a re-queued run keeps its old, lower tag; a run that
waits for its quota may wait long), else of the first queued run, else 0. Each user has a lane per
pool and priority (``Lane``): the tag their next run would take and the lead they had over the
line, which halves every ``Pool.fair_share_half_life`` seconds. A run's tag is V plus the user's
lead, and the lane moves one past it: a user who queued 500 runs holds tags V..V+499, and a
newcomer's first run gets V, so it starts within the next two.
"""

from __future__ import annotations

import logging

from runplane.domain.errors import ConditionFailed, RunplaneError
from runplane.domain.pools import Pool
from runplane.domain.quotas import Lane
from runplane.domain.runs import Run
from runplane.ports import Ports, RunPorts

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


PICK_WINDOW_FOR_V = 8
"""How many of a line's first runs are read to find the one whose tag is the line's virtual time."""


def _sets_the_line(run: Run) -> bool:
    """Whether ``run`` may give its line its virtual time: it waits for the first time, not for a quota."""
    return run.attempt == 0 and not (run.waiting_reason or "").startswith(("quota:", "budget:"))


def virtual_time(ports: RunPorts, pool: str, priority: int) -> float:
    """The virtual time of ``pool``'s line at ``priority``: the tag of its first run that waits for
    the first time and not for a quota (among its first PICK_WINDOW_FOR_V), else of its first run,
    else 0. One head query of one run, the usual case; a second of the window when that run does
    not set the line. A store that cannot answer (say, an index still being built) costs fairness,
    not the submit: 0."""
    try:
        line = ports.store.head(pool, 1, priority)
        if line and not _sets_the_line(line[0]):
            line = ports.store.head(pool, PICK_WINDOW_FOR_V, priority)
    except RunplaneError as e:
        log.warning("line of pool %s at priority %s not read; fair tags start at 0: %s", pool, priority, e)
        return 0.0
    for run in line:
        if _sets_the_line(run):
            return run.fair_tag
    return line[0].fair_tag if line else 0.0


def fair_tag(ports: Ports, pool: Pool, user: str, priority: int, now: float) -> float:
    """The fair tag of a run ``user`` submits now to ``pool`` at ``priority`` (or a queued run of
    theirs moves to ``priority``: it goes in line like a run submitted now), moving the user's
    lane at that priority past it. One head query, one lane read and one conditional lane write; a
    write lost to a racing submit of the same user reads the lane again (``MAX_TRIES`` in all).
    The run store or the quota store failing costs fairness, never the submit: the run then takes
    the tag computed so far. ``now`` is the time the caller writes the run with."""
    quotas = ports.quotas
    virtual = virtual_time(ports, pool.name, priority)
    tag = virtual
    for _ in range(MAX_TRIES):
        try:
            lane = quotas.lane(pool.name, user, priority)
            tag = virtual + lead(lane, virtual, now, pool.fair_share_half_life)
            quotas.save_lane(lane.model_copy(update={"tag": tag + 1, "lead": tag + 1 - virtual, "at": now}))
        except ConditionFailed:
            continue
        except RunplaneError as e:
            log.warning("fair share of %s in pool %s not recorded: %s", user, pool.name, e)
        return tag
    log.info("fair share of %s in pool %s: lane busy, run tagged %s", user, pool.name, tag)
    return tag
