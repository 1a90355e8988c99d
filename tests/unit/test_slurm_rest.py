"""The slurmrestd transport read against replies captured from a real slurmrestd (Slurm
22.05, openapi/v0.0.38; tests/events/slurm/capture.py records them), and squeue output taken
at the same moment, so both ways into Slurm must read every job alike."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from runplane.compute.slurm.cli import parse_squeue
from runplane.compute.slurm.compute import SlurmCompute
from runplane.compute.slurm.jobs import backend_job, job_spec, map_state
from runplane.compute.slurm.options import options as slurm_options
from runplane.compute.slurm.rest import RestTransport, SlurmRestError, check_reply, parse_jobs, token_claims
from runplane.domain.errors import BackendError, InvalidRequest
from runplane.domain.pools import Pool

EVENTS = Path(__file__).resolve().parents[1] / "events" / "slurm"
NOW = 1_800_000_000.0


def captured(name: str) -> tuple[int, bytes]:
    record = json.loads((EVENTS / f"{name}.json").read_text())
    return record["status"], record["body"].encode()


def reply(name: str) -> dict[str, Any]:
    status, body = captured(name)
    return check_reply(status, body, name)


def rest_jobs(name: str, pool: str) -> list[Any]:
    found = (backend_job(job, pool, "rest") for job in parse_jobs(reply(name)))
    return [job for job in found if job is not None]


def pool(**options: Any) -> Pool:
    return Pool(name="cap", backend="slurm", cpus=1, memory="256m", default_image="x", options=options)


def jwt(claims: dict[str, Any]) -> str:
    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


def test_list_reads_the_same_live_jobs_as_squeue_at_the_same_moment():
    live = [(j.id, j.worker_id, j.state) for j in rest_jobs("jobs", "cap") if j.alive]
    assert live == [("31", "cap-run", "running"), ("32", "cap-pending", "pending")]
    squeue = (backend_job(j, "cap", "sbatch") for j in parse_squeue((EVENTS / "squeue.txt").read_text()))
    assert sorted(live) == sorted((j.id, j.worker_id, j.state) for j in squeue if j is not None)


def test_every_job_reads_alike_through_slurmrestd_and_squeue():
    rest = {j.id: j for j in parse_jobs(reply("jobs"))}
    squeue = {j.id: j for j in parse_squeue((EVENTS / "squeue_all.txt").read_text())}
    assert rest.keys() == squeue.keys() and len(rest) == 28
    for job_id, job in rest.items():
        other = squeue[job_id]
        assert (job.name, job.state, job.reason) == (other.name, other.state, other.reason), job_id
        assert map_state(job.state) == map_state(other.state)


def test_other_pools_jobs_and_foreign_jobs_are_left_out():
    names = {j.worker_id for j in rest_jobs("jobs", "cap")}
    assert names == {"cap-run", "cap-pending", "cap-ok", "cap-exit3", "cap-nolog", "cap-cancel", "cap-timeout"}
    assert {j.worker_id for j in rest_jobs("jobs", "other")} == {"other-run"}
    assert rest_jobs("jobs", "ca") == []  # a pool whose name is a prefix claims nothing


@pytest.mark.parametrize(
    ("fixture", "state", "slurm_state", "reason"),
    [
        ("job_pending", "pending", "PENDING", None),
        ("job_running", "running", "RUNNING", None),
        ("job_completed", "finished", "COMPLETED", None),
        ("job_cancelled", "finished", "CANCELLED", None),
        ("job_failed_exit", "failed", "FAILED", "NonZeroExitCode"),
        ("job_launch_failed", "failed", "FAILED", "JobLaunchFailure"),
        ("job_timeout", "failed", "TIMEOUT", "TimeLimit"),
    ],
)
def test_describe_maps_each_captured_state(fixture, state, slurm_state, reason):
    (job,) = rest_jobs(fixture, "cap")
    assert (job.state, job.detail["slurm_state"], job.detail.get("reason")) == (state, slurm_state, reason)
    assert job.worker_id.startswith("cap-") and job.id.isdigit() and job.created_at > 1.7e9


@pytest.mark.parametrize(
    ("state", "mapped"),
    [
        ("CONFIGURING", "pending"),
        ("REQUEUED", "pending"),
        ("COMPLETING", "running"),
        ("SUSPENDED", "running"),
        ("CANCELLED by 0", "finished"),
        ("NODE_FAIL", "failed"),
        ("OUT_OF_MEMORY", "failed"),
        ("BOOT_FAIL", "failed"),
        ("DEADLINE", "failed"),
        ("PREEMPTED", "failed"),
        ("", "failed"),
    ],
)
def test_states_not_captured_here_map_by_the_table(state, mapped):
    assert map_state(state) == mapped


def test_a_failure_without_a_reason_gives_its_state_as_the_reason():
    data = json.loads(captured("job_failed_exit")[1])
    data["jobs"][0].update(job_state="NODE_FAIL", state_reason="None")
    (job,) = (backend_job(j, "cap", "rest") for j in parse_jobs(data))
    assert job is not None and (job.state, job.detail["reason"]) == ("failed", "NODE_FAIL")


def test_submission_reply_and_quiet_cancels():
    assert reply("submit_ok")["job_id"] > 0
    assert reply("cancel_ok")["errors"] == [] and reply("cancel_ended")["errors"] == []


@pytest.mark.parametrize(
    ("fixture", "numbers", "text"),
    [
        ("submit_refused", {2005}, "More processors requested than permitted [2005] (HTTP 500)"),
        ("submit_unparsable", {-1, 9001}, "Invalid SIGNAL specification [-1]"),
        ("job_unknown", {2017}, "Invalid job id specified: Unable to find JobId=999999 [2017]"),
        ("cancel_unknown", {2017}, "Invalid job id specified"),
        ("jobs_bad_token", {-1}, "Unspecified error: Failed while looking for jobs [-1] (HTTP 500)"),
        ("submit_bad_token", {5005}, "Zero Bytes were transmitted or received"),
        ("jobs_no_credentials", set(), "HTTP 401: Authentication failure"),
    ],
)
def test_errors_carry_slurms_message_and_numbers(fixture, numbers, text):
    status, body = captured(fixture)
    with pytest.raises(SlurmRestError, match=f"^slurmrestd: {fixture}: ") as caught:
        check_reply(status, body, f"slurmrestd: {fixture}")
    assert caught.value.numbers == numbers and caught.value.status == status
    assert text in caught.value.message and caught.value.message.startswith(f"slurmrestd: {fixture}")
    assert isinstance(caught.value, BackendError) and caught.value.retryable


def test_a_reply_that_is_not_json_is_an_error_even_with_status_200():
    with pytest.raises(SlurmRestError, match="HTTP 200: <html>"):
        check_reply(200, b"<html>", "x")


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"rest_url": "ftp://127.0.0.1:6820", "jwt_token_file": "/t"}, "rest_url: Value error, 'ftp://"),
        ({"rest_url": "unix:relative.sock"}, "unix:/absolute/path"),
        ({"rest_url": "http://127.0.0.1:6820"}, "set jwt_token_file"),
        ({"rest_url": "unix:/s.sock", "sbatch_args": ["--qos=x"]}, "sbatch_args apply to sbatch only"),
        ({"rest_url": "unix:/s.sock", "jwt_user": "u"}, "jwt_user needs jwt_token_file"),
        ({"jwt_token_file": "/t"}, "jwt_token_file needs rest_url"),
        ({"job_fields": {"qos": "x"}}, "job_fields needs rest_url"),
        ({"environment": {"AWS_SECRET_ACCESS_KEY": "k"}}, "environment: must not hold credentials"),
        ({"partiton": "gpu"}, "unknown option 'partiton' (known: "),
        ({"sbatch_args": "--qos=x"}, "sbatch_args: Input should be a valid list"),
    ],
)
def test_bad_options_are_refused_with_the_option_named(options, complaint):
    with pytest.raises(InvalidRequest, match=r"^pool cap: bad slurm options: ") as caught:
        slurm_options(pool(**options))
    assert complaint.replace("Value error, ", "") in caught.value.message


def test_good_options_read_numbers_as_text():
    o = slurm_options(pool(rest_url="https://slurm.example:6820/", jwt_token_file="/t", time=60))
    assert (o.rest_url, o.time) == ("https://slurm.example:6820", "60")


def transport(tmp_path: Path, token: str, **kwargs: Any) -> RestTransport:
    (tmp_path / "token").write_text(token)
    return RestTransport("http://127.0.0.1:1", str(tmp_path / "token"), clock=lambda: NOW, **kwargs)


def test_the_token_names_its_user_and_scontrols_prefix_is_accepted(tmp_path):
    token = jwt({"exp": NOW + 60, "iat": NOW - 60, "sun": "runplane"})
    headers, how = transport(tmp_path, f"SLURM_JWT={token}\n")._auth()
    assert headers == {"X-SLURM-USER-NAME": "runplane", "X-SLURM-USER-TOKEN": token}
    assert how == f"user runplane, JWT from {tmp_path / 'token'}"
    headers, _ = transport(tmp_path, token, user="other")._auth()
    assert headers["X-SLURM-USER-NAME"] == "other"


@pytest.mark.parametrize(
    ("token", "complaint"),
    [
        (jwt({"exp": NOW, "sun": "root"}), "expired at 2027-01-15T08:00:00+00:00; make a new one with `scontrol token"),
        ("not-a-token", "is unusable: not a JWT (expected three dot-separated parts)"),
        ("a.!!!.c", "is unusable: not a JWT"),
        (jwt({"exp": NOW + 60}), "names no user; set options.jwt_user"),
    ],
)
def test_an_unusable_token_is_a_clear_error_before_anything_is_sent(tmp_path, token, complaint):
    with pytest.raises(BackendError, match=str(tmp_path)) as caught:
        transport(tmp_path, token).jobs()  # port 1: would fail differently if anything were sent
    assert complaint in caught.value.message


def test_a_missing_token_file_is_a_backend_error(tmp_path):
    rest = RestTransport("http://127.0.0.1:1", str(tmp_path / "none"), clock=lambda: NOW)
    with pytest.raises(BackendError, match=r"cannot read the JWT in .*none: No such file"):
        rest.jobs()


def test_token_claims_reads_the_payload():
    assert token_claims(jwt({"sun": "a", "exp": 5})) == {"sun": "a", "exp": 5}


def test_worker_environment_is_the_stack_settings_and_the_pools_not_the_dispatchers_secrets():
    environ = {
        "RUNPLANE_PREFIX": "p1",
        "RUNPLANE_AGENT_ARGS": "--poll-seconds 1",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "HOME": "/root",
    }
    rest = RestTransport("unix:/s.sock", clock=lambda: NOW, environ=environ)
    spec = job_spec(pool(environment={"AWS_SHARED_CREDENTIALS_FILE": "/shared/aws"}), "cap-1", "/l")
    assert rest.environment(spec) == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "RUNPLANE_PREFIX": "p1",
        "AWS_SHARED_CREDENTIALS_FILE": "/shared/aws",
    }


def test_ids_that_are_not_job_ids_never_reach_slurm():
    def runner(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"ran {args}")

    compute = SlurmCompute(runner=runner)
    compute.cancel(pool(), "--me")
    compute.cancel(pool(), "١٢")  # digits, but not ASCII ones
    assert compute.describe(pool(), "--me") is None
