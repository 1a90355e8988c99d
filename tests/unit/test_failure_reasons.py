"""The failure reasons a user can meet: README.md documents exactly these, the OpenAPI document
lists them, and each one is produced by the code path that writes it.

``PRODUCED`` holds, for every reason, how it is produced: functions of this module that drive the
agent's or the control plane's own code to that reason here (a unit's worth of work each), and the
node ids of tests elsewhere that drive a real run (or a real store) to it and assert it. A reason
with neither fails ``test_each_reason_is_produced``; so does a test named here that is gone or no
longer names its reason. A new reason is added with a producer here (or the test that sees it).
"""

import ast
import re
from collections.abc import Callable
from pathlib import Path

import docker.errors
import pytest

from runplane.api.openapi import openapi_document
from runplane.domain.asks import Resources
from runplane.domain.runs import Run, RunSpec, Usage
from runplane.domain.states import FailureReason, RunState
from worker_agent.containers import create_failure, pull_failure
from worker_agent.limits import REMOVED, Limits, Seen, disk_over, ended, stop
from worker_agent.outcome import Outcome
from worker_agent.resources import Allocation, Gpu
from worker_agent.run_config import AgentPorts
from worker_agent.run_state import RunStateWriter
from worker_agent.secrets import RunSecrets
from worker_agent.usage import Tree

ROOT = Path(__file__).resolve().parents[2]
MiB = 1024**2
LIMITS = Limits(time=60.0, disk=10 * MiB, memory=64 * MiB, max_output_files=100, max_log_size=MiB)
GPU = Gpu(0, "GPU-aaaaaaaa-1111-2222-3333-444444444444", "NVIDIA H100 80GB HBM3")

Producer = Callable[[], FailureReason | None]
HERE: dict[FailureReason, list[Producer]] = {}
"""Per reason, this module's functions that produce it; each returns the reason it got."""


def produces(reason: FailureReason) -> Callable[[Callable[[], Outcome]], Producer]:
    def register(make: Callable[[], Outcome]) -> Producer:
        def producer() -> FailureReason | None:
            return make().reason

        producer.__name__ = make.__name__
        HERE.setdefault(reason, []).append(producer)
        return producer

    return register


ELSEWHERE: dict[FailureReason, list[str]] = {
    # through a real agent on Docker, or a real store, seen through the API or the store
    FailureReason.NONZERO_EXIT: ["tests/e2e/test_runs.py::test_nonzero_exit_fails_with_code_and_stderr_tail"],
    FailureReason.IMAGE_NOT_FOUND: ["tests/e2e/test_runs.py::test_missing_image"],
    FailureReason.IMAGE_UNAUTHORIZED: [
        "tests/integration/test_private_images.py::test_a_cached_private_image_is_used_only_after_the_runs_own_check"
    ],
    FailureReason.IMAGE_TOO_LARGE: [
        "tests/security/test_worker_reservations.py::test_an_image_over_the_pools_cap_is_refused"
    ],
    FailureReason.OUT_OF_MEMORY: ["tests/e2e/test_runs.py::test_memory_limit_is_out_of_memory"],
    FailureReason.TIME_LIMIT: ["tests/e2e/test_runs.py::test_time_limit"],
    FailureReason.DISK_LIMIT: ["tests/e2e/test_agent.py::test_disk_limit"],
    FailureReason.LOG_LIMIT: [
        "tests/security/test_containment.py::test_a_log_over_the_limit_stops_the_run_and_docker_keeps_little"
    ],
    FailureReason.KILLED: ["tests/e2e/test_api.py::test_kill_queued_run_is_immediate_and_final"],
    FailureReason.WORKER_LOST: ["tests/integration/test_handlers.py::test_reap_outcomes"],
    FailureReason.INPUT_UNAVAILABLE: ["tests/e2e/test_runs.py::test_missing_input_is_input_unavailable"],
    FailureReason.UPLOAD_FAILED: [
        "tests/e2e/test_agent_promises.py::test_an_upload_the_object_store_refuses_fails_the_run"
    ],
    FailureReason.CONTAINER_ERROR: ["tests/e2e/test_runs.py::test_container_removed_from_outside_is_a_clear_failure"],
    FailureReason.GPU_UNAVAILABLE: [
        "tests/integration/test_docker_gpu.py::test_gpu_run_without_nvidia_runtime_fails_gpu_unavailable"
    ],
    FailureReason.AGENT_ERROR: [
        "tests/security/test_containment.py::test_a_run_id_that_is_no_run_id_touches_nothing_on_the_host"
    ],
    FailureReason.DEPENDENCY_FAILED: [
        "tests/integration/contracts/test_dependencies.py::"
        "test_a_run_waiting_for_a_failed_run_ends_dependency_failed_and_so_does_what_waits_for_it"
    ],
    FailureReason.NOT_PERMITTED: [
        "tests/security/test_authority.py::test_a_member_released_after_its_owner_left_the_group_ends_not_permitted",
        "tests/security/test_authority.py::"
        "test_a_waiting_run_released_after_its_owner_left_the_group_is_not_run_charged_to_it",
    ],
    FailureReason.SECRET_UNAVAILABLE: [
        "tests/integration/test_agent_secrets.py::test_a_run_gets_the_value_as_it_stands_when_it_starts_and_its_log_masks_it"
    ],
}
"""Per reason, tests elsewhere that drive a run to it through the whole path and assert it."""


@produces(FailureReason.NONZERO_EXIT)
def exit_code_3() -> Outcome:
    return ended(None, {"Status": "exited", "ExitCode": 3}, {"StatusCode": 3}, LIMITS)


@produces(FailureReason.OUT_OF_MEMORY)
def oom_killed() -> Outcome:
    return ended(None, {"Status": "exited", "ExitCode": 137, "OOMKilled": True}, {"StatusCode": 137}, LIMITS)


@produces(FailureReason.TIME_LIMIT)
def past_the_time_limit() -> Outcome | None:
    return stop(Seen(elapsed=60.5), LIMITS)


@produces(FailureReason.DISK_LIMIT)
def past_the_disk_limit() -> Outcome | None:
    return disk_over(Tree(size=8 * MiB, entries=1), Tree(), Tree(size=3 * MiB, entries=1), LIMITS)


@produces(FailureReason.DISK_LIMIT)
def an_unwalkable_tree() -> Outcome | None:
    return disk_over(Tree(unreadable="permission denied"), Tree(), Tree(), LIMITS)


@produces(FailureReason.LOG_LIMIT)
def past_the_log_limit() -> Outcome | None:
    return stop(Seen(elapsed=1, log_bytes=MiB + 1), LIMITS)


@produces(FailureReason.KILLED)
def a_kill_asked_for() -> Outcome | None:
    return stop(Seen(elapsed=1, kill=True), LIMITS)


@produces(FailureReason.WORKER_LOST)
def a_lost_lease() -> Outcome | None:
    return stop(Seen(elapsed=1, lease_lost=True), LIMITS)


@produces(FailureReason.CONTAINER_ERROR)
def removed_under_the_run() -> Outcome:
    outcome = ended(None, {"Status": "removing"}, {}, LIMITS)
    assert outcome.message == REMOVED
    return outcome


@produces(FailureReason.CONTAINER_ERROR)
def an_engine_error_at_create() -> Outcome:
    return create_failure(docker.errors.APIError("500", explanation="no space left on device"), None)


@produces(FailureReason.IMAGE_UNAUTHORIZED)
def a_registry_that_asks_for_a_login() -> Outcome:
    # the engine's words for a registry with authentication asked without a login (tests/registry.py)
    error = docker.errors.APIError(
        "500", explanation='Head "http://127.0.0.1:5000/v2/lab/private/manifests/1": no basic auth credentials'
    )
    outcome = pull_failure("127.0.0.1:5000/lab/private:1", None, error, "could not be pulled")
    assert outcome.message.startswith("registry 127.0.0.1:5000 needs a login for image 127.0.0.1:5000/lab/private:1")
    return outcome


@produces(FailureReason.GPU_UNAVAILABLE)
def no_nvidia_runtime() -> Outcome:
    error = docker.errors.APIError("500", explanation='could not select device driver "" with capabilities: [[gpu]]')
    return create_failure(error, Allocation(cpus=(0,), gpus=(GPU,)))


class _OneRun:
    """A store of one run that applies every write it is given (the run_state writer's view)."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def get(self, run_id: str) -> Run:
        return self.run

    def update(self, run: Run, expect: object, changes: dict[str, object], event: object = None) -> Run:
        events = [*self.run.events, event] if event is not None else self.run.events
        self.run = self.run.model_copy(update={**changes, "events": events})
        return self.run


class _Queue:
    def send(self, pool: str, message: object) -> None:
        pass

    def notify(self, event: object, delay_seconds: int = 0) -> None:
        pass


@produces(FailureReason.AGENT_ERROR)
def a_failure_that_names_no_reason() -> Outcome:
    spec = RunSpec(command="true", resources=Resources(memory=64 * MiB))
    run = Run(id="r-1", owner="ada", queue="cpu", created_at=0.0, spec=spec, state=RunState.RUNNING, attempt=1)
    store = _OneRun(run)
    writer = RunStateWriter(run, AgentPorts(store, _Queue(), objects=None), lambda: 1.0)
    writer.finish(Outcome(RunState.FAILED, None, "broke"), Usage())
    assert store.run.failure is not None
    return Outcome(store.run.state, store.run.failure.reason)


@produces(FailureReason.SECRET_UNAVAILABLE)
def a_secret_the_worker_cannot_read() -> Outcome:
    spec = RunSpec(command="true", resources=Resources(memory=64 * MiB), secrets={"TOKEN": "vision/token"})
    run = Run(id="r-1", owner="ada", queue="cpu", created_at=0.0, spec=spec, state=RunState.RUNNING, attempt=1)
    environment, outcome = RunSecrets(None, None).for_container(run)  # ada is in no group
    assert environment == {} and outcome is not None
    return outcome


def documented_reasons() -> set[str]:
    """The reasons named in README.md's list, "Failures carry `{reason, message}`: ..." up to the
    sentence's end (parenthesised remarks inside it left out)."""
    text = (ROOT / "README.md").read_text()
    start = text.index("Failures carry `{reason, message}`:")
    sentence = text[start : text.index(". ", start)]
    listed = re.sub(r"\([^)]*\)", "", sentence.partition(":")[2])
    return set(re.findall(r"`([a-z_]+)`", listed))


def test_readme_documents_exactly_the_failure_reasons():
    documented = documented_reasons()
    assert len(documented) >= 10  # the list was found and read
    assert documented == {r.value for r in FailureReason}


def test_openapi_lists_the_failure_reasons():
    schemas = openapi_document()["components"]["schemas"]
    failure = schemas["RunView"]["properties"]["failure"]
    assert {"$ref": "#/components/schemas/RunFailure"} in failure["anyOf"]
    assert schemas["RunFailure"]["properties"]["reason"]["$ref"] == "#/components/schemas/FailureReason"
    assert set(schemas["FailureReason"]["enum"]) == {r.value for r in FailureReason}


def defined_test(node_id: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The function a test's node id names (its parameters left off), parsed from its file."""
    path, _, name = node_id.partition("::")
    name = name.partition("[")[0]
    module = ast.parse((ROOT / path).read_text())
    found = [n for n in module.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name]
    assert found, f"{node_id}: no such test"
    return found[0]


@pytest.mark.parametrize("reason", list(FailureReason), ids=str)
def test_each_reason_is_produced(reason):
    """Every reason a user can meet is produced here by the code that writes it, and by a run or a
    store driven to it elsewhere; a reason no one produces is one a user is promised but never meets."""
    here, elsewhere = HERE.get(reason, []), ELSEWHERE.get(reason, [])
    assert here or elsewhere, f"nothing produces {reason}: add a producer to this module or name the test that does"
    for producer in here:
        assert producer() == reason, f"{producer.__name__} no longer produces {reason}"
    for node_id in elsewhere:
        source = ast.unparse(defined_test(node_id))
        named = re.search(rf"['\"]{reason.value}['\"]|FailureReason\.{reason.name}\b", source)
        assert named, f"{node_id} does not assert {reason}"
