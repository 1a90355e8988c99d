"""A run's secrets as its worker gives them: read after the claim by the worker holding the run,
each attempt afresh, into the container's environment, masked in its logs; a secret it cannot
have ends it ``secret_unavailable`` before any container exists. A real executor on the real
engine, on the stack of one machine (its SQLite secrets store and key file)."""

import time
import uuid

import pytest

from runplane.domain.errors import BackendError
from runplane.domain.runs import Run, RunSpec
from runplane.domain.secrets import MASK, SecretRecord, context, group_scope, user_scope
from runplane.domain.states import FailureReason, RunState
from runplane.domain.tenancy import Principal
from runplane.services import lifecycle
from runplane.services.logs import read_logs
from runplane.services.runs import submit_run
from worker_agent import executor as executor_module
from worker_agent.executor import RunExecutor
from worker_agent.run_config import AgentPorts, ExecutorConfig
from worker_agent.users import ImageUsers

pytestmark = pytest.mark.docker

WORKER = "w-secrets"
PRINT = 'echo "len=${#T}"; echo "value=$T"'


def put_secret(stack, scope, name, value):
    """A secret as the API stores it: sealed under the stack's key, bound to its scope and name."""
    sealed = stack.sealer.seal(value.encode(), context(scope, name))
    stack.secrets.put(
        SecretRecord(scope=scope, name=name, sealed=sealed, updated_at=time.time(), updated_by="t", size=len(value))
    )


def execute(stack, docker_client, tmp_path, run, ports=None, worker=WORKER, pull="never"):
    """Claim ``run`` (its next attempt) as ``worker`` and run it to its end; the run as stored afterwards."""
    claimed = lifecycle.claim(stack.store, run, run.attempt, worker, lease_seconds=60, now=time.time())
    # the test image is here already: no registry is asked
    work_dir = tmp_path / worker
    config = ExecutorConfig(worker_id=worker, work_dir=work_dir, stack_id=stack.settings.stack_id(), pull=pull)
    ports = ports or AgentPorts(stack.store, stack.queue, stack.objects, secrets=stack.secrets, opener=stack.opener)
    RunExecutor(claimed, ports, docker_client, config, time.time, users=ImageUsers(docker_client)).run_safely()
    return stack.store.get(run.id)


def submit(stack, principal, secrets, command=PRINT, **extra):
    spec = RunSpec.model_validate({"command": command, "queue": "manual", "secrets": secrets, **extra})
    return submit_run(stack.ports, principal, spec, None).run


def containers_of(docker_client, run):
    return docker_client.containers.list(all=True, sparse=True, filters={"label": f"io.runplane.run_id={run.id}"})


def test_a_run_gets_the_value_as_it_stands_when_it_starts_and_its_log_masks_it(local_stack, docker_client, tmp_path):
    alice = Principal(user="alice")
    put_secret(local_stack, user_scope("alice"), "mytoken", "first-value")
    kept, gone = submit(local_stack, alice, {"T": "mytoken"}), submit(local_stack, alice, {"T": "mytoken"})
    put_secret(local_stack, user_scope("alice"), "mytoken", "changed-value-2")  # after submit, before start
    ran = execute(local_stack, docker_client, tmp_path, kept)
    assert ran.state == RunState.SUCCEEDED, ran.failure
    assert read_logs(local_stack.objects, ran, "stdout", 0).data == f"len=15\nvalue={MASK}\n"
    assert "changed-value-2" not in ran.model_dump_json()
    local_stack.secrets.delete(user_scope("alice"), "mytoken")  # revoked before the second one starts
    failed = execute(local_stack, docker_client, tmp_path, gone)
    assert (failed.state, failed.failure.reason) == (RunState.FAILED, FailureReason.SECRET_UNAVAILABLE)
    assert failed.failure.message == "secret mytoken does not exist (or alice may not use it)"
    assert containers_of(docker_client, failed) == []
    assert failed.usage.timings.get("pull") is None  # ended before its image was even looked at


def test_each_attempt_reads_the_secret_afresh_on_the_worker_that_claims_it(local_stack, docker_client, tmp_path):
    put_secret(local_stack, user_scope("alice"), "mytoken", "first")
    retried = {"attempts": 2, "on": ["nonzero_exit"]}
    run = submit(local_stack, Principal(user="alice"), {"T": "mytoken"}, f"{PRINT}; exit 3", retry=retried)
    first = execute(local_stack, docker_client, tmp_path, run, worker="w-one")
    assert (first.state, first.attempt) == (RunState.QUEUED, 1)  # queued again for its second attempt
    put_secret(local_stack, user_scope("alice"), "mytoken", "the-second-value")
    second = execute(local_stack, docker_client, tmp_path, first, worker="w-two")
    assert (second.attempt, second.worker_id, second.failure.reason) == (2, "w-two", FailureReason.NONZERO_EXIT)
    logs = [read_logs(local_stack.objects, second, "stdout", 0, attempt=a).data for a in (1, 2)]
    assert logs == [f"len=5\nvalue={MASK}\n", f"len=16\nvalue={MASK}\n"]


def test_a_group_secret_is_a_members_and_a_run_whose_owner_is_not_in_the_group_never_gets_it(
    local_stack, docker_client, tmp_path
):
    put_secret(local_stack, group_scope("vision"), "hf", "group-hf-token")
    carol = Principal(user="carol", groups=["vision"])
    ran = execute(local_stack, docker_client, tmp_path, submit(local_stack, carol, {"T": "vision/hf"}))
    assert ran.owner_groups == ["vision"] and ran.state == RunState.SUCCEEDED, ran.failure
    assert read_logs(local_stack.objects, ran, "stdout", 0).data == f"len=14\nvalue={MASK}\n"
    # a record written into the store by other means than the API: its owner is in no group
    spec = RunSpec.model_validate({"command": PRINT, "queue": "manual", "secrets": {"T": "vision/hf"}})
    forged = Run(id=f"r-{uuid.uuid4().hex[:20]}", owner="alice", queue="manual", created_at=time.time(), spec=spec)
    local_stack.store.create(forged)
    refused = execute(local_stack, docker_client, tmp_path, forged)
    assert (refused.state, refused.failure.reason) == (RunState.FAILED, FailureReason.SECRET_UNAVAILABLE)
    assert "vision/hf does not exist" in refused.failure.message
    assert containers_of(docker_client, refused) == []


def test_a_worker_without_the_secrets_store_ends_the_run_secret_unavailable(local_stack, docker_client, tmp_path):
    put_secret(local_stack, user_scope("alice"), "mytoken", "some-value")
    run = submit(local_stack, Principal(user="alice"), {"T": "mytoken"})
    ports = AgentPorts(local_stack.store, local_stack.queue, local_stack.objects)  # an agent of an older make
    ended = execute(local_stack, docker_client, tmp_path, run, ports)
    assert (ended.state, ended.failure.reason) == (RunState.FAILED, FailureReason.SECRET_UNAVAILABLE)
    assert "without the secrets store" in ended.failure.message


class Throttled:
    """The secrets store or the key as they are while throttled or briefly down: each read raises
    BackendError (a port of the test's own, in the place of the stack's)."""

    def get(self, scope, name):
        raise BackendError("ThrottlingException: rate exceeded for internal-key-7")

    def open(self, sealed, ctx):
        raise BackendError("ThrottlingException: rate exceeded for internal-key-7")


@pytest.mark.parametrize("down", ["store", "key"])
def test_a_secrets_store_or_key_down_for_now_hands_the_attempt_back(
    local_stack, docker_client, tmp_path, monkeypatch, caplog, down
):
    """Not a secret the run may not have: its attempt goes back to its queue, with an event and a
    line of the agent's log saying why (not the backend's words), and a later attempt runs."""
    monkeypatch.setattr(executor_module, "HAND_BACK_PAUSE_SECONDS", 0.0)
    put_secret(local_stack, user_scope("alice"), "mytoken", "the-value")
    run = submit(local_stack, Principal(user="alice"), {"T": "mytoken"})
    store, opener = (Throttled(), local_stack.opener) if down == "store" else (local_stack.secrets, Throttled())
    ports = AgentPorts(local_stack.store, local_stack.queue, local_stack.objects, secrets=store, opener=opener)
    back = execute(local_stack, docker_client, tmp_path, run, ports)
    assert (back.state, back.failure, back.worker_id) == (RunState.QUEUED, None, None)
    what = (
        "the secrets store could not be read" if down == "store" else "cannot be opened: the key could not be reached"
    )
    assert what in back.events[-1].message and back.events[-1].message.startswith("re-queued: secret mytoken")
    assert f"worker {WORKER}" in back.waiting_reason and "internal-key-7" not in back.model_dump_json()
    assert any(f"run {run.id}:" in r.getMessage() and "handing it back" in r.getMessage() for r in caplog.records)
    assert containers_of(docker_client, back) == []
    ran = execute(local_stack, docker_client, tmp_path, back)  # the store and key are back
    assert (ran.state, ran.attempt) == (RunState.SUCCEEDED, 2), ran.failure
    assert read_logs(local_stack.objects, ran, "stdout", 0, attempt=2).data == f"len=9\nvalue={MASK}\n"


def test_an_image_pull_secret_whose_store_is_down_for_now_hands_the_attempt_back(
    local_stack, docker_client, tmp_path, monkeypatch
):
    """The run's image login is read from the store too, just before its pull: a store down for
    now hands the attempt back there as well (not secret_unavailable, nor image_unauthorized)."""
    monkeypatch.setattr(executor_module, "HAND_BACK_PAUSE_SECONDS", 0.0)
    put_secret(local_stack, user_scope("alice"), "creds", '{"username": "u", "password": "p"}')
    image = "127.0.0.1:9/runplane/absent:1"  # not on the engine: its login is read before the pull
    spec = RunSpec.model_validate({"command": "true", "queue": "manual", "image": image, "image_pull_secret": "creds"})
    run = Run(id=f"r-{uuid.uuid4().hex[:20]}", owner="alice", queue="manual", created_at=time.time(), spec=spec)
    local_stack.store.create(run)
    ports = AgentPorts(
        local_stack.store, local_stack.queue, local_stack.objects, secrets=Throttled(), opener=Throttled()
    )
    back = execute(local_stack, docker_client, tmp_path, run, ports, pull="missing")
    assert (back.state, back.failure) == (RunState.QUEUED, None)
    assert back.events[-1].message.startswith("re-queued: secret creds: the secrets store could not be read")
