"""``runplane dev`` on a port that is taken: one line naming the port and how to choose another,
exit 2, before any service of the local stack is started."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from runplane.devstack.stack import DevConfig, DevStack


@pytest.fixture
def busy_port():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_a_busy_port_names_itself_and_the_way_out(busy_port, tmp_path: Path):
    stack = DevStack(DevConfig(port=busy_port, state_dir=tmp_path, write_dev_file=False))
    with pytest.raises(ValueError, match=rf"^port {busy_port} on 127.0.0.1 is already in use: .*--port N .*PORT=N"):
        stack.start()
    assert stack.endpoint == ""  # no service of the stack (moto, here) was started


def test_the_cli_says_it_in_one_line_and_exits_2(busy_port, tmp_path: Path):
    env = {**os.environ, "HOME": str(tmp_path)}
    env = {k: v for k, v in env.items() if not k.startswith("RUNPLANE_")}
    done = subprocess.run(
        [sys.executable, "-m", "runplane.cli", "dev", "--port", str(busy_port)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"error: port {busy_port} on 127.0.0.1 is already in use: choose another with --port N (make dev PORT=N)"
    ]
