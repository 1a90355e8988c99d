"""Runs end to end on Azure terms: HTTP function -> Table + Queue -> dispatcher queue trigger ->
local agent (configured by storage connection string) -> real Docker -> Blob, on Azurite."""

import base64
import urllib.parse
import urllib.request

import pytest

from runplane.client import Client
from tests.conftest import TERMINAL, wait_for, wait_state
from tests.gate import GATE, open_gate, output_dir

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def alice(azure_devstack):
    return Client(azure_devstack.api_url, "alice-token")


def logs(client, run_id, stream="stdout", offset=0):
    return client.request("GET", f"/v1/runs/{run_id}/logs", query={"stream": stream, "offset": offset})


def test_run_succeeds_and_its_outputs_download_through_sas_urls(docker_client, alice, azure_devstack):
    run = alice.request(
        "POST",
        "/v1/runs",
        {
            "command": "echo hello; echo oops >&2; echo 42 > answer; mkdir sub; echo $GREETING > sub/env",
            "env": {"GREETING": "hi"},
        },
    )
    done = wait_state(alice, run["id"], TERMINAL, timeout=90)
    assert done["state"] == "succeeded", done
    assert (done["exit_code"], done["failure"]) == (0, None)
    assert [e["state"] for e in done["events"] if e["state"]] == [
        "queued",
        "preparing",
        "running",
        "uploading",
        "succeeded",
    ]
    assert logs(alice, run["id"]) == {"data": "hello\n", "next_offset": 6, "complete": True}
    assert logs(alice, run["id"], "stderr")["data"] == "oops\n"
    files = alice.request("GET", f"/v1/runs/{run['id']}/outputs")["files"]
    assert sorted((f["path"], f["size"]) for f in files) == [("answer", 3), ("sub/env", 3)]
    blob_endpoint = dict(p.split("=", 1) for p in azure_devstack.endpoint.split(";") if p)["BlobEndpoint"]
    got = {}
    for f in files:
        url = urllib.parse.urlsplit(f["url"])
        assert f["url"].startswith(blob_endpoint + "/")  # Azurite's Blob service, not the API
        assert {"sig", "se", "sp"} <= set(urllib.parse.parse_qs(url.query))  # a SAS, read-only
        assert urllib.parse.parse_qs(url.query)["sp"] == ["r"]
        with urllib.request.urlopen(f["url"], timeout=10) as resp:
            got[f["path"]] = resp.read()
    assert got == {"answer": b"42\n", "sub/env": b"hi\n"}


def test_logs_are_readable_while_the_run_goes(docker_client, alice, azure_devstack):
    run = alice.request("POST", "/v1/runs", {"command": f"echo first; {GATE}; echo second"})
    page = wait_for(lambda: (p := logs(alice, run["id"]))["data"] and p, 90, 0.1, "the first log line")
    assert page == {"data": "first\n", "next_offset": 6, "complete": False}
    assert alice.request("GET", f"/v1/runs/{run['id']}")["state"] == "running"
    agents_root = azure_devstack.config.state_dir / str(azure_devstack.config.port) / "agents"
    open_gate(output_dir(agents_root, run["id"]))
    rest = wait_for(
        lambda: (p := logs(alice, run["id"], offset=page["next_offset"]))["complete"] and p,
        60,
        0.2,
        "the end of the logs",
    )
    assert rest["data"] == "second\n"
    assert wait_state(alice, run["id"], TERMINAL)["state"] == "succeeded"


def test_nonzero_exit_is_a_clear_failure(docker_client, alice):
    run = alice.request("POST", "/v1/runs", {"command": "echo 'no such file: data.csv' >&2; exit 3"})
    done = wait_state(alice, run["id"], TERMINAL, timeout=90)
    assert (done["state"], done["exit_code"], done["failure"]["reason"]) == ("failed", 3, "nonzero_exit")
    assert "no such file: data.csv" in done["failure"]["message"]


def test_a_secret_is_sealed_under_the_stack_directorys_key_file(alice, azure_devstack):
    """No Key Vault here: the Azure dev stack seals under a key file (0600) in its directory, which
    its agents open with (a run using one on each cloud's stack: tests/e2e/test_secrets.py); the
    Table entity holds the sealed value, never the value."""
    from runplane.bootstrap import azure_clients, azure_names
    from runplane.devstack.stack import stack_dir
    from runplane.settings import StackSettings

    value = "az-s3cr3t-" + "x" * 13
    view = alice.request("PUT", "/v1/secrets/azure-e2e-token", {"value": value})
    assert (view["ref"], view["size"], "value" in view) == ("azure-e2e-token", len(value), False)
    key_file = stack_dir(azure_devstack.config) / "secrets.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    settings = StackSettings(
        cloud="azure", prefix=azure_devstack.config.prefix, azure_storage_connection_string=azure_devstack.endpoint
    )
    table = azure_clients(settings).tables.get_table_client(azure_names(settings).secrets_table)
    raw = repr([dict(entity) for entity in table.list_entities()])
    assert "azure-e2e-token" in raw and '"key_id":"file:' in raw
    assert value not in raw and base64.b64encode(value.encode()).decode()[:16] not in raw


def test_exec_meets_its_worker_through_web_pubsub(alice, azure_devstack):
    """``runplane exec -i`` into a run of the Azure stack: the relay is Web PubSub's stand-in, its
    hub's connect event answered by the function app's /relay/events."""
    from tests.e2e.test_cli import cli

    run = alice.submit("sleep 600", queue="default")
    try:
        wait_for(lambda: run.refresh(wait=2).state == "running" or run.done, timeout=120, what="the run running")
        assert run.state == "running", run.view
        proc = cli(azure_devstack, "exec", "-i", run.id, "--", "sh", stdin="echo hi; exit 3\n")
        assert (proc.returncode, proc.stdout, proc.stderr) == (3, "hi\n", "")
        opened = alice.open_session(run.id, "exec", command=["true"])
        assert "/client/hubs/runplane?" in opened.relay.url and "webpubsub_mode=sendToGroup" in opened.relay.url
        assert "X-Runplane-Ticket" in opened.relay.headers
        alice.close_session(run.id, opened.id)
    finally:
        run.kill()
