"""The version skew policy as the control plane applies it (runplane.domain.versions): the record
it keeps for its agents to check themselves against when they register, and which workers' agents
it refuses, for the pools view and a waiting run's explanation. An agent that checks itself (0.2
on) reports its refusal in its worker item and takes no runs; an older one does not check, so the
control plane judges it by the version it reports."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from runplane import __version__
from runplane.domain.errors import NotFound, RunplaneError
from runplane.domain.runs import Run, RunSpec
from runplane.domain.uploads import upload_sha
from runplane.domain.versions import StackRecord, agent_refusal, oldest_agent, series
from runplane.domain.wire import Since, stored, written_json
from runplane.domain.workers import Worker
from runplane.ports import ObjectStore, Ports

log = logging.getLogger(__name__)

STACK_KEY = "runs/_stack/record.json"
"""Where the control plane keeps its record for agents: in the object store, under ``runs/`` that
every agent may read, and where no listing of workers meets it (0.1's functions scan the whole
workers table and refuse an item that is no worker). ``_stack`` is no run id."""
STACK_CHECK_SECONDS = 300.0
"""How often a serving agent reads the stack record again, to drain when the control plane moved on
past its version window."""
MAX_REFUSED_SHOWN = 20
"""The most refused workers a pool's record names (the count of each version is always whole)."""
REFUSED_SHOWN_SECONDS = 3600.0
"""How long a worker refused at registration is shown after it was last heard from (its agent
exited then)."""


def stack_record(objects: ObjectStore) -> StackRecord | None:
    """The control plane's record for its agents (its version, the oldest agent it allows); None
    when none was written (a control plane from before the version check) or it is no record this
    release reads. Raises RunplaneError when the store fails."""
    try:
        return stored(StackRecord, objects.get_bytes(STACK_KEY))
    except NotFound:
        return None
    except ValidationError:
        log.warning("the stack record at %s is not one this release reads: as if there were none", STACK_KEY)
        return None


def put_stack_record(objects: ObjectStore, record: StackRecord) -> None:
    """Write the control plane's record, replacing the one there."""
    objects.put_bytes(STACK_KEY, written_json(record).encode())


def publish(ports: Ports, version: str = __version__) -> bool:
    """Keep this control plane's record (``version``, the oldest agent series it allows) where
    agents read it when they register; written only when the one there says otherwise, and never
    over the record of a later series (whose functions serve beside these during a deploy). True
    when written. A store that fails is logged: the next scheduled pass tries again."""
    record = StackRecord(version=version, oldest_agent=oldest_agent(version), written_at=ports.clock())
    try:
        current = stack_record(ports.objects)
        if current is not None and (current.version, current.oldest_agent) == (record.version, record.oldest_agent):
            return False
        ours, theirs = series(version), series(current.version) if current is not None else None
        if current is not None and ours is not None and theirs is not None and theirs > ours:
            # a later series' functions are serving beside these during a deploy: stepping the
            # record back would refuse (or drain) the agents that later release already started
            log.info("stack record left at version %s (this control plane is %s)", current.version, version)
            return False
        put_stack_record(ports.objects, record)
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


def unknown_fields(model: BaseModel, at: str) -> list[str]:
    """The fields of ``model`` (a record read with ``stored``, named ``at``) that this release does
    not know, at every depth, as dotted names (``spec.secrets``, ``spec.resources.nodes``; an item
    of a list is named by its list), each once."""
    found = [f"{at}.{name}" for name in model.__pydantic_extra__ or {}]
    for name in type(model).model_fields:
        found.extend(_unknown_in(getattr(model, name), f"{at}.{name}"))
    return list(dict.fromkeys(found))


def _unknown_in(value: Any, at: str) -> list[str]:
    if isinstance(value, BaseModel):
        return unknown_fields(value, at)
    if isinstance(value, list | tuple):
        return [name for item in value for name in _unknown_in(item, at)]
    if isinstance(value, dict):
        return [name for key, item in value.items() for name in _unknown_in(item, f"{at}.{key}")]
    return []


def not_understood(run: Run, version: str = __version__) -> str | None:
    """Why an agent of ``version`` does not take ``run``: its spec holds fields this release does
    not know (a later release's, which it must not silently ignore: secrets, nodes, ...). None: it
    knows the whole spec. Fields outside the spec, the control plane's alone, do not count."""
    unknown = unknown_fields(run.spec, "spec")
    return f"it needs an agent that knows {', '.join(unknown)} (this agent is {version})" if unknown else None


def needs(run: Run) -> dict[str, str | None]:
    """The fields of ``run``'s spec that an older agent may not know, with the release that brought
    each (``Since``, set to other than its default: ``written`` leaves it out otherwise), or None
    for one this release does not know either (a later release wrote it)."""
    found: dict[str, str | None] = dict.fromkeys(unknown_fields(run.spec, "spec"))
    found.update(_since(run.spec, "spec"))
    found.update(_upload_inputs(run.spec))
    return found


UPLOADS_SINCE = "0.3"
"""The release whose agents fetch an ``upload:`` input (an input kind, not a field: ``Since`` cannot mark it)."""


def _upload_inputs(spec: RunSpec) -> dict[str, str | None]:
    return {f"spec.inputs.{name}": UPLOADS_SINCE for name, source in spec.inputs.items() if upload_sha(source)}


def _since(model: BaseModel, at: str) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        marks = [m.release for m in field.metadata if isinstance(m, Since)]
        if marks and value != field.get_default(call_default_factory=True):
            found[f"{at}.{name}"] = marks[0]
        elif isinstance(value, BaseModel):
            found.update(_since(value, f"{at}.{name}"))
    return found


def later_fields(spec: RunSpec) -> dict[str, str | None]:
    """The fields ``spec`` sets that were added since the previous release (``Since``, set to other
    than its default), at every depth, as dotted names from ``spec``, with the release of each; and
    its ``upload:`` inputs (``spec.inputs.NAME``), which agents before UPLOADS_SINCE cannot fetch."""
    return {**_since(spec, "spec"), **_upload_inputs(spec)}


def too_new_for(pool: str, spec: RunSpec, agent_versions: Mapping[str, int]) -> str | None:
    """Why a run or sweep of ``spec`` is refused in ``pool`` whose live agents are of
    ``agent_versions`` (its record's, as the dispatcher counted them): it sets a field added since
    the previous release (``Since``, not at its default) that some of those agents do not know, so
    they would leave it waiting; the message says what to do. None: every agent knows every field it sets."""
    wanted = later_fields(spec)
    lacking = {
        name.removeprefix("spec."): release
        for name, release in wanted.items()
        if any(not _knows(version, release) for version in agent_versions)
    }
    if not lacking:
        return None
    fields = ", ".join(lacking)
    need = max(lacking.values(), key=lambda release: series(release or "") or (0, 0))
    older = sorted(v for v in agent_versions if any(not _knows(v, r) for r in lacking.values()))
    return (
        f"{fields} need agents {need} or newer; pool {pool!r} has agents {', '.join(older)}: "
        "upgrade the pool's agents (README.md, Upgrading)"
    )


def _knows(agent_version: str, release: str | None) -> bool:
    """Whether an agent of ``agent_version`` knows a field of ``release`` (None: one later than
    this control plane's; an agent from before versions were reported knows no later field)."""
    have, since = series(agent_version), series(release or "")
    return have is not None and since is not None and have >= since


def understood(pool: str, workers: Sequence[Worker], run: Run | None) -> tuple[str | None, list[Worker]]:
    """The ``workers`` whose agent knows every field of ``run``'s spec (all of them, with no run),
    and why ``run`` waits when there are workers and none of them does."""
    wanted = needs(run) if run is not None else {}
    if not wanted:
        return None, list(workers)
    knowing = [w for w in workers if all(_knows(w.agent_version, release) for release in wanted.values())]
    if knowing or not workers:
        return None, knowing
    lacking = [name for name, release in wanted.items() if not any(_knows(w.agent_version, release) for w in workers)]
    versions = sorted({w.agent_version or "unknown" for w in workers})
    return f"needs an agent that knows {', '.join(lacking)}; the agents of pool {pool} are {', '.join(versions)}", []


def takers(pool: str, workers: Sequence[Worker], run: Run | None) -> tuple[str | None, list[Worker]]:
    """The ``workers`` this control plane allows (``sort_out``) whose agent knows ``run``'s spec
    (``understood``), and why ``run`` waits when that leaves none that would take it."""
    refused, allowed = sort_out(pool, workers, run)
    if refused:
        return refused, allowed
    return understood(pool, allowed, run)
