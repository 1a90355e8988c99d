"""Quotas through the Python SDK (``Client`` and ``AsyncClient``) against the real local stack:
setting, reading, listing and removing them by subject (``alice``, ``@vision``), what a user who
is no admin gets, and runs charged to a group."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from runplane.client import (
    AsyncClient,
    Client,
    Forbidden,
    InvalidRequest,
    NotFound,
    QuotaView,
)
from tests.conftest import ON_EVERY_CLOUD


@pytest.fixture(scope="module")
def admin(devstack):
    with Client(devstack.api_url, "admin-token") as client:
        yield client


def someone(devstack, admin, *groups):
    """A client of a user of their own (in ``groups``), and their name."""
    name = f"sdkq-{uuid.uuid4().hex[:8]}"
    made = admin.create_token(name, groups=list(groups))
    return Client(devstack.api_url, made.token), name


@pytest.fixture
def on_cloud(request):
    """The stack fixture the param names, and its administrator's client."""
    stack = request.getfixturevalue(request.param)
    with Client(stack.api_url, "admin-token") as client:
        yield stack, client


@pytest.mark.parametrize("on_cloud", ON_EVERY_CLOUD, indirect=True)
def test_set_read_list_and_remove(on_cloud):
    devstack, admin = on_cloud
    user, name = someone(devstack, admin)
    group = f"g-{uuid.uuid4().hex[:8]}"
    try:
        stored = admin.set_quota(name, max_running=2, max_gpus=1, gpu_hours=12.5, period="week")
        assert isinstance(stored, QuotaView)
        assert (stored.kind, stored.name, stored.max_running, stored.max_cpus) == ("user", name, 2, None)
        assert stored.usage.running == 0 and stored.usage.period.startswith("week:")
        shared = admin.set_quota(f"@{group}", cpu_hours=100)
        assert (shared.kind, shared.name, shared.period) == ("group", group, "month")
        assert admin.quota(name) == stored
        assert {(q.kind, q.name) for q in admin.quotas()} >= {("user", name), ("group", group)}
        assert user.quota(name).gpu_hours == 12.5
        assert [q.name for q in user.quotas()] == [name]
        replaced = admin.set_quota(name, max_cpus=2.5)
        assert (replaced.max_running, replaced.max_cpus, replaced.period) == (None, 2.5, "month")
        admin.delete_quota(f"@{group}")
        with pytest.raises(NotFound, match=f"no quota for group {group}"):
            admin.quota(f"@{group}")
        with pytest.raises(NotFound):
            admin.delete_quota(f"@{group}")
    finally:
        admin.delete_quota(name)
    assert name not in [q.name for q in admin.quotas()]


def test_what_a_user_who_is_no_admin_gets(devstack, admin):
    user, name = someone(devstack, admin, "sdkq")
    _, other = someone(devstack, admin)
    admin.set_quota(other, max_running=1)
    try:
        with pytest.raises(Forbidden, match="'admin'"):
            user.set_quota(name, max_running=100)
        with pytest.raises(Forbidden):
            user.delete_quota(other)
        with pytest.raises(NotFound) as hidden:
            user.quota(other)
        admin.delete_quota(other)
        with pytest.raises(NotFound) as missing:
            user.quota(other)
        assert (hidden.value.status, hidden.value.message) == (missing.value.status, missing.value.message)
        with pytest.raises(NotFound):
            user.quota("@vision")  # not their group
    finally:
        with contextlib.suppress(NotFound):
            admin.delete_quota(other)


def test_bad_limits_and_subjects(admin):
    with pytest.raises(InvalidRequest, match="max_gpus: Input should be greater than or equal to 0"):
        admin.set_quota("alice", max_gpus=-1)
    with pytest.raises(InvalidRequest, match="period: Input should be 'day', 'week' or 'month'"):
        admin.set_quota("alice", period="year")
    with pytest.raises(InvalidRequest, match="group 'Vision' is not valid"):
        admin.set_quota("@Vision", max_gpus=1)
    for subject in ("", "@"):
        with pytest.raises(ValueError, match="names no user or group"):
            admin.quota(subject)
    with pytest.raises(ValueError, match="max_cpus must be a finite number"):  # JSON has no NaN
        admin.set_quota("alice", max_cpus=float("nan"))
    with pytest.raises(NotFound):
        admin.quota("alice")  # nothing above was stored


def test_submit_charges_a_group(devstack, admin):
    user, _ = someone(devstack, admin, "sdkq-a", "sdkq-b")
    run = user.submit("echo hi", queue="parked", group="sdkq-b")
    assert (run.group, run.spec.group) == ("sdkq-b", "sdkq-b")
    run.kill()
    with pytest.raises(InvalidRequest, match="vision"):
        user.submit("echo hi", queue="parked", group="vision")


def test_the_async_client_does_the_same(devstack, admin):
    _, name = someone(devstack, admin)

    async def main() -> None:
        async with AsyncClient(devstack.api_url, "admin-token") as client:
            stored = await client.set_quota(name, max_gpus=3)
            assert stored.max_gpus == 3
            assert (await client.quota(name)).max_gpus == 3
            assert name in [q.name for q in await client.quotas()]
            await client.delete_quota(name)
            with pytest.raises(NotFound):
                await client.quota(name)
            run = await client.submit("echo hi", queue="parked")
            assert run.group is None
            await run.kill()

    asyncio.run(main())
