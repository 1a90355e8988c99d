"""A serving stack registers an admin token it is given only while its token store is empty (its
first start): a token revoked since stays revoked across restarts, however it is given again."""

from __future__ import annotations

from pathlib import Path

from runplane.client import Client
from runplane.devstack.stack import DevConfig, DevStack, free_port
from runplane.services.auth import new_token
from tests.conftest import api_status

POOLS = """pools:
  - {name: default, backend: local, cpus: 1, memory: 1g, disk: 1g, max_workers: 0, default_image: busybox}
"""


def _served(tmp_path: Path, token: str) -> DevStack:
    (tmp_path / "pools.yaml").write_text(POOLS)
    config = DevConfig(
        port=free_port(),
        state_dir=tmp_path / "state",
        pools_file=str(tmp_path / "pools.yaml"),
        write_dev_file=False,
        serve=True,
        token=token,
    )
    stack = DevStack(config)
    stack.start()
    return stack


def test_a_revoked_admin_token_given_again_stays_revoked(tmp_path):
    given = new_token()
    first = _served(tmp_path, given)
    try:
        assert first.token == given
        admin = Client(first.api_url, given)
        root = admin.me().token_id
        ops = admin.create_token("ops", scopes=["admin"]).token
        Client(first.api_url, ops).revoke_token(root)
        assert api_status(admin.me)[0] == 401
    finally:
        first.stop()

    second = _served(tmp_path, given)  # restarted with the same --token
    try:
        assert second.token == ""
        assert api_status(Client(second.api_url, given).me)[0] == 401
        assert Client(second.api_url, ops).me().user == "ops"
        assert [t.user for t in Client(second.api_url, ops).tokens()] == ["ops"]
    finally:
        second.stop()
