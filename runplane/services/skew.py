"""The version skew policy as the control plane applies it (runplane.domain.versions): the record
it keeps for its agents to check themselves against when they register, and which workers' agents
it refuses, for the pools view and a waiting run's explanation. An agent that checks itself (0.2
on) reports its refusal in its worker item and takes no runs; an older one does not check, so the
control plane judges it by the version it reports."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from runplane import __version__
from runplane.domain.errors import RunplaneError
from runplane.domain.runs import Run
from runplane.domain.versions import StackRecord, agent_refusal, oldest_agent
from runplane.domain.workers import Worker
from runplane.ports import Ports

log = logging.getLogger(__name__)

MAX_REFUSED_SHOWN = 20
"""The most refused workers a pool's record names (the count of each version is always whole)."""
REFUSED_SHOWN_SECONDS = 3600.0
"""How long a worker refused at registration is shown after it was last heard from (its agent
exited then)."""


def publish(ports: Ports, version: str = __version__) -> bool:
    """Keep this control plane's record (``version``, the oldest agent series it allows) where
    agents read it when they register; written only when the one there says otherwise. True when
    written. A store that fails is logged: the next scheduled pass tries again."""
    workers = ports.workers
    record = StackRecord(version=version, oldest_agent=oldest_agent(version), written_at=ports.clock())
    try:
        current = workers.stack()
        if current is not None and (current.version, current.oldest_agent) == (record.version, record.oldest_agent):
            return False
        workers.put_stack(record)
    except RunplaneError as e:
        log.warning("the stack record for agents was not written: %s", e)
        return False
    log.info("stack record for agents: version %s, agents from %s", record.version, record.oldest_agent)
    return True


def refusal(worker: Worker, version: str = __version__) -> str | None:
    """Why a control plane of ``version`` refuses ``worker``'s agent: as the agent reported it at
    registration, or as its reported version says (an agent from before the check); None: it
    does not."""
    return worker.refused or agent_refusal(worker.agent_version, version)


def refused_lately(known: Sequence[Worker], alive: Sequence[Worker], now: float) -> list[Worker]:
    """The ``known`` workers that are not ``alive`` because they were refused when they registered
    (their agent exited then), within the last REFUSED_SHOWN_SECONDS."""
    live = {w.id for w in alive}
    return [w for w in known if w.id not in live and w.refused and now - w.heartbeat_at <= REFUSED_SHOWN_SECONDS]


def sort_out(pool: str, workers: Sequence[Worker], run: Run | None) -> tuple[str | None, list[Worker]]:
    """The ``workers`` of ``pool`` this control plane allows, and why ``run`` waits when only
    those it refuses would take it (None: some allowed worker would, or none at all would)."""
    outside = {w.id: why for w in workers if (why := refusal(w))}
    allowed = [w for w in workers if w.id not in outside]
    would = [w for w in workers if w.id in outside and (run is None or w.refuses(run) is None)]
    if would and not any(run is None or w.refuses(run) is None for w in allowed):
        return f"no worker of pool {pool} that this stack allows would take it: {outside[would[0].id]}", allowed
    return None, allowed


def census(
    known: Sequence[Worker], alive: Sequence[Worker], now: float, version: str = __version__
) -> tuple[dict[str, int], dict[str, str]]:
    """The live workers (``alive``) by agent version (``unknown`` for one that reported none), and
    the refused among ``known`` ones (worker id -> why, the latest MAX_REFUSED_SHOWN): live ones
    this control plane refuses, and those refused when they registered (their agent exited then)
    within the last REFUSED_SHOWN_SECONDS."""
    versions = Counter(w.agent_version or "unknown" for w in alive)
    refused: dict[str, str] = {}
    for worker in sorted([*alive, *refused_lately(known, alive, now)], key=lambda w: w.heartbeat_at, reverse=True):
        why = refusal(worker, version)
        if why and len(refused) < MAX_REFUSED_SHOWN:
            refused[worker.id] = why
    return dict(sorted(versions.items())), refused
