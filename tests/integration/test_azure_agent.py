"""A worker agent on an Azure stack, configured by RUNPLANE_* settings alone: it takes a run from
its Storage Queue, runs it in a real container, and leaves the run and its logs in Table and
Blob storage on Azurite."""

import os

import pytest

from runplane.domain.asks import RetryRule
from runplane.domain.runs import RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.services.logs import read_logs
from runplane.services.runs import submit_run
from tests.conftest import POOLS_FILE, AgentProcess, wait_for

pytestmark = pytest.mark.docker


def run_agent(stack, tmp_path, worker_id, runs, seconds):
    """An agent of ``stack``'s pool "manual", configured by RUNPLANE_* settings alone, until it
    has done ``runs`` runs (at most ``seconds``)."""
    env = {
        **os.environ,
        "RUNPLANE_CLOUD": "azure",
        "RUNPLANE_PREFIX": stack.settings.prefix,
        "RUNPLANE_AZURE_STORAGE_CONNECTION_STRING": stack.settings.azure_storage_connection_string,
        "RUNPLANE_POOLS": str(POOLS_FILE),
    }
    agent = AgentProcess(tmp_path, "--exit-after-num-runs", str(runs), worker_id=worker_id, env=env)
    try:
        assert agent.wait(seconds) == 0, agent.log.read_text()[-3000:]
    finally:
        agent.stop()


def test_an_agent_runs_a_run_of_an_azure_stack(azure_stack, docker_client, tmp_path):
    stack = azure_stack
    spec = RunSpec(command="echo hello from azure; echo oops >&2; exit 3", queue="manual")
    run = submit_run(stack.ports, Principal(user="alice"), spec, None).run
    run_agent(stack, tmp_path, "azure-w1", runs=1, seconds=60)
    done = wait_for(lambda: (r := stack.store.get(run.id)).state.terminal and r, 10, 0.1, "the run to end")
    assert (done.state, done.exit_code, done.worker_id, done.attempt) == (RunState.FAILED, 3, "azure-w1", 1)
    assert read_logs(stack.objects, done, "stdout", 0).data == "hello from azure\n"
    assert read_logs(stack.objects, done, "stderr", 0).data == "oops\n"
    assert stack.store.count("manual", RunState.QUEUED) == 0
    assert stack.queue.receive("manual", 10, wait_seconds=0, visibility_seconds=30) == []


def test_an_agent_of_an_azure_stack_takes_the_first_run_in_line(azure_stack, docker_client, tmp_path):
    """The hint it receives first is of a run of priority 10; a run of priority 90 came later and
    is first in line: that is the one it starts (its one run), and the other stays queued."""
    stack = azure_stack
    admin = Principal(user="admin", scopes=["runs:read", "runs:write", "admin"])

    def submit(priority):
        spec = RunSpec(command="echo hello", queue="manual", priority=priority)
        return submit_run(stack.ports, admin, spec, None).run

    low, high = submit(10), submit(90)
    assert [r.id for r in stack.store.head("manual", 10)] == [high.id, low.id]
    run_agent(stack, tmp_path, "azure-w2", runs=1, seconds=60)
    done = wait_for(lambda: (r := stack.store.get(high.id)).state.terminal and r, 10, 0.1, "the run to end")
    assert (done.state, done.worker_id) == (RunState.SUCCEEDED, "azure-w2")
    assert stack.store.get(low.id).state == RunState.QUEUED
    assert [r.id for r in stack.store.head("manual", 10)] == [low.id]
    # the low run's hint was passed on as a fresh message: handed back, its receives would count
    # towards the poison queue although nothing is wrong with it
    hints = stack.queue.receive("manual", 10, wait_seconds=0, visibility_seconds=30)
    assert [d.receive_count for d in hints if d.message.run_id == low.id] == [1]


def test_an_agent_of_an_azure_stack_retries_what_the_rule_names(azure_stack, docker_client, tmp_path):
    stack = azure_stack
    command = 'echo "try $RUNPLANE_ATTEMPT"; [ "$RUNPLANE_ATTEMPT" -ge 2 ] || exit 3'
    spec = RunSpec(command=command, queue="manual", retry=RetryRule(attempts=2, on=["nonzero_exit"]))
    run = submit_run(stack.ports, Principal(user="alice"), spec, None).run
    run_agent(stack, tmp_path, "azure-w3", runs=2, seconds=90)
    done = wait_for(lambda: (r := stack.store.get(run.id)).state.terminal and r, 10, 0.1, "the run to end")
    assert (done.state, done.attempt, done.exit_code) == (RunState.SUCCEEDED, 2, 0)
    assert read_logs(stack.objects, done, "stdout", 0, attempt=1).data == "try 1\n"
    assert read_logs(stack.objects, done, "stdout", 0).data == "try 2\n"
    assert any(e.message.startswith("attempt 1 ended nonzero_exit: ") for e in done.events)
