"""A stack's directory has one stack at a time: a second start on it (``--fresh`` or not) is refused
before it touches anything, and ``--fresh`` empties nothing that a stack's agents, or a mount, still
use."""

import json
import os
import stat
import subprocess

import pytest
import requests

from runplane.adapters.local.db import DB_FILE
from runplane.adapters.local.keyfile import KEY_FILE
from runplane.compute.local.compute import _start_time
from runplane.devstack import stack as stack_module
from runplane.devstack.stack import DevConfig, DevStack, free_port
from runplane.devstack.state_dir import empty


def _config(tmp_path, port, **kw):
    return DevConfig(port=port, state_dir=tmp_path, **{"write_dev_file": False, "functions": False, "workers": 0, **kw})


def test_a_second_stack_on_a_running_stacks_directory_is_refused_and_empties_nothing(tmp_path):
    port = free_port()
    first = DevStack(_config(tmp_path, port))
    first.start()
    try:
        second = DevStack(_config(tmp_path, port, fresh=True))
        with pytest.raises(ValueError) as refused:
            second.start()
        assert (
            str(refused.value) == f"state directory {first.state_dir} is in use by another runplane (pid {os.getpid()})"
        )
        assert (first.state_dir / DB_FILE).exists()
        me = requests.get(f"{first.api_url}/v1/pools", headers={"Authorization": f"Bearer {first.token}"}, timeout=30)
        assert me.status_code == 200, me.text  # its token and tables are all there
    finally:
        first.stop()
    again = DevStack(_config(tmp_path, port))  # stopped, the directory is free
    again.start()
    again.stop()


def test_fresh_empties_nothing_while_an_agent_of_the_directory_lives(tmp_path):
    state = tmp_path / "state"
    records = state / "workers" / "default"
    records.mkdir(parents=True)
    agent = subprocess.Popen(["sleep", "60"])
    try:
        record = {"id": "default-w1", "pid": agent.pid, "started": _start_time(agent.pid), "created_at": 1.0}
        (records / "default-w1.json").write_text(json.dumps(record))
        (state / DB_FILE).write_text("")
        with pytest.raises(
            ValueError, match=f"still run \\(pid {agent.pid} \\(worker default-w1\\)\\).*kill {agent.pid}"
        ):
            empty(state)
        assert (state / DB_FILE).exists() and (records / "default-w1.json").exists()
    finally:
        agent.kill()
        agent.wait()
    empty(state)  # gone: the directory is emptied
    assert list(state.iterdir()) == []


def test_fresh_never_empties_a_mount_in_the_directory(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data").write_text("not the stack's")
    point = tmp_path / "state" / "agents" / "w1" / "runs"
    point.mkdir(parents=True)
    try:
        subprocess.run(["mount", "--bind", str(outside), str(point)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot make a bind mount here: {e}")
    try:
        with pytest.raises(ValueError, match="is mounted in it"):
            empty(tmp_path / "state")
        assert (outside / "data").read_text() == "not the stack's"
    finally:
        subprocess.run(["umount", str(point)], check=True)


def test_the_secrets_key_file_is_the_directorys_kept_across_starts_and_emptied_by_fresh(tmp_path):
    """Made at the stack's first start (0600 in the 0700 directory), the same key at every start
    after; ``--fresh`` empties it with the database whose secrets it sealed."""
    port = free_port()
    first = DevStack(_config(tmp_path, port))
    first.start()
    first.stop()
    key = first.state_dir / KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(first.state_dir.stat().st_mode) == 0o700
    made = key.read_bytes()
    again = DevStack(_config(tmp_path, port))
    again.start()
    again.stop()
    assert key.read_bytes() == made
    fresh = DevStack(_config(tmp_path, port, fresh=True))
    fresh.start()
    fresh.stop()
    assert key.read_bytes() != made


def test_a_stopped_stack_removes_the_dev_file_that_points_at_it_and_leaves_another_stacks(tmp_path, monkeypatch):
    dev_file = tmp_path / "home" / ".runplane" / "dev.json"
    monkeypatch.setattr(stack_module, "DEV_FILE", dev_file)
    config = _config(tmp_path / "a", free_port(), write_dev_file=True)
    first = DevStack(config)
    first.start()
    try:
        assert json.loads(dev_file.read_text()) == {"api_url": first.api_url, "token": first.token}
        assert stat.S_IMODE(dev_file.stat().st_mode) == 0o600  # it holds an admin token
    finally:
        first.stop()
    assert not dev_file.exists()  # a client no longer finds a stack that stopped

    second = DevStack(_config(tmp_path / "b", free_port(), write_dev_file=True))
    second.start()
    try:  # a later `runplane dev` wrote its own: stopping this one leaves it
        dev_file.write_text(json.dumps({"api_url": "http://127.0.0.1:1", "token": "another stack's"}))
    finally:
        second.stop()
    assert json.loads(dev_file.read_text())["token"] == "another stack's"
