"""The azure-batch backend at the REST boundary: Shared Key signatures against known answers, the
exact requests it sends, how it pages, maps, cancels and reports errors (against the in-process
fake of the Batch task endpoints, tests/fakes/azure_batch.py), its options, and the deploy files."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from azure.core.credentials import AccessToken
from azure.core.pipeline import PipelineContext, PipelineRequest
from azure.core.rest import HttpRequest

from runplane.compute.azure_batch.auth import BatchSharedKeyPolicy, string_to_sign
from runplane.compute.azure_batch.compute import AzureBatchCompute, iso_duration, parse_time
from runplane.compute.azure_batch.options import options as parse_options
from runplane.compute.azure_batch.rest import API_VERSION, BatchClient, BatchServiceError
from runplane.compute.registry import build_backend
from runplane.domain.errors import BackendError, InvalidRequest
from runplane.domain.pools import Pool
from runplane.settings import StackSettings
from tests.fakes.azure_batch import TEST_KEY, FakeBatchService, FakeBatchTransport

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()  # a Tuesday
ENDPOINT = "https://runplanetest.westeurope.batch.azure.com"
JOB = "runplane-workers"
STACK_ENV = {"RUNPLANE_CLOUD": "azure", "RUNPLANE_AZURE_STORAGE_ACCOUNT": "runplanedata"}
SAS_URL = "https://runplanedata.blob.core.windows.net/worker-logs?sv=2022-11-02&sp=cw&sig=abc"
IDENTITY = (
    "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg/providers/"
    "Microsoft.ManagedIdentity/userAssignedIdentities/runplane-nodes"
)


def clock() -> float:
    return NOW


def pool(name: str = "gpu", gpus: int = 1, **options: Any) -> Pool:
    return Pool(
        name=name,
        backend="azure-batch",
        cpus=4,
        gpus=gpus,
        memory="16g",
        default_image="x",
        options={"job_id": JOB, **options},
    )


def ids(*names: str) -> Any:
    queue = list(names)
    return lambda _pool: queue.pop(0)


@pytest.fixture
def service() -> FakeBatchService:
    svc = FakeBatchService(clock=clock)
    svc.add_job(JOB)
    return svc


def backend(service: FakeBatchService, **kwargs: Any) -> tuple[AzureBatchCompute, FakeBatchTransport]:
    transport = FakeBatchTransport(service)
    client = BatchClient(service.endpoint, account_key=TEST_KEY, transport=transport, clock=clock)
    return AzureBatchCompute(client, environment=STACK_ENV, clock=clock, **kwargs), transport


# --- Shared Key ------------------------------------------------------------------------------


def signed(method: str, url: str, content: bytes | None, headers: dict[str, str]) -> HttpRequest:
    request = HttpRequest(method, url, headers=headers, content=content)
    BatchSharedKeyPolicy("runplanetest", TEST_KEY, clock=clock).on_request(
        PipelineRequest(request, PipelineContext(None))
    )
    return request


def test_shared_key_signature_of_a_post_matches_the_known_answer():
    # The documented canonical form, line by line: VERB, Content-Encoding, Content-Language,
    # Content-Length, Content-MD5, Content-Type, Date (empty: ocp-date is used), If-Modified-Since,
    # If-Match, If-None-Match, If-Unmodified-Since, Range; then the ocp- headers; then
    # /account/path and one line per query parameter.
    expected = (
        "POST\n"
        "\n"
        "\n"
        "14\n"
        "\n"
        "application/json; odata=minimalmetadata\n"
        "\n"
        "\n"
        "\n"
        "\n"
        "\n"
        "\n"
        "ocp-date:Tue, 02 Jan 2024 03:04:05 GMT\n"
        "/runplanetest/jobs/runplane-workers/tasks\n"
        "api-version:2024-07-01.20.0"
    )
    url = f"{ENDPOINT}/jobs/runplane-workers/tasks?api-version=2024-07-01.20.0"
    headers = {"Content-Type": "application/json; odata=minimalmetadata", "Content-Length": "14"}
    request = signed("POST", url, b'{"id":"gpu-1"}', headers)
    assert request.headers["ocp-date"] == "Tue, 02 Jan 2024 03:04:05 GMT"
    assert string_to_sign("POST", url, request.headers, "runplanetest") == expected
    # HMAC-SHA256 of `expected` under the key bytes 00..1f, base64 (computed with openssl)
    assert request.headers["Authorization"] == "SharedKey runplanetest:20lWvyefkeNfpQEhzXBQhB07d0ABBRwgWLmef6DZeho="


def test_shared_key_signature_of_a_get_with_query_matches_the_known_answer():
    # Query parameters URL-decoded, sorted by name ($ sorts before letters); no body, no length.
    url = (
        f"{ENDPOINT}/jobs/runplane-workers/tasks?api-version=2024-07-01.20.0"
        "&$select=id%2CdisplayName%2Cstate%2CcreationTime&$filter=state%20ne%20%27completed%27"
    )
    expected = (
        "GET" + "\n" * 12 + "ocp-date:Tue, 02 Jan 2024 03:04:05 GMT\n"
        "/runplanetest/jobs/runplane-workers/tasks\n"
        "$filter:state ne 'completed'\n"
        "$select:id,displayName,state,creationTime\n"
        "api-version:2024-07-01.20.0"
    )
    request = signed("GET", url, None, {"Accept": "application/json"})
    assert string_to_sign("GET", url, request.headers, "runplanetest") == expected
    assert request.headers["Authorization"] == "SharedKey runplanetest:uM1q9OcxOn6mZw4N2UVay9JPUYLim9J47VRZSUnB1W8="


def test_shared_key_policy_refuses_a_key_that_is_not_base64():
    with pytest.raises(InvalidRequest, match="not valid base64"):
        BatchSharedKeyPolicy("runplanetest", "not a key!")


def test_a_wrong_key_is_refused_by_the_service_with_its_error(service):
    wrong_key = "AAAA" + TEST_KEY[4:]
    client = BatchClient(service.endpoint, account_key=wrong_key, transport=FakeBatchTransport(service), clock=clock)
    with pytest.raises(BatchServiceError, match="list tasks failed: HTTP 403 AuthenticationFailed") as info:
        AzureBatchCompute(client).list(pool())
    assert (info.value.status, info.value.batch_code) == (403, "AuthenticationFailed")
    assert "Server used following string to sign" in info.value.batch_message


def test_managed_identity_sends_a_bearer_token_for_the_batch_scope(service):
    scopes: list[tuple[str, ...]] = []

    class Credential:
        def get_token(self, *wanted: str, **_: Any) -> AccessToken:
            scopes.append(wanted)
            return AccessToken("token-1", int(NOW) + 3600)

    service.tokens.add("token-1")
    client = BatchClient(service.endpoint, credential=Credential(), transport=FakeBatchTransport(service))
    assert AzureBatchCompute(client).list(pool()) == []
    assert scopes == [("https://batch.core.windows.net/.default",)]
    assert service.requests[-1].headers["authorization"] == "Bearer token-1"


# --- launch ----------------------------------------------------------------------------------

AGENT_ARGS = ["--pool", "gpu", "--slots", "1", "--idle-seconds", "120"]


def expected_task(worker_id: str) -> dict[str, Any]:
    return {
        "id": worker_id,
        "displayName": f"runplane-gpu--{worker_id}",
        "commandLine": f"--stop-budget-seconds 15 --pool gpu --slots 1 --idle-seconds 120 --id {worker_id} "
        "--pass-down-termination",
        "containerSettings": {
            "imageName": "runplaneacr.azurecr.io/runplane-agent:0.1.0",
            "containerRunOptions": "--entrypoint runplane-agent -v /var/run/docker.sock:/var/run/docker.sock "
            "-v /var/lib/runplane:/var/lib/runplane --stop-timeout 30 --gpus all --shm-size 1g",
            "registry": {"registryServer": "runplaneacr.azurecr.io", "identityReference": {"resourceId": IDENTITY}},
        },
        "environmentSettings": [
            {"name": "AZURE_CLIENT_ID", "value": "11111111-2222-3333-4444-555555555555"},
            {"name": "RUNPLANE_AGENT_WORK_DIR", "value": "/var/lib/runplane"},
            {"name": "RUNPLANE_AZURE_STORAGE_ACCOUNT", "value": "runplanedata"},
            {"name": "RUNPLANE_CLOUD", "value": "azure"},
        ],
        "constraints": {"maxTaskRetryCount": 0, "maxWallClockTime": "P1DT12H"},
        "requiredSlots": 1,
        "userIdentity": {"autoUser": {"scope": "pool", "elevationLevel": "admin"}},
        "outputFiles": [
            {
                "filePattern": "../std*.txt",
                "destination": {"container": {"containerUrl": SAS_URL, "path": f"workers/gpu/{worker_id}"}},
                "uploadOptions": {"uploadCondition": "taskcompletion"},
            }
        ],
    }


FULL_OPTIONS = {
    "image": "runplaneacr.azurecr.io/runplane-agent:0.1.0",
    "registry": {"server": "runplaneacr.azurecr.io", "identity": IDENTITY},
    "container_run_options": "--shm-size 1g",
    "max_wall_clock": "36h",
    "output_container_url": SAS_URL,
    "environment": {"AZURE_CLIENT_ID": "11111111-2222-3333-4444-555555555555"},
}


def test_launch_one_worker_adds_one_task_exactly(service):
    compute, _ = backend(service, worker_ids=ids("gpu-0000000a"))
    jobs = compute.launch(pool(**FULL_OPTIONS), 1, AGENT_ARGS)
    [request] = service.requests
    assert (request.method, request.path, request.query) == ("POST", f"/jobs/{JOB}/tasks", {"api-version": API_VERSION})
    assert request.headers["content-type"] == "application/json; odata=minimalmetadata"
    assert request.headers["ocp-date"] == "Tue, 02 Jan 2024 03:04:05 GMT"
    assert request.body == expected_task("gpu-0000000a")
    assert [(j.id, j.worker_id, j.state, j.created_at) for j in jobs] == [("gpu-0000000a",) * 2 + ("pending", NOW)]
    assert service.task(JOB, "gpu-0000000a")["state"] == "active"


def test_launch_three_workers_adds_one_task_collection_exactly(service):
    names = ("gpu-0000000a", "gpu-0000000b", "gpu-0000000c")
    compute, _ = backend(service, worker_ids=ids(*names))
    jobs = compute.launch(pool(**FULL_OPTIONS), 3, AGENT_ARGS)
    [request] = service.requests
    assert (request.method, request.path) == ("POST", f"/jobs/{JOB}/addtaskcollection")
    assert request.body == {"value": [expected_task(n) for n in names]}
    assert [j.id for j in jobs] == list(names)


def test_launch_minimal_options_and_no_gpu(service):
    compute, _ = backend(service, worker_ids=ids("cpu-00000001"))
    compute.launch(pool("cpu", gpus=0), 1, ["--pool", "cpu"])
    body = service.requests[0].body
    assert body["containerSettings"] == {
        "imageName": "runplane/agent:local",
        "containerRunOptions": "--entrypoint runplane-agent -v /var/run/docker.sock:/var/run/docker.sock "
        "-v /var/lib/runplane:/var/lib/runplane --stop-timeout 30",
    }
    assert body["constraints"] == {"maxTaskRetryCount": 0}
    assert "outputFiles" not in body


def test_launch_many_goes_in_collections_of_at_most_100(service):
    compute, _ = backend(service)
    jobs = compute.launch(pool(), 250, AGENT_ARGS)
    sizes = [len(r.body["value"]) for r in service.requests_to("POST", f"/jobs/{JOB}/addtaskcollection")]
    assert sizes == [100, 100, 50]
    assert len({j.id for j in jobs}) == 250 == len(service.jobs[JOB])


def test_launch_splits_a_collection_the_service_finds_too_large(service):
    service.fail_next("POST", f"/jobs/{JOB}/addtaskcollection", 413, "RequestBodyTooLarge")
    compute, _ = backend(service)
    jobs = compute.launch(pool(), 5, AGENT_ARGS)
    sizes = [len(r.body["value"]) for r in service.requests_to("POST", f"/jobs/{JOB}/addtaskcollection")]
    assert sizes == [5, 2, 3]
    assert len(jobs) == 5 == len(service.jobs[JOB])


def test_launch_keeps_big_collections_under_one_megabyte(service):
    big = {"RUNPLANE_AGENT_NOTE_" + str(i): "x" * 1000 for i in range(30)}  # ~31 KB per task
    compute, _ = backend(service)
    compute.launch(pool(environment=big), 60, AGENT_ARGS)
    requests = service.requests_to("POST", f"/jobs/{JOB}/addtaskcollection")
    assert len(requests) == 2
    assert all(len(json.dumps(r.body, separators=(",", ":"))) < 1_000_000 for r in requests)
    assert len(service.jobs[JOB]) == 60


def test_launch_reports_per_task_errors_with_the_tasks_that_were_added(service):
    compute, _ = backend(service, worker_ids=ids("gpu-0000000a", "gpu-0000000b", "GPU-0000000A", "gpu-0000000c"))
    compute.launch(pool(), 1, AGENT_ARGS)
    with pytest.raises(BackendError, match=r"refused 1 of 3 worker tasks \(TaskExists: ") as info:
        compute.launch(pool(), 3, AGENT_ARGS)  # the second id collides (ids are case-insensitive)
    assert info.value.details["batch_code"] == "TaskExists"
    assert info.value.details["refused"] == {"GPU-0000000A": "TaskExists"}
    assert [j.id for j in info.value.details["jobs"]] == ["gpu-0000000b", "gpu-0000000c"]
    assert "refused 1 of 3 worker tasks (TaskExists: The specified task already exists.)" in str(info.value)


def test_launch_into_a_missing_job_is_a_backend_error_with_no_jobs(service):
    compute, _ = backend(service)
    with pytest.raises(BatchServiceError, match="HTTP 404 JobNotFound: The specified job does not exist") as info:
        compute.launch(pool(job_id="no-such-job"), 2, AGENT_ARGS)
    assert (info.value.status, info.value.batch_code, info.value.details["jobs"]) == (404, "JobNotFound", [])
    assert str(info.value).startswith("Azure Batch add task collection failed: HTTP 404 JobNotFound: ")


# --- list ------------------------------------------------------------------------------------


def test_list_follows_next_links_and_keeps_only_this_pools_live_tasks():
    service = FakeBatchService(clock=clock, page_size=2)
    service.add_job(JOB)
    compute, _ = backend(service, worker_ids=ids("gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-big-1", "gpu--1"))
    compute.launch(pool(), 4, AGENT_ARGS)
    compute.launch(pool("gpu-big"), 1, AGENT_ARGS)
    compute.launch(pool("gpu-"), 1, AGENT_ARGS)  # its display name starts like gpu's: runplane-gpu---gpu--1
    service.start(JOB, "gpu-2")
    service.complete(JOB, "gpu-3", exit_code=0)
    service.requests.clear()
    listed = compute.list(pool())
    assert sorted((j.id, j.worker_id, j.state, j.detail["batch_state"]) for j in listed) == [
        ("gpu-1", "gpu-1", "pending", "active"),
        ("gpu-2", "gpu-2", "running", "running"),
        ("gpu-4", "gpu-4", "pending", "active"),
    ]
    assert all(j.created_at == NOW and j.pool == "gpu" for j in listed)
    gets = service.requests_to("GET", f"/jobs/{JOB}/tasks")
    assert len(gets) == 3  # 5 live tasks, 2 a page
    assert gets[0].query == {
        "api-version": API_VERSION,
        "$filter": "state ne 'completed'",
        "$select": "id,displayName,state,creationTime",
    }
    assert [g.query.get("$skiptoken") is not None for g in gets] == [False, True, True]


def test_list_of_a_missing_job_is_a_backend_error(service):
    compute, _ = backend(service)
    with pytest.raises(BatchServiceError, match="JobNotFound"):
        compute.list(pool(job_id="gone"))


def test_list_retries_throttling_without_waiting_on_the_clock(service):
    service.fail_next("GET", f"/jobs/{JOB}/tasks", 503, "ServerBusy", headers={"Retry-After": "7"})
    compute, transport = backend(service)
    assert compute.list(pool()) == []
    assert len(service.requests_to("GET", f"/jobs/{JOB}/tasks")) == 2
    assert transport.slept == [7.0]


def test_a_next_link_to_another_host_is_never_followed(service):
    service.fail_next(
        "GET",
        f"/jobs/{JOB}/tasks",
        200,
        "",
        raw=json.dumps({"value": [], "odata.nextLink": "https://elsewhere.example/jobs/x/tasks"}).encode(),
    )
    compute, _ = backend(service)
    with pytest.raises(BackendError, match="refusing to send a signed request"):
        compute.list(pool())


# --- describe --------------------------------------------------------------------------------


def test_describe_maps_task_states_and_failures(service):
    compute, _ = backend(service, worker_ids=ids("gpu-a", "gpu-b", "gpu-c", "gpu-d", "cpu-x"))
    compute.launch(pool(), 4, AGENT_ARGS)
    compute.launch(pool("cpu"), 1, AGENT_ARGS)
    service.start(JOB, "gpu-b")
    service.complete(JOB, "gpu-c", exit_code=0)
    service.complete(JOB, "gpu-d", exit_code=2)
    got = {i: compute.describe(pool(), i) for i in ("gpu-a", "gpu-b", "gpu-c", "gpu-d")}
    assert {i: (j.state, j.worker_id, j.created_at) for i, j in got.items() if j} == {
        "gpu-a": ("pending", "gpu-a", NOW),
        "gpu-b": ("running", "gpu-b", NOW),
        "gpu-c": ("finished", "gpu-c", NOW),
        "gpu-d": ("failed", "gpu-d", NOW),
    }
    assert got["gpu-c"].detail == {"batch_state": "completed", "exit_code": 0}
    assert got["gpu-d"].detail == {
        "batch_state": "completed",
        "exit_code": 2,
        "reason": "FailureExitCode: The task exited with an exit code representing a failure",
        "failure_category": "usererror",
    }
    assert service.requests[-1].query["$select"] == "id,displayName,state,creationTime,executionInfo"


def test_describe_unknown_other_pools_and_malformed_ids_is_none(service):
    compute, _ = backend(service, worker_ids=ids("cpu-x"))
    compute.launch(pool("cpu"), 1, AGENT_ARGS)
    sent = len(service.requests)
    assert compute.describe(pool(), "gpu-never") is None  # 404 TaskNotFound
    assert compute.describe(pool(), "cpu-x") is None  # another pool's task
    assert len(service.requests) == sent + 2
    assert compute.describe(pool(), "../../pools") is None  # never a valid task id: nothing sent
    assert len(service.requests) == sent + 2


# --- cancel ----------------------------------------------------------------------------------


def test_cancel_terminates_and_is_quiet_when_done_or_unknown(service):
    compute, _ = backend(service, worker_ids=ids("gpu-a"))
    compute.launch(pool(), 1, AGENT_ARGS)
    service.start(JOB, "gpu-a")
    compute.cancel(pool(), "gpu-a")
    assert service.task(JOB, "gpu-a")["state"] == "completed"
    ended = compute.describe(pool(), "gpu-a")
    assert (ended.state, ended.detail["reason"]) == ("failed", "TaskEnded: Task Was Ended by User Request")
    compute.cancel(pool(), "gpu-a")  # 409 TaskCompleted
    compute.cancel(pool(), "gpu-never")  # 404 TaskNotFound
    compute.cancel(pool(job_id="gone"), "gpu-a")  # 404 JobNotFound
    terminates = [r for r in service.requests if r.path.endswith("/terminate")]
    assert len(terminates) == 4
    assert terminates[0].headers["content-length"] == "0"


def test_cancel_retries_server_errors_then_raises_them(service):
    compute, transport = backend(service)
    path = f"/jobs/{JOB}/tasks/gpu-a/terminate"
    service.fail_next("POST", path, 500, "InternalError", "Server encountered an internal error.", times=10)
    with pytest.raises(BatchServiceError, match="terminate task failed: HTTP 500 InternalError") as info:
        compute.cancel(pool(), "gpu-a")
    assert (info.value.status, info.value.batch_code) == (500, "InternalError")
    assert len(service.requests_to("POST", path)) == 4  # the first try and 3 retries
    assert len(transport.slept) == 2 and all(0 < s <= 30 for s in transport.slept)  # backed off, not waited


def test_adding_tasks_is_never_retried(service):
    compute, _ = backend(service)
    for path in (f"/jobs/{JOB}/tasks", f"/jobs/{JOB}/addtaskcollection"):
        service.fail_next("POST", path, 503, "ServerBusy", "The server is currently unable to receive requests.")
    for count in (1, 2):
        with pytest.raises(BatchServiceError, match="ServerBusy") as info:
            compute.launch(pool(), count, AGENT_ARGS)
        assert info.value.details["jobs"] == []
    assert len(service.requests) == 2
    assert service.jobs[JOB] == {}


# --- errors ----------------------------------------------------------------------------------


def test_an_error_body_that_is_not_json_still_gives_a_clear_error(service):
    service.fail_next("GET", f"/jobs/{JOB}/tasks", 400, "", raw=b"<html>Bad Gateway</html>")
    compute, _ = backend(service)
    with pytest.raises(BatchServiceError, match="list tasks failed: HTTP 400 error: <html>Bad Gateway</html>") as info:
        compute.list(pool())
    assert (info.value.status, info.value.batch_code, info.value.batch_message) == (400, "", "<html>Bad Gateway</html>")


def test_an_unreachable_account_is_a_backend_error():
    other = FakeBatchService(account="other")
    client = BatchClient(ENDPOINT, account_key=TEST_KEY, transport=FakeBatchTransport(other), retry_total=0)
    with pytest.raises(BackendError, match=r"cannot reach runplanetest\.westeurope\.batch\.azure\.com"):
        AzureBatchCompute(client).list(pool())


def test_the_service_error_carries_code_message_and_values(service):
    compute, _ = backend(service)
    client = compute.client
    with pytest.raises(BatchServiceError, match="list tasks failed: HTTP 400 InvalidQueryParameterValue") as info:
        client.call("list tasks", "GET", client.url(f"/jobs/{JOB}/tasks", {"api-version": "2019-08-01.10.0"}))
    error = info.value
    assert (error.status, error.batch_code) == (400, "InvalidQueryParameterValue")
    assert error.batch_message.startswith(
        "Value for one of the query parameters specified in the request URI is invalid."
    )
    assert "QueryParameterName: api-version" in error.batch_message
    assert error.details["request_id"] and f"RequestId:{error.details['request_id']}" in error.batch_message
    assert error.retryable and error.code == "backend_error"


@pytest.mark.parametrize(
    "url",
    ["http://runplanetest.westeurope.batch.azure.com", "runplanetest.westeurope", "https://a.b/some/path"],
)
def test_account_url_must_be_an_https_account_root(url):
    with pytest.raises(InvalidRequest, match="account URL must look like"):
        BatchClient(url, account_key=TEST_KEY)


# --- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "job_id: required"),
        ({"job_id": "a/b"}, "job_id: String should match pattern"),
        ({"job_id": "j", "jobid": "x"}, "unknown option 'jobid' (known: job_id, batch_pool_id, image"),
        ({"job_id": "j", "max_wall_clock": "soon"}, "max_wall_clock: cannot read duration 'soon'"),
        ({"job_id": "j", "work_dir": "data"}, "work_dir: 'data' is not an absolute path"),
        ({"job_id": "j", "container_run_options": "--label 'x"}, "container_run_options: cannot split"),
        ({"job_id": "j", "elevation_level": "root"}, "elevation_level: Input should be 'admin' or 'nonadmin'"),
        ({"job_id": "j", "required_slots": 0}, "required_slots: Input should be greater than or equal to 1"),
        (
            {"job_id": "j", "environment": {"RUNPLANE_AZURE_STORAGE_CONNECTION_STRING": "x"}},
            "environment: must not hold credentials (RUNPLANE_AZURE_STORAGE_CONNECTION_STRING)",
        ),
        ({"job_id": "j", "environment": {"1X": "y"}}, "'1X' is not a valid environment variable name"),
        ({"job_id": "j", "registry": {"server": "r.azurecr.io"}}, "registry.identity: required"),
        ({"job_id": "j", "output_identity": "me"}, "must be the ARM id of a user-assigned managed identity"),
        ({"job_id": "j", "output_container_url": "https://a.blob.core.windows.net/"}, "must be https://<account>"),
        (
            {"job_id": "j", "output_container_url": "https://a.blob.core.windows.net/logs"},
            "output_container_url needs a SAS token with write permission, or options.output_identity",
        ),
    ],
)
def test_bad_options_are_refused_with_a_clear_message(options, message):
    bad = Pool(name="gpu", backend="azure-batch", cpus=1, memory="1g", default_image="x", options=options)
    with pytest.raises(InvalidRequest, match=r"^pool gpu: bad azure-batch options: ") as info:
        parse_options(bad)
    assert str(info.value).startswith("pool gpu: bad azure-batch options: ")
    assert message in str(info.value)


def test_options_with_an_identity_for_uploads_need_no_sas():
    ok = parse_options(pool(output_container_url="https://a.blob.core.windows.net/logs", output_identity=IDENTITY))
    assert ok.output_identity == IDENTITY


def test_bad_options_fail_before_anything_is_sent(service):
    compute, _ = backend(service)
    with pytest.raises(InvalidRequest, match="bad azure-batch options: unknown option 'jobid'"):
        compute.launch(pool(jobid="x"), 1, AGENT_ARGS)
    assert service.requests == []


# --- wiring ----------------------------------------------------------------------------------


def test_builder_needs_the_account_url():
    with pytest.raises(InvalidRequest, match="RUNPLANE_AZURE_BATCH_ACCOUNT_URL"):
        build_backend("azure-batch", StackSettings())


def test_builder_with_a_key_signs_with_it():
    settings = StackSettings(azure_batch_account_url=ENDPOINT, azure_batch_account_key=TEST_KEY)
    compute = build_backend("azure-batch", settings)
    assert isinstance(compute, AzureBatchCompute) and compute.client.account == "runplanetest"


def test_agents_get_the_stack_settings_but_never_its_secrets():
    settings = StackSettings.from_env(
        {
            "RUNPLANE_CLOUD": "azure",
            "RUNPLANE_PREFIX": "prod",
            "RUNPLANE_AZURE_STORAGE_ACCOUNT": "runplanedata",
            "RUNPLANE_AZURE_STORAGE_CONNECTION_STRING": "AccountKey=secret",
            "RUNPLANE_AZURE_BATCH_ACCOUNT_URL": ENDPOINT,
            "RUNPLANE_AZURE_BATCH_ACCOUNT_KEY": TEST_KEY,
            "RUNPLANE_AGENT_ARGS": "--pull never",
            "RUNPLANE_WORKER_STALE_SECONDS": "45",
        }
    )
    environment = build_backend("azure-batch", settings).environment  # type: ignore[attr-defined]
    assert environment == {
        "RUNPLANE_AZURE_BATCH_ACCOUNT_URL": ENDPOINT,
        "RUNPLANE_AZURE_STORAGE_ACCOUNT": "runplanedata",
        "RUNPLANE_CLOUD": "azure",
        "RUNPLANE_PREFIX": "prod",
        "RUNPLANE_WORKER_STALE_SECONDS": "45.0",
    }
    assert StackSettings.from_env(environment).worker_stale_seconds == 45


def test_durations_and_times_in_batch_formats():
    assert [iso_duration(s) for s in (1, 59, 3600, 5400, 86400, 90061, 0.2)] == [
        "PT1S",
        "PT59S",
        "PT1H",
        "PT1H30M",
        "P1D",
        "P1DT1H1M1S",
        "PT1S",
    ]
    assert parse_time("2024-01-02T03:04:05.5000000Z") == NOW + 0.5
    assert parse_time("2024-01-02T03:04:05Z") == NOW
    assert parse_time(None) == 0.0


# --- deploy files ----------------------------------------------------------------------------

INFRA = ROOT / "infra" / "azure" / "batch"


def test_pool_json_is_a_valid_autoscaled_container_pool():
    body = json.loads((INFRA / "pool.json").read_text())
    # what the Batch REST API requires of a new pool (Pool - Add)
    assert body["id"] and body["vmSize"]
    vm = body["virtualMachineConfiguration"]
    assert set(vm["imageReference"]) >= {"publisher", "offer", "sku", "version"}
    assert vm["nodeAgentSKUId"].startswith("batch.node.")
    assert vm["containerConfiguration"]["type"] == "dockerCompatible"
    # autoscaled: a formula and an interval, never fixed node counts beside it
    assert body["enableAutoScale"] is True
    assert body["autoScaleEvaluationInterval"] == "PT5M"
    assert "targetDedicatedNodes" not in body and "targetLowPriorityNodes" not in body
    assert body["autoScaleFormula"] == (INFRA / "autoscale.formula").read_text()
    assert body["taskSlotsPerNode"] == 1
    start = body["startTask"]
    assert start["commandLine"] and start["userIdentity"]["autoUser"]["elevationLevel"] == "admin"


def test_job_json_targets_the_pool_and_stays_open():
    pool_body = json.loads((INFRA / "pool.json").read_text())
    job = json.loads((INFRA / "job.json").read_text())
    assert job["poolInfo"] == {"poolId": pool_body["id"]}
    assert job["onAllTasksComplete"] == "noaction"  # the job outlives its workers
    assert parse_options(pool(job_id=job["id"], batch_pool_id=pool_body["id"])).job_id == job["id"]


def test_autoscale_formula_scales_on_tasks_with_caps():
    formula = (INFRA / "autoscale.formula").read_text()
    for needed in ("$PendingTasks", "$ActiveTasks", "$TargetDedicatedNodes", "$TargetLowPriorityNodes"):
        assert needed in formula
    assert "$NodeDeallocationOption = taskcompletion;" in formula
    statements = [line for line in formula.splitlines() if line.strip() and not line.strip().startswith("//")]
    assert statements
    assert all(line.rstrip().endswith(";") for line in statements)
