"""Priorities through the Python SDK (``Client`` and ``AsyncClient``) against the real local stack:
at submit, on a queued run (``Client.set_priority``, ``Run.set_priority``), and what a user who is
no admin, or not the run's owner, gets."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from runplane.client import AsyncClient, Client, Conflict, Forbidden, InvalidRequest, NotFound, Run


@pytest.fixture(scope="module")
def admin(devstack):
    with Client(devstack.api_url, "admin-token") as client:
        yield client


def someone(devstack, admin):
    """A client of a user of their own."""
    made = admin.create_token(f"sdkp-{uuid.uuid4().hex[:8]}")
    return Client(devstack.api_url, made.token)


def test_submit_with_a_priority_and_change_it(devstack, admin):
    user = someone(devstack, admin)
    run = user.submit("echo hi", queue="parked", priority=30)
    assert isinstance(run, Run) and (run.priority, run.spec.priority) == (30, 30)
    moved = user.set_priority(run.id, 10)
    assert isinstance(moved, Run) and (moved.priority, moved.state) == (10, "queued")
    assert run.set_priority(50) is run and run.priority == 50  # the run keeps itself up to date
    assert user.get(run.id).events[-1].message.startswith("priority 10 -> 50 by sdkp-")
    with pytest.raises(Forbidden, match="above 50, the most pool parked allows users"):
        run.set_priority(51)
    assert admin.set_priority(run.id, 100).priority == 100
    with pytest.raises(InvalidRequest, match="less than or equal to 100"):
        admin.set_priority(run.id, 101)
    run.kill()
    with pytest.raises(Conflict, match="only a queued run's priority can change"):
        run.set_priority(10)
    plain = user.submit("echo hi", queue="parked")
    assert plain.priority == 50  # the default
    plain.kill()


def test_what_a_user_who_is_no_admin_gets(devstack, admin):
    user, other = someone(devstack, admin), someone(devstack, admin)
    with pytest.raises(Forbidden, match="only admins may set more"):
        user.submit("echo hi", queue="parked", priority=51)
    theirs = other.submit("echo hi", queue="parked")
    with pytest.raises(NotFound) as hidden:
        user.set_priority(theirs.id, 10)
    with pytest.raises(NotFound) as missing:
        user.set_priority("r-" + "0" * 24, 10)
    assert hidden.value.status == missing.value.status == 404
    assert other.get(theirs.id).priority == 50
    theirs.kill()


def test_the_async_client_does_the_same(devstack, admin):
    user = someone(devstack, admin)

    async def main() -> None:
        async with AsyncClient(devstack.api_url, user.token) as client:
            run = await client.submit("echo hi", queue="parked", priority=20)
            assert run.priority == 20
            assert (await client.set_priority(run.id, 40)).priority == 40
            assert (await run.set_priority(45)) is run and run.priority == 45
            with pytest.raises(Forbidden):
                await client.set_priority(run.id, 60)
            await run.kill()
            with pytest.raises(Conflict):
                await run.set_priority(10)

    asyncio.run(main())
