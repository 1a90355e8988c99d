"""The figures the functions publish (EMF documents on stdout) and a worker serves (Prometheus text)."""

import json
import urllib.error
import urllib.request

import pytest

from runplane import metrics
from runplane.domain.runs import Event, Failure, Run, RunSpec
from runplane.domain.states import FailureReason, RunState
from runplane.services.dispatch import PoolFigures
from worker_agent.metrics import AgentMetrics, Gauges, serve


def documents(capsys):
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def figures(docs):
    """(name, value, dimensions) of each EMF document."""
    out = []
    for doc in docs:
        [directive] = doc["_aws"]["CloudWatchMetrics"]
        assert directive["Namespace"] == "runplane"
        [metric] = directive["Metrics"]
        dims = {key: doc[key] for key in directive["Dimensions"][0]}
        out.append((metric["Name"], doc[metric["Name"]][0], metric["Unit"], dims))
    return out


def test_a_pass_over_a_pool_publishes_its_depth_its_workers_by_status_and_its_launches(capsys, monkeypatch):
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    monkeypatch.delenv("POWERTOOLS_DEV", raising=False)
    metrics.pool_figures("gpu", PoolFigures(backlog=7, workers={"idle": 2, "starting": 1}, launched=3))
    got = figures(documents(capsys))
    assert ("QueueDepth", 7.0, "Count", {"service": "dispatcher", "pool": "gpu"}) in got
    workers = {d["status"]: v for name, v, _, d in got if name == "Workers"}
    assert workers == {"starting": 1.0, "idle": 2.0, "busy": 0.0, "draining": 0.0, "offline": 0.0}
    assert ("WorkersLaunched", 3.0, "Count", {"service": "dispatcher", "pool": "gpu"}) in got
    assert not [f for f in got if f[0] == "LaunchFailures"]
    metrics.pool_figures("gpu", PoolFigures(backlog=0, launch_failed=True))
    got = figures(documents(capsys))
    assert ("LaunchFailures", 1.0, "Count", {"service": "dispatcher", "pool": "gpu"}) in got
    assert not [f for f in got if f[0] == "WorkersLaunched"]


def test_a_run_end_publishes_its_state_reason_and_wait(capsys, monkeypatch):
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    monkeypatch.delenv("POWERTOOLS_DEV", raising=False)
    metrics.run_ended("cpu", "failed", "out_of_memory", 2.5)
    metrics.run_ended("cpu", "killed", "killed", None)  # never started: no wait to count
    got = figures(documents(capsys))
    cpu = {"service": "dispatcher", "pool": "cpu"}
    assert got == [
        ("RunsEnded", 1.0, "Count", {**cpu, "state": "failed", "reason": "out_of_memory"}),
        ("SecondsToRunning", 2.5, "Seconds", cpu),
        ("RunsEnded", 1.0, "Count", {**cpu, "state": "killed", "reason": "killed"}),
    ]


def test_disabled_metrics_print_nothing(capsys, monkeypatch):
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    metrics.run_ended("cpu", "succeeded", None, 1.0)
    metrics.pool_figures("cpu", PoolFigures(backlog=1))
    assert documents(capsys) == []


def run(state, reason=None, started=None):
    events = [Event(at=100.0, state=RunState.QUEUED, message="submitted")]
    if started is not None:
        events.append(Event(at=started, state=RunState.RUNNING, message="started"))
    return Run(
        id="r-1",
        owner="alice",
        queue="cpu",
        spec=RunSpec(command="true", image="busybox"),
        state=state,
        created_at=100.0,
        started_at=started,
        events=events,
        failure=Failure(reason=reason, message="x") if reason else None,
    )


def test_a_worker_counts_its_runs_ends_and_waits_and_renders_them_as_prometheus_text():
    m = AgentMetrics("cpu", 'w-"1"')
    m.run_ended(run(RunState.SUCCEEDED, started=101.5), {"claim": 0.02})
    m.run_ended(run(RunState.SUCCEEDED, started=100.5), {"claim": 0.04})
    m.run_ended(run(RunState.KILLED, FailureReason.KILLED), {})
    text = m.render(Gauges(slots=4, active=1, gpus=2))
    labels = 'pool="cpu",worker="w-\\"1\\""'
    assert f"runplane_worker_slots{{{labels}}} 4\n" in text
    assert f"runplane_worker_runs_active{{{labels}}} 1\n" in text
    assert f"runplane_worker_gpus{{{labels}}} 2\n" in text
    assert f'runplane_worker_runs_ended_total{{{labels},state="succeeded",reason="none"}} 2\n' in text
    assert f'runplane_worker_runs_ended_total{{{labels},state="killed",reason="killed"}} 1\n' in text
    assert f"runplane_worker_seconds_to_running_sum{{{labels}}} 2\n" in text
    assert f"runplane_worker_seconds_to_running_count{{{labels}}} 2\n" in text
    assert f"runplane_worker_claim_seconds_count{{{labels}}} 2\n" in text
    assert "# TYPE runplane_worker_runs_ended_total counter" in text
    for line in text.splitlines():  # every sample line is `name{labels} value`
        if not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            assert name.startswith("runplane_worker_") and name.endswith("}") and float(value) >= 0


def test_the_metrics_endpoint_serves_metrics_and_nothing_else():
    m = AgentMetrics("cpu", "w-1")
    server = serve(m, lambda: Gauges(slots=1, active=0, gpus=0), "127.0.0.1", 0)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert 'runplane_worker_slots{pool="cpu",worker="w-1"} 1' in resp.read().decode()
        for path in ("/", "/metrics/../etc/passwd", "/admin"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5)
            assert e.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_large_figures_keep_every_digit_and_attempts_handed_back_are_not_ends():
    m = AgentMetrics("cpu", "w-1")
    m.run_ended(run(RunState.QUEUED, started=101.0), {"claim": 1.0})  # handed back: not an end
    assert "runs_ended_total{" not in m.render(Gauges(slots=1, active=0, gpus=0))
    m.to_running = [1234567.125, 2_000_001]
    text = m.render(Gauges(slots=1234567, active=0, gpus=0))
    assert 'runplane_worker_slots{pool="cpu",worker="w-1"} 1234567\n' in text
    assert 'runplane_worker_seconds_to_running_sum{pool="cpu",worker="w-1"} 1234567.125\n' in text
    assert 'runplane_worker_seconds_to_running_count{pool="cpu",worker="w-1"} 2000001\n' in text
