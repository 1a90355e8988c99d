"""Secrets through the Python SDK (``Client`` and ``AsyncClient``) against the real local stack:
set, list and remove a user's own and a group's, what a user who is no admin gets, and runs that
name secrets by reference (another user's reads as one that does not exist). No answer holds a
value."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from runplane.client import AsyncClient, Client, Forbidden, InvalidRequest, NotFound, SecretView

pytestmark = pytest.mark.docker

PARKED = "parked"
"""The pool that never gets a worker: a run submitted there stays queued, as submitted."""


@pytest.fixture(scope="module")
def admin(devstack):
    with Client(devstack.api_url, "admin-token") as client:
        yield client


def someone(devstack, admin, *groups):
    """A client of a user of their own (in ``groups``), and their name."""
    name = f"sdks-{uuid.uuid4().hex[:8]}"
    made = admin.create_token(name, groups=list(groups))
    return Client(devstack.api_url, made.token), name


def test_set_list_use_and_remove_a_users_own(devstack, admin):
    user, name = someone(devstack, admin)
    value = f"wandb-{uuid.uuid4().hex}"
    with user:
        stored = user.set_secret("wandb", value)
        assert isinstance(stored, SecretView)
        assert (stored.name, stored.ref, stored.scope, stored.owner, stored.size) == (
            "wandb",
            "wandb",
            "user",
            name,
            len(value),
        )
        assert stored.updated_by == name and value not in stored.model_dump_json()
        assert [s.ref for s in user.secrets()] == ["wandb"]
        run = user.submit("true", queue=PARKED, secrets={"TOKEN": "wandb"}, image_pull_secret="wandb")
        try:
            assert (run.spec.secrets, run.spec.image_pull_secret) == ({"TOKEN": "wandb"}, "wandb")
            assert value not in run.view.model_dump_json() and value not in user.get(run.id).view.model_dump_json()
        finally:
            run.kill()
        replaced = user.set_secret("wandb", "x" * 5)
        assert replaced.size == 5 and replaced.updated_at >= stored.updated_at
        user.delete_secret("wandb")
        assert user.secrets() == []
        with pytest.raises(NotFound, match="secret wandb does not exist"):
            user.delete_secret("wandb")
        with pytest.raises(NotFound, match="secret wandb does not exist"):
            user.submit("true", queue=PARKED, secrets={"TOKEN": "wandb"})


def test_another_users_secret_reads_as_missing_and_bad_requests_are_refused(devstack, admin):
    owner, _ = someone(devstack, admin)
    other, _ = someone(devstack, admin)
    with owner, other:
        owner.set_secret("mine", "owner-value-1234")
        with pytest.raises(NotFound, match=r"^secret mine does not exist$"):
            other.submit("true", queue=PARKED, secrets={"TOKEN": "mine"})
        with pytest.raises(NotFound):
            other.delete_secret("mine")
        assert other.secrets() == []
        with pytest.raises(InvalidRequest):
            owner.set_secret("Not A Name", "v")
        with pytest.raises(InvalidRequest):
            owner.set_secret("empty", "")
        with pytest.raises(InvalidRequest, match="both in env and in secrets"):
            owner.submit("true", queue=PARKED, env={"TOKEN": "plain"}, secrets={"TOKEN": "mine"})
        with pytest.raises(ValueError, match="empty"):
            owner.secrets(group="")
        owner.delete_secret("mine")


def test_a_groups_secret_is_set_by_an_admin_and_used_by_its_members(devstack, admin):
    group = f"g-{uuid.uuid4().hex[:8]}"
    member, _ = someone(devstack, admin, group)
    outsider, _ = someone(devstack, admin)
    with member, outsider:
        with pytest.raises(Forbidden):
            member.set_secret("hf", "member-value-1234", group=group)
        stored = admin.set_secret("hf", "group-value-1234", group=group)
        try:
            assert (stored.ref, stored.scope, stored.owner) == (f"{group}/hf", "group", group)
            assert [s.ref for s in admin.secrets(group=group)] == [f"{group}/hf"]
            assert [s.ref for s in member.secrets()] == [f"{group}/hf"]
            assert outsider.secrets() == []
            with pytest.raises(Forbidden):
                member.secrets(group=group)
            run = member.submit("true", queue=PARKED, group=group, secrets={"HF_TOKEN": f"{group}/hf"})
            run.kill()
            with pytest.raises(NotFound, match=f"secret {group}/hf does not exist"):
                outsider.submit("true", queue=PARKED, secrets={"HF_TOKEN": f"{group}/hf"})
        finally:
            admin.delete_secret("hf", group=group)
        assert member.secrets() == []


def test_the_async_client_does_the_same(devstack, admin):
    user, _ = someone(devstack, admin)
    user.close()

    async def go() -> None:
        async with AsyncClient(devstack.api_url, user.token) as client:
            stored = await client.set_secret("async-key", "async-value-1234")
            assert (stored.ref, stored.size) == ("async-key", len("async-value-1234"))
            assert [s.ref for s in await client.secrets()] == ["async-key"]
            run = await client.submit("true", queue=PARKED, secrets={"KEY": "async-key"})
            assert run.spec.secrets == {"KEY": "async-key"}
            await run.kill()
            await client.delete_secret("async-key")
            assert await client.secrets() == []
            with pytest.raises(NotFound):
                await client.delete_secret("async-key")

    asyncio.run(go())
