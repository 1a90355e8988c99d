"""schemathesis fuzzes every operation of the generated OpenAPI document (and the methods it does
not list) on each cloud's local stack, as an administrator: no 5xx, no status code or content
type the document does not declare, answers that match their schemas, 405s that carry Allow, and
no request the document calls valid refused for its shape (positive_data_acceptance, and
fuzz_checks.py for the error code): the only refusals a valid request may get beyond a missing
thing (404) or a conflict (409) are those its operation lists in ``x-valid-refusals``, each a
status and an error code (422 ``unschedulable``: no pool can fit it; 400 ``bad_request``: a cursor
no listing gave), so a 422 for the request's shape (``invalid_request``) fails even where a 422 for
what it asks is valid.

Runs go to pools that never get a worker, so fuzzed commands never reach Docker. Each phase
(examples, coverage, fuzzing with up to 18 cases an operation, stateful) runs once, to its end,
with a seed that is a fresh one each time, so that every run of the suite explores other inputs
(however fast the machine is, one seed makes the same inputs): it is printed, and a failure names
it; ``RUNPLANE_FUZZ_SEED`` replays one. ``RUNPLANE_FUZZ_EXAMPLES`` asks for more cases an
operation, and ``RUNPLANE_FUZZ_SECONDS`` a longer run (fuzzing and stateful testing repeat until
that time is spent). Not checked: that every invalid request is refused (the document does not
express every rule the models check, such as the reserved environment variable names).
"""

import json
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from runplane.devstack.moto_process import MotoProcess
from runplane.devstack.process import DevStackProcess
from runplane.devstack.stack import DevConfig, free_port

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
CHECKS = Path(__file__).with_name("fuzz_checks.py")
POOLS = """pools:
  - {name: default, cpus: 2, memory: 2g, disk: 5g, max_workers: 0, default_image: runplane/test-busybox:1}
  - {name: gpu, cpus: 4, gpus: 2, memory: 8g, disk: 5g, max_workers: 0, default_image: runplane/test-busybox:1}
"""


@pytest.fixture(params=["aws", "azure"])
def fuzz_stack(request, tmp_path):
    (tmp_path / "pools.yaml").write_text(POOLS)
    if request.param == "aws":
        # a moto of its own: the session's holds every other test's items (its queries read whole
        # tables) and answers in the test process, which fuzzing leaves idle but not empty
        moto = MotoProcess()
        request.addfinalizer(moto.stop)
        cloud = {"cloud": "aws", "aws_endpoint_url": moto.start()}
    else:
        cloud = {"cloud": "azure", "azure_connection_string": request.getfixturevalue("azurite")}
    config = DevConfig(
        port=free_port(),
        token="fuzz-admin-token",
        user="fuzzer",
        pools_file=str(tmp_path / "pools.yaml"),
        prefix=f"fz{uuid.uuid4().hex[:6]}",
        state_dir=tmp_path,
        write_dev_file=False,
        **cloud,
    )
    stack = DevStackProcess(config, tmp_path / "devstack.log")
    stack.start()
    yield stack
    stack.stop()


ACCEPTED = ["2xx", "401", "403", "404", "409"]
"""What a valid request may get on any operation: done, a token that may not, a thing that is not
there (or another user's), a state that conflicts."""


def acceptance_config(document: dict) -> str:
    """schemathesis.toml: each operation that lists ``x-valid-refusals`` may also answer those to a
    valid request."""
    lines = ["[checks.positive_data_acceptance]", f"expected-statuses = {json.dumps(ACCEPTED)}"]
    for item in document["paths"].values():
        for op in item.values():
            if isinstance(op, dict) and op.get("x-valid-refusals"):
                valid = sorted({str(r["status"]) for r in op["x-valid-refusals"]} - set(ACCEPTED))
                statuses = ACCEPTED + valid
                lines += [
                    "",
                    "[[operations]]",
                    f"include-operation-id = {json.dumps(op['operationId'])}",
                    f"checks.positive_data_acceptance.expected-statuses = {json.dumps(statuses)}",
                ]
    return "\n".join(lines) + "\n"


def test_fuzzing_the_api_finds_no_5xx_and_no_undocumented_answer(fuzz_stack, tmp_path):
    seconds = os.environ.get("RUNPLANE_FUZZ_SECONDS")
    seed = os.environ.get("RUNPLANE_FUZZ_SEED") or str(random.SystemRandom().randrange(2**32))
    again = f"seed {seed}: again with RUNPLANE_FUZZ_SEED={seed}"
    print(f"fuzz seed {seed}")
    document = httpx.get(f"{fuzz_stack.api_url}/v1/openapi.json", timeout=30).json()
    (tmp_path / "schemathesis.toml").write_text(acceptance_config(document))
    cmd = [
        str(SCHEMATHESIS),
        "run",
        f"{fuzz_stack.api_url}/v1/openapi.json",
        "--header",
        "Authorization: Bearer fuzz-admin-token",
        "--checks",
        "all",
        "--exclude-checks",
        "negative_data_rejection",
        "--max-examples",
        os.environ.get("RUNPLANE_FUZZ_EXAMPLES", "18"),
        *(["--max-time", seconds] if seconds else []),
        "--seed",
        seed,
        "--request-timeout",
        "20",
        "--no-color",
        "--report-dir",
        str(tmp_path / "reports"),
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(CHECKS)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=float(seconds or 0) + 300, cwd=tmp_path, env=env)
    assert done.returncode == 0, f"{again}\n{done.stdout[-12000:]}\n{done.stderr[-3000:]}"
    log = (tmp_path / "devstack.log").read_text()
    assert "unhandled error" not in log, f"{again}\n{log[-5000:]}"
