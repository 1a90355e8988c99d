"""A run's secret end to end: set through the API, named by reference, its value in the run's
container and nowhere else. Read back raw: every answer of the API about the run, every stored
item (the SQLite files with their write-ahead logs; the tables of moto and Azurite, scanned), every
queue message (peeked, a run's hint waiting on its queue among them), the run's objects and the
agents' own logs; the value appears in none of them, and the run's log shows it masked."""

import base64
import json
import os
import uuid
from pathlib import Path

import pytest

from runplane.bootstrap import aws_clients, build_stack
from runplane.client import Client
from runplane.domain.secrets import MASK
from runplane.settings import StackSettings
from tests.conftest import ON_EVERY_CLOUD, TERMINAL, api_status, aws_devstack_settings, wait_for, wait_state

pytestmark = pytest.mark.docker

LARGE = 16 * 2**20
PRINT = 'echo "len=${#TOKEN}"; echo "value=$TOKEN"; echo "$TOKEN" >&2; echo "$TOKEN" > out'


def submit(client, command, **extra):
    return client.request("POST", "/v1/runs", {"command": command, **extra})


def found_in(value: str, data: bytes | str) -> bool:
    """Whether ``data`` holds ``value``, as it is or as base64."""
    raw = data.encode() if isinstance(data, str) else data
    return value.encode() in raw or base64.b64encode(value.encode()) in raw


def files_under(root: Path) -> dict[Path, bytes]:
    """Every regular file under ``root`` that this process can read (the stack's database and its
    write-ahead log, the objects, the agents' logs and work dirs)."""
    files = {}
    for top, _dirs, names in os.walk(root):
        for name in names:
            path = Path(top) / name
            try:
                if not path.is_file() or path.is_symlink():
                    continue
                # what other tests left that is large (a dataset in an input cache) holds nothing of ours
                if path.stat().st_size <= LARGE or path.name.startswith("state.db"):
                    files[path] = path.read_bytes()
            except OSError:
                pass
    return files


def raw_local(stack, run_ids):
    """The local stack's files, raw: its database with its write-ahead log (the tables, the
    queue_messages table among them), its objects, the agents' logs and work dirs."""
    files = files_under(Path(stack.config.state_dir))
    db = b"".join(data for path, data in files.items() if path.name.startswith("state.db"))
    assert all(run_id.encode() in db for run_id in run_ids)  # the stored rows were read, not an empty file
    return {str(path): data for path, data in files.items()}


def raw_aws(stack, run_ids):
    """Every item of the stack's DynamoDB tables, every message on its SQS queues (received with
    no visibility timeout: left where they are), and its agents' files."""
    settings = aws_devstack_settings(stack)
    clients = aws_clients(settings)
    ddb, sqs = clients["dynamodb"], clients["sqs"]
    found: dict[str, bytes] = {}
    tables = [t for page in ddb.get_paginator("list_tables").paginate() for t in page["TableNames"]]  # >100 in CI
    for table in tables:
        if table.startswith(f"{settings.prefix}-"):
            items = [i for page in ddb.get_paginator("scan").paginate(TableName=table) for i in page["Items"]]
            found[f"table {table}"] = repr(items).encode()
    for url in sqs.list_queues(QueueNamePrefix=settings.prefix).get("QueueUrls", []):
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0, WaitTimeSeconds=0)
        found[f"queue {url}"] = repr(got.get("Messages", [])).encode()
    found.update(objects_of(build_stack(settings), run_ids))
    found.update(raw_local(stack, []))
    assert any(table.endswith("-secrets") for table in found if table.startswith("table")), sorted(found)
    return found


def raw_azure(stack, run_ids):
    """Every entity of the stack's tables, every message of its queues (peeked) and its agents' files."""
    from azure.data.tables import TableServiceClient
    from azure.storage.queue import QueueServiceClient

    conn, prefix = stack.config.azure_connection_string, stack.config.prefix
    found: dict[str, bytes] = {}
    tables = TableServiceClient.from_connection_string(conn)
    for table in tables.list_tables():
        if table.name.startswith(prefix):
            entities = list(tables.get_table_client(table.name).list_entities())
            found[f"table {table.name}"] = repr([dict(e) for e in entities]).encode()
    queues = QueueServiceClient.from_connection_string(conn)
    for queue in queues.list_queues(name_starts_with=prefix.lower()):
        peeked = queues.get_queue_client(queue.name).peek_messages(max_messages=32)
        bodies = [str(m.content) for m in peeked]  # base64 of the JSON, as the adapter sends them
        found[f"queue {queue.name}"] = repr([*bodies, *(base64.b64decode(b) for b in bodies)]).encode()
    settings = StackSettings(
        cloud="azure", prefix=prefix, azure_storage_connection_string=conn, pools=stack.config.pools_file
    )
    found.update(objects_of(build_stack(settings), run_ids))
    found.update(raw_local(stack, []))
    assert any(t.endswith("secrets") for t in found if t.startswith("table")), sorted(found)
    return found


def objects_of(stack, run_ids):
    """The runs' objects (log chunks, outputs), as stored."""
    return {
        f"object {info.key}": stack.objects.get_bytes(info.key)
        for run_id in run_ids
        for info in stack.objects.list(f"runs/{run_id}/")
    }


RAW = {"devstack": raw_local, "aws_devstack": raw_aws, "azure_devstack": raw_azure}


@pytest.mark.parametrize("alice", ON_EVERY_CLOUD, indirect=True)
def test_a_secret_reaches_the_runs_container_and_no_store_queue_answer_or_log(docker_client, alice, request):
    on = request.node.callspec.params["alice"]
    stack = request.getfixturevalue(on)
    value = f"tok-{uuid.uuid4().hex}"
    view = alice.set_secret("mytoken", value)
    assert view.name == "mytoken" and view.size == len(value)
    run = submit(alice, PRINT, secrets={"TOKEN": "mytoken"})
    # a second one waits on the queue of a pool without workers: its hint is read back as sent
    waiting = submit(alice, PRINT, secrets={"TOKEN": "mytoken"}, queue="manual")
    done = wait_state(alice, run["id"], TERMINAL, timeout=120)
    assert done["state"] == "succeeded", done
    logs = alice.request("GET", f"/v1/runs/{run['id']}/logs")
    assert logs["data"] == f"len={len(value)}\nvalue={MASK}\n"
    assert alice.request("GET", f"/v1/runs/{run['id']}/logs", query={"stream": "stderr"})["data"] == f"{MASK}\n"
    outputs = alice.request("GET", f"/v1/runs/{run['id']}/outputs")["files"]
    assert [f["path"] for f in outputs] == ["out"]  # what the run itself wrote holds it, as it may
    # every answer about the runs, and about the secret
    answers = {
        "run": done,
        "waiting": alice.request("GET", f"/v1/runs/{waiting['id']}"),
        "listing": alice.request("GET", "/v1/runs"),
        "logs": logs,
        "secrets": alice.request("GET", "/v1/secrets"),
        "set": view.model_dump() if hasattr(view, "model_dump") else vars(view),
    }
    assert done["spec"]["secrets"] == {"TOKEN": "mytoken"}
    for what, answer in answers.items():
        assert not found_in(value, json.dumps(answer, default=str)), what
    # every stored item, queue message, object and file
    raw = RAW[on](stack, [run["id"], waiting["id"]])
    assert any(waiting["id"].encode() in data for where, data in raw.items() if "queue" in where or "state.db" in where)
    assert any(where.endswith(f"/{done['worker_id']}.log") for where in raw), "the agent's log was not read"
    holding = [where for where, data in raw.items() if found_in(value, data)]
    # the one place it is: the file the run wrote, uploaded (and in its run directory until that
    # goes); read back like the rest, so the reading is seen to find what is there
    wrote = (f"runs/{run['id']}/outputs/1/out", f"/runs/{run['id']}-1/output/out")
    assert holding and all(where.endswith(wrote) for where in holding), holding
    alice.request("POST", f"/v1/runs/{waiting['id']}/kill")
    # another user naming it: as if it did not exist
    bob = Client(alice.url, "bob-token")
    status, code, message = api_status(lambda: submit(bob, "true", secrets={"TOKEN": "mytoken"}))
    assert (status, code) == (404, "not_found") and "mytoken does not exist" in message
    wait_for(lambda: alice.request("GET", f"/v1/runs/{waiting['id']}")["state"] == "killed", 30, 0.2, "the kill")
