"""A run or sweep that sets a field added since the previous release (``Since``) is refused at
submit while its pool has live agents of a release before that field, as the dispatcher counted
them in the pool's record: those agents would leave it waiting. On the real stores of both clouds."""

from __future__ import annotations

import uuid

import pytest

from runplane.api.app import status_of
from runplane.domain.errors import NotAllowed
from runplane.domain.runs import RunSpec
from runplane.domain.sweeps import SweepSpec
from runplane.domain.tenancy import Principal
from runplane.domain.wire import Since
from runplane.services import skew
from runplane.services.runs import submit_run
from runplane.services.sweeps import create_sweep

POOL = "manual"  # the tests start its workers themselves: its record's counts are theirs
UPGRADE = "upgrade the pool's agents (README.md, Upgrading)"


@pytest.fixture(params=["aws_stack", "azure_stack"])
def stack(request):
    return request.getfixturevalue(request.param)


@pytest.fixture
def counted(stack):
    """``counted(versions)``: the pool's record says its live agents are of ``versions``, as the
    dispatcher writes it; the record is put back as it was afterwards."""
    before = stack.ports.pool_states.get(POOL).agent_versions

    def count(versions: dict[str, int]) -> None:
        record = stack.ports.pool_states.get(POOL)
        record.agent_versions = versions
        stack.ports.pool_states.save(record)

    yield count
    count(before)


def _labelled(**more) -> RunSpec:
    return RunSpec(command="echo hi", queue=POOL, labels={"exp": uuid.uuid4().hex[:8]}, **more)


def test_a_labelled_run_or_sweep_is_refused_while_its_pool_has_older_agents(stack, counted):
    alice = Principal(user=f"alice-{uuid.uuid4().hex[:6]}")
    counted({"0.1.0": 2, "0.2.0": 1})
    why = f"labels need agents 0.2 or newer; pool '{POOL}' has agents 0.1.0: {UPGRADE}"
    with pytest.raises(NotAllowed) as refused:
        submit_run(stack.ports, alice, _labelled(), None)
    assert str(refused.value) == why and status_of(NotAllowed) == 422
    with pytest.raises(NotAllowed) as refused:
        create_sweep(stack.ports, alice, SweepSpec(run=_labelled(), parameters={"I": [1, 2]}), None)
    assert str(refused.value) == why
    # what the older agents know goes in; so does a label once only agents that know it are left
    assert submit_run(stack.ports, alice, RunSpec(command="echo hi", queue=POOL, labels={}), None).created
    counted({"0.2.0": 1})
    assert submit_run(stack.ports, alice, _labelled(), None).run.spec.labels
    counted({})  # no live agents: the first to come is of this release's window
    assert submit_run(stack.ports, alice, _labelled(), None).created


def test_which_fields_are_newer_than_an_agent_comes_from_the_since_markers():
    marked = {name for name, field in RunSpec.model_fields.items() if any(isinstance(m, Since) for m in field.metadata)}
    assert marked  # the release brings at least one such field
    spec = _labelled()
    assert set(skew.later_fields(spec)) == {"spec.labels"}
    assert skew.too_new_for(POOL, spec, {"0.1.7": 1, "unknown": 1}) == (
        f"labels need agents 0.2 or newer; pool '{POOL}' has agents 0.1.7, unknown: {UPGRADE}"
    )
    assert skew.too_new_for(POOL, spec, {"0.2.3": 4, "0.3.0": 1}) is None
    assert skew.too_new_for(POOL, RunSpec(command="x", queue=POOL), {"0.1.0": 1}) is None


def test_an_upload_input_needs_agents_that_fetch_uploads():
    """``upload:`` is an input kind, not a field: no ``Since`` marks it, yet 0.2 agents cannot fetch one."""
    spec = RunSpec(command="x", queue=POOL, inputs={"code": f"upload:{'a' * 64}", "data": "s3://bkt/k"})
    assert skew.later_fields(spec) == {"spec.inputs.code": skew.UPLOADS_SINCE}
    assert skew.too_new_for(POOL, spec, {"0.2.9": 1, "0.3.0": 1}) == (
        f"inputs.code need agents 0.3 or newer; pool '{POOL}' has agents 0.2.9: {UPGRADE}"
    )
    assert skew.too_new_for(POOL, spec, {"0.3.0": 2}) is None
    both = spec.model_copy(update={"workdir": "/inputs/code"})
    assert list(skew.later_fields(both)) == ["spec.workdir", "spec.inputs.code"]
