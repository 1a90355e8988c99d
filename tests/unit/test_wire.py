"""Records across releases (runplane/domain/wire.py): what a user sends is strict, what another
release stored is read whole and written back whole, and a field added since the previous release
is left out of what is written while it holds its default."""

import json
from typing import Annotated

import pytest
from pydantic import Field, ValidationError

from runplane.domain.messages import DispatchEvent, RunMessage
from runplane.domain.quotas import UsageRecord
from runplane.domain.runs import Event, Run, RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import UserRecord
from runplane.domain.wire import Record, Since, stored, written, written_json
from runplane.domain.workers import Worker


def future_run() -> dict:
    """A run as a later release might store it: a field this one does not know at every depth."""
    return {
        "id": "r-1",
        "owner": "alice",
        "queue": "cpu",
        "created_at": 1.0,
        "priority_class": "gold",
        "spec": {
            "command": "echo hi",
            "volumes": ["db"],
            "resources": {"cpus": 2, "nodes": 4},
            "retry": {"attempts": 2, "on": ["nonzero_exit"], "backoff": "1m"},
        },
        "usage": {"cpu_seconds": 1.5, "energy_joules": 12},
        "failure": {"reason": "nonzero_exit", "message": "exit 1", "signal": 9},
        "events": [{"at": 1.0, "state": "queued", "message": "submitted", "by": "api"}],
    }


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"command": "x", "volumes": ["db"]}, "volumes"),
        ({"command": "x", "resources": {"cpus": 1, "nodes": 2}}, "resources.nodes"),
        ({"command": "x", "retry": {"attempts": 2, "backoff": "1m"}}, "retry.backoff"),
    ],
)
def test_a_request_with_a_field_it_does_not_know_is_refused_naming_it(body, where):
    for read in (RunSpec.model_validate, lambda b: RunSpec.model_validate_json(json.dumps(b))):
        with pytest.raises(ValidationError) as caught:
            read(body)
        errors = caught.value.errors()
        assert [(".".join(map(str, e["loc"])), e["type"]) for e in errors] == [(where, "extra_forbidden")]


def test_the_schemas_are_as_strict_as_the_server():
    for mode in ("validation", "serialization"):
        schema = RunSpec.model_json_schema(mode=mode)
        assert schema["additionalProperties"] is False
        assert schema["$defs"]["Resources"]["additionalProperties"] is False
        assert schema["$defs"]["RetryRule"]["additionalProperties"] is False


def test_a_stored_run_with_fields_this_release_does_not_know_is_read_and_written_back_whole():
    data = future_run()
    for source in (data, json.dumps(data), json.dumps(data).encode()):
        run = stored(Run, source)
        assert (run.spec.command, run.spec.resources.cpus, run.spec.retry.attempts) == ("echo hi", 2, 2)
        assert run.failure.reason == "nonzero_exit" and run.events[0].message == "submitted"
        back = written(run)
        assert back["priority_class"] == "gold"
        assert back["spec"]["volumes"] == ["db"]
        assert back["spec"]["resources"]["nodes"] == 4
        assert back["spec"]["retry"]["backoff"] == "1m"
        assert back["usage"]["energy_joules"] == 12
        assert back["failure"]["signal"] == 9
        assert back["events"][0]["by"] == "api"
        assert json.loads(written_json(run)) == back


def test_what_it_did_not_know_survives_a_change_and_a_new_timeline_entry():
    run = stored(Run, future_run())
    changed = run.model_copy(
        update={"state": RunState.PREPARING, "events": [*run.events, Event(at=2.0, message="claimed")]}
    )
    back = written(changed)
    assert back["state"] == "preparing" and back["priority_class"] == "gold"
    assert [e.get("by") for e in back["events"]] == ["api", None]
    assert "by" not in back["events"][1]


def test_a_run_of_an_older_release_lacks_newer_fields_and_takes_their_defaults():
    data = future_run()
    del data["usage"], data["failure"], data["events"], data["spec"]["retry"]
    run = stored(Run, data)
    assert run.events == [] and run.failure is None and run.spec.retry is None


def test_stored_still_refuses_a_known_field_that_is_not_valid():
    data = future_run()
    data["spec"]["resources"]["cpus"] = "many"
    with pytest.raises(ValidationError, match=r"spec\.resources\.cpus"):
        stored(Run, data)


@pytest.mark.parametrize(
    ("model", "data"),
    [
        (Worker, {"id": "w", "pool": "cpu", "started_at": 1, "heartbeat_at": 2}),
        (RunMessage, {"run_id": "r-1", "attempt": 1}),
        (DispatchEvent, {"pool": "cpu", "reason": "ended"}),
        (UsageRecord, {"kind": "user", "name": "alice", "holds": {"r#1": {"run_id": "r", "attempt": 1, "at": 1}}}),
    ],
)
def test_every_kind_of_record_keeps_what_it_does_not_know(model, data):
    assert issubclass(model, Record)
    future = {**data, "surprise": 1}
    if model is UsageRecord:
        future["holds"] = {"r#1": {**data["holds"]["r#1"], "x": 1}}
    if model.model_config.get("extra") != "ignore":  # records always read tolerantly (a dispatcher event)
        with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
            model.model_validate(future)
    back = written(stored(model, future))
    assert back.pop("surprise") == 1
    if model is UsageRecord:
        assert back["holds"]["r#1"].pop("x") == 1
    assert back == written(model.model_validate(data))


def test_a_user_record_that_another_release_wrote_is_read():
    record = UserRecord.read(json.dumps({"user": "alice", "default_group": "vision", "theme": "dark"}))
    assert record is not None and record.default_group == "vision"
    assert written(record)["theme"] == "dark"


class Tagged(Record):
    command: str
    labels: Annotated[dict[str, str], Since("0.2")] = Field(default_factory=dict)
    weight: Annotated[int, Since("0.2")] = 0


class Holder(Record):
    items: list[Tagged]


def test_a_field_added_since_the_previous_release_is_written_only_when_set():
    assert written(Tagged(command="x")) == {"command": "x"}
    assert written(Tagged(command="x", labels={"team": "a"}, weight=3)) == {
        "command": "x",
        "labels": {"team": "a"},
        "weight": 3,
    }
    assert written(Holder(items=[Tagged(command="x"), Tagged(command="y", weight=1)])) == {
        "items": [{"command": "x"}, {"command": "y", "weight": 1}]
    }
    # what the API answers is the model whole: the marker is only for what is stored or sent
    assert Tagged(command="x").model_dump() == {"command": "x", "labels": {}, "weight": 0}
    assert stored(Tagged, {"command": "x"}).labels == {}


def test_what_this_release_writes_of_a_run_and_a_worker_leaves_out_its_new_fields_while_unset():
    assert "labels" not in written(RunSpec(command="x"))
    assert written(RunSpec(command="x", labels={"team": "vision"}))["labels"] == {"team": "vision"}
    worker = Worker(id="w", pool="cpu", started_at=1, heartbeat_at=2)
    assert "refused" not in written(worker)
    assert written(worker.model_copy(update={"refused": "too old"}))["refused"] == "too old"
