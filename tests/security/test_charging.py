"""Charging is exact: a user in several groups names the group a run (or a sweep) is charged to,
unless an administrator set their default group, and a worker started with ``--group G`` takes
only runs charged to G, not any run of one of G's members. A user in two groups who named none used
to be charged to no group, and a group's worker took their runs charged to their other group.

Through the real API on both clouds' local stacks (``front``), and the agent's own take of a hint
on both clouds' stores. Every test makes users and groups of its own."""

import time
import uuid
from pathlib import Path

import pytest

from runplane.client import Client
from runplane.domain.runs import RunSpec
from runplane.domain.states import RunState
from runplane.domain.tenancy import Principal
from runplane.services.runs import submit_run
from tests.conftest import api_status
from worker_agent.agent import Agent
from worker_agent.run_config import AgentConfig, AgentPorts

PARKED = {"command": "echo hi", "queue": "parked"}


def fresh(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def person(front, user):
    """``person(groups)``: (a client of a new user with a token of those groups, the user's name)."""

    def make(groups):
        name = fresh("c")
        made = user("admin").request("POST", "/v1/tokens", {"user": name, "groups": list(groups)})
        return Client(front.api_url, made["token"]), name

    return make


def test_a_user_in_several_groups_names_one_unless_an_admin_set_their_default(user, person):
    vision, nlp = fresh("vision"), fresh("nlp")
    carol, name = person([vision, nlp])
    for path, body in (("/v1/runs", PARKED), ("/v1/sweeps", {"run": PARKED, "count": 2})):
        status, code, message = api_status(lambda p=path, b=body: carol.request("POST", p, b))
        assert (status, code) == (422, "not_allowed"), message
        assert vision in message and nlp in message and "default group" in message, message
    assert carol.request("GET", "/v1/runs")["runs"] == [] and carol.request("GET", "/v1/sweeps")["sweeps"] == []
    assert carol.request("POST", "/v1/runs", {**PARKED, "group": nlp})["group"] == nlp  # naming one works

    admin = user("admin")
    shown = admin.request("GET", f"/v1/users/{name}")
    assert (shown["groups"], shown["default_group"]) == (sorted([vision, nlp]), None)
    set_ = admin.request("PUT", f"/v1/users/{name}", {"default_group": vision})
    assert (set_["default_group"], set_["updated_by"]) == (vision, "admin")
    assert carol.request("GET", "/v1/me")["default_group"] == vision
    assert carol.request("POST", "/v1/runs", PARKED)["group"] == vision
    assert carol.request("POST", "/v1/sweeps", {"run": PARKED, "count": 1})["group"] == vision
    assert carol.request("POST", "/v1/runs", {**PARKED, "group": nlp})["group"] == nlp  # a named group wins

    # only an admin sets it, only to one of the user's groups, only for a user there is
    other = fresh("other")
    refused = api_status(lambda: admin.request("PUT", f"/v1/users/{name}", {"default_group": other}))
    assert refused[:2] == (422, "not_allowed") and other in refused[2] and vision in refused[2]
    assert api_status(lambda: carol.request("PUT", f"/v1/users/{name}", {"default_group": nlp}))[0] == 403
    assert api_status(lambda: carol.request("GET", f"/v1/users/{name}"))[0] == 403
    assert api_status(lambda: admin.request("GET", f"/v1/users/{fresh('nobody')}"))[:2] == (404, "not_found")
    typo = api_status(lambda: admin.request("PUT", f"/v1/users/{name}", {"default_group": vision, "x": 1}))
    assert typo[:2] == (422, "invalid_request")
    cleared = admin.request("PUT", f"/v1/users/{name}", {"default_group": None})
    assert cleared["default_group"] is None
    assert api_status(lambda: carol.request("POST", "/v1/runs", PARKED))[0] == 422


@pytest.fixture(params=["aws_stack", "azure_stack"])
def stack(request):
    return request.getfixturevalue(request.param)


def test_a_groups_worker_takes_only_runs_charged_to_its_group(stack, tmp_path: Path):
    """carol is in vision and nlp: her run charged to nlp is not vision's to run, and the agent of a
    ``--group vision`` worker hands its hint back untaken (no claim, no cores held)."""
    carol = Principal(user="carol", scopes=["runs:read", "runs:write"], groups=["nlp", "vision"])

    def submit(group):
        spec = RunSpec.model_validate({"command": "echo hi", "queue": "parked", "group": group})
        return submit_run(stack.ports, carol, spec, None).run

    config = AgentConfig(pool="parked", worker_id="w-vision", work_dir=tmp_path / "w", cpuset=(0, 1), group="vision")
    agent = Agent(
        config, AgentPorts(stack.store, stack.queue, stack.objects), registry=None, docker_client=None, clock=time.time
    )  # type: ignore[arg-type]
    nlp = submit("nlp")
    (delivery,) = stack.queue.receive("parked", 1, 5, visibility_seconds=30)
    assert delivery.message.run_id == nlp.id

    agent.intake.take(delivery)

    after = stack.store.get(nlp.id)
    assert (after.state, after.worker_id, after.group) == (RunState.QUEUED, None, "nlp")
    assert agent.slots.claimed == 0 and agent.slots.allocator.free() == (2, 0)
    assert agent.intake.refuses(after) == "this worker serves group vision only and the run is charged to group nlp"
    assert agent.intake.refuses(submit("vision")) is None  # what is vision's, it takes
