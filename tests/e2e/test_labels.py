"""Labels through the SDK and the CLI on the local stack: set at submit (a run, a sweep's runs),
shown with the run, and a filter of the listing."""

import json
import uuid

import pytest

from runplane.client import Client
from tests.e2e.test_cli import cli, new_user


@pytest.fixture
def newcomer(devstack):
    """A client of a user of their own: their runs are only the test's."""
    with Client(devstack.api_url, "admin-token") as admin:
        made = admin.create_token(f"labels-{uuid.uuid4().hex[:8]}")
    with Client(devstack.api_url, made.token) as client:
        yield client


def test_the_sdk_sets_labels_and_lists_by_them(newcomer):
    tag = uuid.uuid4().hex[:8]
    labelled = newcomer.submit("echo hi", queue="parked", labels={"exp": tag, "team/vision": "a b ✓"})
    other = newcomer.submit("echo hi", queue="parked", labels={"exp": "other"})
    plain = newcomer.submit("echo hi", queue="parked")
    assert labelled.labels == {"exp": tag, "team/vision": "a b ✓"}
    assert newcomer.get(labelled.id).view.spec.labels == labelled.labels
    assert plain.labels == {}
    assert [r.id for r in newcomer.runs(label=f"exp={tag}")] == [labelled.id]
    assert [r.id for r in newcomer.runs(label="exp=other")] == [other.id]
    assert {r.id for r in newcomer.runs()} == {labelled.id, other.id, plain.id}
    # a page of a filtered listing may be short: the iterator goes on with its cursor to the end
    assert [r.id for r in newcomer.runs(label=f"exp={tag}", page_size=1)] == [labelled.id]
    sweep = newcomer.submit_sweep("echo $I", parameters={"I": [1, 2]}, queue="parked", labels={"exp": tag})
    members = {m.id for m in sweep.members()}
    assert len(members) == 2
    assert {r.id for r in newcomer.runs(label=f"exp={tag}")} == members | {labelled.id}


def test_the_cli_sets_labels_shows_them_and_lists_by_them(devstack, tmp_path):
    token = new_user(devstack, tmp_path, "labels")
    tag = uuid.uuid4().hex[:8]
    made = cli(devstack, "run", "--queue", "parked", "--label", f"exp={tag}", "--label", "team=vision", "--", "echo hi",
               token=token, home=tmp_path)  # fmt: skip
    assert made.returncode == 0, made.stderr
    run_id = made.stdout.strip()
    plain = cli(devstack, "run", "--queue", "parked", "--", "echo hi", token=token, home=tmp_path)
    assert plain.returncode == 0, plain.stderr
    shown = cli(devstack, "status", run_id, "--json", token=token, home=tmp_path)
    assert json.loads(shown.stdout)["spec"]["labels"] == {"exp": tag, "team": "vision"}
    text = cli(devstack, "status", run_id, token=token, home=tmp_path)
    assert f"exp={tag}, team=vision" in text.stdout
    listed = cli(devstack, "ls", "--label", f"exp={tag}", "--json", token=token, home=tmp_path)
    assert [r["id"] for r in json.loads(listed.stdout)["runs"]] == [run_id]
    bad = cli(devstack, "run", "--queue", "parked", "--label", "Exp=1", "--", "true", token=token, home=tmp_path)
    assert bad.returncode == 2 and "labels.Exp" in bad.stderr, bad.stderr  # the API's 422, a usage error
    swept = cli(devstack, "sweep", "run", "-p", "I=1,2", "--queue", "parked", "--label", f"exp={tag}", "--json",
                "--", "echo $I", token=token, home=tmp_path)  # fmt: skip
    assert swept.returncode == 0, swept.stderr
    listed = cli(devstack, "ls", "--label", f"exp={tag}", "--json", token=token, home=tmp_path)
    assert len(json.loads(listed.stdout)["runs"]) == 3  # the run and the sweep's two
