"""How runs, workers and pools look on the wire: the domain's records turned into the response
models of ``runplane.api.models`` (times become ISO 8601, UTC)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from runplane.api.models import (
    PoolLaunches,
    PoolRetention,
    PoolSessions,
    PoolShape,
    PoolView,
    PoolWorkerCounts,
    RetentionView,
    RunCheckpoint,
    RunEvent,
    RunFailure,
    RunUsage,
    RunView,
    SweepView,
    UploadView,
    WorkerView,
    timestamp,
)
from runplane.api.tenancy_models import (
    Me,
    QuotaUsage,
    QuotaView,
    SecretView,
    Token,
    UsageReport,
    UsageRow,
    UserView,
)
from runplane.domain.pools import Pool
from runplane.domain.retention import Retention
from runplane.domain.runs import Run
from runplane.domain.secrets import scope_parts
from runplane.domain.states import FailureReason, RunState
from runplane.domain.tenancy import ApiToken, Principal
from runplane.domain.workers import PoolRecord, Worker
from runplane.ports import Ports
from runplane.services.quota_admin import QuotaUse
from runplane.services.retention import shown
from runplane.services.secrets import Secret
from runplane.services.shown_sweeps import Shown
from runplane.services.tenancy import UserFacts
from runplane.services.uploads import UploadOffer
from runplane.services.usage import Report, Row
from runplane.services.watch import run_revision, sweep_revision


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def run_view(ports: Ports, run: Run, waiting_reason: str | None = None) -> RunView:
    """``run`` as its owner sees it; ``waiting_reason`` replaces the stored one (a queued run's
    reason explained afresh)."""
    return RunView(
        id=run.id,
        name=run.spec.name,
        state=run.state,
        owner=run.owner,
        queue=run.queue,
        group=run.group,
        spec=run.spec,
        attempt=run.attempt,
        max_attempts=run.max_attempts,
        worker_id=run.worker_id,
        created_at=timestamp(run.created_at),
        started_at=timestamp(run.started_at),
        finished_at=timestamp(run.finished_at),
        exit_code=run.exit_code,
        failure=RunFailure(reason=run.failure.reason, message=run.failure.message) if run.failure else None,
        waiting_reason=(waiting_reason or run.waiting_reason) if run.state == "queued" else None,
        waiting_on=list(run.waiting_on) if run.state == "queued" else [],
        priority=run.spec.priority,
        kill_requested=run.kill_requested,
        usage=RunUsage.model_validate(run.usage.model_dump()),
        events=[RunEvent(at=timestamp(e.at), state=e.state, message=e.message) for e in run.events],
        sweep_id=run.sweep_id,
        sweep_index=run.sweep_index,
        revision=run_revision(run),
        retention=retention_view(ports, run),
        checkpoint=checkpoint_view(run),
        pieces=run.pieces,
        preemptions=run.preemptions,
        fallback_at=timestamp(run.fallback_at) if run.state == "queued" else None,
    )


def checkpoint_view(run: Run) -> RunCheckpoint | None:
    """The newest checkpoint the run's worker recorded of it, once one is synced."""
    shown = run.checkpoint
    if shown is None:
        return None
    return RunCheckpoint(
        seq=shown.seq,
        attempt=shown.attempt,
        files=shown.files,
        bytes=shown.bytes,
        synced_at=timestamp(shown.synced_at),
        series=shown.series if shown.series != run.id else None,
    )


def retention_view(ports: Ports, run: Run) -> RetentionView | None:
    """How long ``run``'s outputs, logs and record are kept (while its owner keeps it, nothing is
    deleted: the dates say when they would be, once let go); None while it has not ended and is not
    kept."""
    dates = shown(ports, run)
    if dates is None and not run.kept:
        return None
    if dates is None:
        return RetentionView(kept=True, outputs_until=None, logs_until=None, record_until=None, deleted=[])
    return RetentionView(
        kept=run.kept,
        outputs_until=timestamp(dates.outputs_at),
        logs_until=timestamp(dates.logs_at),
        record_until=timestamp(dates.record_at),
        deleted=list(dates.deleted),
    )


def sweep_view(shown: Shown) -> SweepView:
    """A sweep with its members counted (live, or as its record last saw them)."""
    sweep, progress = shown.sweep, shown.progress
    return SweepView(
        id=sweep.id,
        name=sweep.spec.name,
        owner=sweep.owner,
        group=sweep.group,
        queue=sweep.queue,
        size=sweep.size,
        max_parallel=sweep.max_parallel,
        counts={RunState(k): v for k, v in progress.counts.items() if v},
        failures={FailureReason(k): v for k, v in progress.failures.items() if v},
        waiting=progress.waiting,
        waiting_for=progress.waiting_for,
        killed=sweep.killed,
        created_at=timestamp(sweep.created_at),
        finished_at=timestamp(sweep.finished_at),
        spec=sweep.spec,
        events=[RunEvent(at=timestamp(e.at), state=e.state, message=e.message) for e in sweep.events],
        revision=sweep_revision(sweep),
    )


def worker_view(worker: Worker) -> WorkerView:
    """A worker as its caller may see it (``overview.seen_worker`` has judged it)."""
    data = worker.model_dump(exclude={"v"})
    data["started_at"] = timestamp(worker.started_at)
    data["heartbeat_at"] = timestamp(worker.heartbeat_at)
    return WorkerView.model_validate(data)


def pool_view(
    pool: Pool, backlog: int, counts: Mapping[str, int], record: PoolRecord, stack_retention: Retention
) -> PoolView:
    """``pool`` with its backlog and workers by status (``counts``), its record, and its retention over
    ``stack_retention`` (the stack's)."""
    kept = pool.kept(stack_retention)
    return PoolView(
        name=pool.name,
        backend=pool.backend,
        shape=PoolShape(
            cpus=pool.cpus,
            gpus=pool.gpus,
            gpu_type=pool.gpu_type,
            memory=pool.memory,
            disk=pool.disk,
            slots=pool.slots,
        ),
        min_workers=pool.min_workers,
        max_workers=pool.max_workers,
        default_image=pool.default_image,
        default_time=pool.default_time,
        max_time=pool.max_time,
        max_user_priority=pool.max_user_priority,
        max_waiting_runs=pool.max_waiting_runs,
        max_open_sweeps=pool.max_open_sweeps,
        fair_share_half_life=pool.fair_share_half_life,
        price_per_hour=pool.price_per_hour,
        retry=pool.retry,
        backlog=backlog,
        workers=PoolWorkerCounts(**{status: counts.get(status, 0) for status in PoolWorkerCounts.model_fields}),
        counted_at=timestamp(record.counted_at),
        launches=PoolLaunches(
            launched=record.launched,
            failed=record.failed_launches,
            failed_in_a_row=record.consecutive_failures,
            last_launch_at=timestamp(record.last_launch_at),
        ),
        last_error=record.last_error,
        last_error_at=timestamp(record.last_error_at),
        disabled=record.disabled_reason,
        last_decision=record.last_decision,
        agent_versions=record.agent_versions,
        refused_workers=record.refused,
        retention=PoolRetention(outputs=kept.seconds("outputs"), logs=kept.seconds("logs"), runs=kept.seconds("runs")),
        sessions=PoolSessions(
            allow_exec=pool.allow_exec,
            allow_admin_exec=pool.allow_admin_exec,
            max_sessions_per_run=pool.max_sessions_per_run,
        ),
    )


def token_view(token: ApiToken) -> Token:
    return Token(
        id=token.id,
        user=token.user,
        groups=token.groups,
        scopes=token.scopes,
        created_at=iso(token.created_at) or "",
        expires_at=iso(token.expires_at),
        created_by=token.created_by,
    )


def me_view(principal: Principal) -> Me:
    return Me(
        user=principal.user,
        groups=principal.groups,
        scopes=principal.scopes,
        token_id=principal.token_id,
        default_group=principal.default_group,
    )


def user_view(facts: UserFacts) -> UserView:
    record = facts.record
    return UserView(
        user=facts.user,
        groups=facts.groups,
        default_group=record.default_group if record is not None else None,
        updated_at=iso(record.updated_at) if record is not None else None,
        updated_by=record.updated_by if record is not None else None,
    )


def quota_view(found: QuotaUse) -> QuotaView:
    """A quota with its use now (budgets in hours)."""
    quota, use = found.quota, found.use
    return QuotaView(
        kind=quota.kind,
        name=quota.name,
        max_running=quota.max_running,
        max_gpus=quota.max_gpus,
        max_cpus=quota.max_cpus,
        gpu_hours=quota.gpu_hours,
        cpu_hours=quota.cpu_hours,
        period=quota.period,
        updated_at=timestamp(quota.updated_at),
        usage=QuotaUsage(
            running=use.running,
            gpus=use.gpus,
            cpus=use.cpus,
            gpu_hours=use.gpu_hours,
            cpu_hours=use.cpu_hours,
            period=use.period,
        ),
    )


def secret_view(secret: Secret) -> SecretView:
    """A secret's name, owner and size: never its value, nor its sealed form."""
    record = secret.record
    kind, owner = scope_parts(record.scope)
    return SecretView(
        name=record.name,
        ref=secret.ref,
        scope="user" if kind == "user" else "group",
        owner=owner,
        size=record.size,
        updated_at=record.updated_at,
        updated_by=record.updated_by,
    )


def upload_view(offer: UploadOffer) -> UploadView:
    """An upload offer: there already, or the URL and headers to PUT the archive with."""
    return UploadView(
        source=offer.source,
        sha256=offer.sha256,
        size=offer.size,
        present=offer.present,
        url=offer.url,
        headers=offer.headers,
        expires_at=offer.expires_at,
    )


def _usage_row(row: Row) -> UsageRow:
    """A row of a usage report, its sums rounded off (to the millisecond, the nano-unit of cost)."""
    cost = None if row.cost is None else round(row.cost, 9)
    return UsageRow(
        key=row.key,
        runs=row.runs,
        cpu_seconds=round(row.cpu_seconds, 3),
        gpu_seconds=round(row.gpu_seconds, 3),
        cost=cost,
    )


def usage_view(report: Report) -> UsageReport:
    return UsageReport(
        by=report.by,
        since=datetime.fromtimestamp(report.since, UTC),
        until=datetime.fromtimestamp(report.until, UTC),
        user=report.user,
        group=report.group,
        pool=report.pool,
        rows=[_usage_row(r) for r in report.rows],
        total=_usage_row(report.total),
    )
