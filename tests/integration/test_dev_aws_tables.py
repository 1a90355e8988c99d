"""``runplane dev --cloud aws`` with a moto of its own puts its tables on a dynalite of its own
(where conditional writes are atomic when they race, as on DynamoDB), and serves runs on them."""

from __future__ import annotations

import httpx
import pytest

from runplane.devstack.process import DevStackProcess
from runplane.devstack.stack import DevConfig, free_port

pytestmark = pytest.mark.dynalite

POOLS = """pools:
  - {name: default, backend: local, cpus: 1, memory: 1g, disk: 1g, max_workers: 0, default_image: busybox}
"""


def test_a_moto_of_its_own_gets_its_tables_on_dynalite(tmp_path):
    (tmp_path / "pools.yaml").write_text(POOLS)
    config = DevConfig(
        port=free_port(), cloud="aws", state_dir=tmp_path, pools_file=str(tmp_path / "pools.yaml"), write_dev_file=False
    )
    stack = DevStackProcess(config, tmp_path / "dev.log")
    stack.start()
    try:
        assert stack.services == "moto, tables on dynalite"
        auth = {"Authorization": f"Bearer {stack.token}"}
        made = httpx.post(f"{stack.api_url}/v1/runs", json={"command": "true"}, headers=auth)
        assert made.status_code == 201, made.text
        read = httpx.get(f"{stack.api_url}/v1/runs/{made.json()['id']}", headers=auth)
        assert (read.status_code, read.json()["state"]) == (200, "queued")
    finally:
        stack.stop()
    assert "Traceback" not in (tmp_path / "dev.log").read_text()
