"""Answers across releases: the SDK reads an answer of a newer API (fields it does not know at any
depth, a state or reason it does not list), and this API's answers leave out the fields added since
the previous release while they hold their default, as its document says."""

import copy
import json

import pytest
from pydantic import ValidationError

from runplane.api.models import PoolList, RunPage, RunView, SweepView, WorkerList
from runplane.api.openapi import openapi_document
from runplane.client._core import RawResponse, parse
from runplane.domain.runs import RunSpec
from runplane.domain.wire import shown_json

RUN = RunView.model_config["json_schema_extra"]["examples"][0]  # type: ignore[index]


def _later_run() -> dict:
    """A run as a later release may answer it: new fields at every depth, a new state and reason."""
    run = copy.deepcopy(RUN)
    run["snapshot"] = {"every": 60}
    run["state"] = "suspended"
    run["failure"] = {"reason": "preempted_forever", "message": "gone", "node": "n-1"}
    run["events"][0].update(state="suspended", actor="admin")
    run["usage"]["network_bytes"] = 12
    run["spec"]["volumes"] = ["db"]
    run["spec"]["resources"]["nodes"] = 2
    run["spec"]["retry"].update(on=["nonzero_exit", "node_lost"], backoff=30)
    return run


def _sweep(template: dict) -> dict:
    return {
        "id": "s-1",
        "name": None,
        "owner": "ada",
        "group": None,
        "queue": "cpu",
        "size": 2,
        "max_parallel": None,
        "counts": {"queued": 1, "suspended": 1},
        "failures": {"preempted_forever": 1},
        "waiting": 0,
        "waiting_for": None,
        "killed": False,
        "created_at": "2026-11-23T09:30:00.125Z",
        "finished_at": None,
        "spec": {"run": template, "parameters": {"I": [1, 2]}, "notify": "ada@example.com"},
        "events": [],
        "paused": True,
    }


def _answer(model, body):
    return parse(model, RawResponse(200, json.loads(json.dumps(body))))


def test_the_sdk_reads_a_later_release_run_sweep_and_pages():
    run = _answer(RunView, _later_run())
    assert run.state == "suspended" and not run.state.startswith("succ")
    assert (run.failure.reason, run.failure.message) == ("preempted_forever", "gone")
    assert run.events[0].state == "suspended"
    assert run.spec.retry.on == ["node_lost", "nonzero_exit"]
    assert run.spec.resources.cpus == 2 and run.spec.labels == {"project": "vision"}
    page = _answer(RunPage, {"runs": [_later_run(), RUN], "next_cursor": None, "total": 2})
    assert [r.state for r in page.runs] == ["suspended", "queued"]
    sweep = _answer(SweepView, _sweep(_later_run()["spec"]))
    assert sweep.counts == {"queued": 1, "suspended": 1} and sweep.failures == {"preempted_forever": 1}
    assert sweep.spec.run.resources.cpus == 2


def test_the_sdk_reads_a_later_release_pool_and_worker():
    pool = _answer(PoolList, {"pools": [_pool()]}).pools[0]
    assert pool.backend == "nomad" and pool.retry is not None and pool.retry.on == ["node_lost"]
    worker = _answer(WorkerList, {"workers": [_worker()], "next_cursor": None}).workers[0]
    assert worker.status == "cordoned"


def test_what_users_send_and_what_the_server_reads_stay_strict():
    with pytest.raises(ValidationError, match="volumes"):
        RunSpec.model_validate(_later_run()["spec"])
    with pytest.raises(ValidationError, match="suspended"):
        RunView.model_validate({**RUN, "state": "suspended"})
    with pytest.raises(ValidationError, match="node_lost"):
        RunSpec.model_validate({"command": "x", "retry": {"attempts": 2, "on": ["node_lost"]}})


def test_answers_leave_out_fields_added_since_at_their_default_at_every_depth():
    plain = RunView.model_validate({**RUN, "spec": {**RUN["spec"], "labels": {}}})
    assert "labels" not in json.loads(shown_json(plain))["spec"]
    assert json.loads(shown_json(RunView.model_validate(RUN)))["spec"]["labels"] == {"project": "vision"}
    template = {k: v for k, v in RUN["spec"].items() if k != "labels"}
    sweep = SweepView.model_validate(
        {**_sweep(template), "counts": {"queued": 2}, "failures": {}, "spec": {"run": template, "parameters": {}}}
    )
    assert "labels" not in json.loads(shown_json(sweep))["spec"]["run"]
    page = json.loads(shown_json(RunPage(runs=[plain], next_cursor=None)))
    assert "labels" not in page["runs"][0]["spec"]


def test_the_document_makes_fields_added_since_optional_in_answers_only_there():
    schemas = openapi_document()["components"]["schemas"]
    shown = schemas["RunSpecView"]
    assert "labels" in shown["properties"] and "labels" not in shown["required"]
    assert {"command", "image", "resources", "after_sweep"} <= set(shown["required"])
    assert shown["additionalProperties"] is False


def _pool() -> dict:
    return {
        "name": "gpu",
        "backend": "nomad",
        "shape": {"cpus": 4, "gpus": 1, "gpu_type": None, "memory": 1, "disk": 1, "slots": 1, "numa": 2},
        "min_workers": 0,
        "max_workers": 2,
        "default_image": "x",
        "default_time": 60,
        "max_time": 600,
        "max_user_priority": 50,
        "fair_share_half_life": 3600,
        "price_per_hour": None,
        "retry": {"attempts": 2, "on": ["node_lost"], "memory_factor": None, "jitter": 1},
        "backlog": 0,
        "workers": {"idle": 0, "busy": 0, "starting": 0, "draining": 0, "cordoned": 1},
        "counted_at": None,
        "launches": {"launched": 0, "failed": 0, "failed_in_a_row": 0, "last_launch_at": None},
        "last_error": None,
        "last_error_at": None,
        "disabled": None,
        "last_decision": None,
        "regions": ["eu"],
    }


def _worker() -> dict:
    return {
        "id": "w-1",
        "pool": "gpu",
        "status": "cordoned",
        "host": "h",
        "slots": 1,
        "free_slots": 1,
        "cpus": 4,
        "gpus": 0,
        "memory": 1,
        "free_cpus": 4,
        "free_gpus": 0,
        "gpu_ids": [],
        "cached_inputs": 0,
        "runs": [],
        "run_owners": {},
        "runs_done": 0,
        "runs_left": None,
        "started_at": "2026-11-23T09:30:00.125Z",
        "heartbeat_at": "2026-11-23T09:30:00.125Z",
        "backend_job_id": None,
        "agent_version": "0.3.0",
        "tag": None,
        "tag_exclusive": False,
        "group": None,
        "network_refused": None,
        "node": "n-1",
    }
