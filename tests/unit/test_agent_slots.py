"""The agent's hold on its slots and its configuration, without Docker or a store: a run whose
thread is gone never keeps the agent waiting, and the configuration it is given is the one it
uses."""

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from worker_agent.agent import Agent
from worker_agent.run_config import AgentConfig, AgentPorts, ExecutorConfig


def _agent(tmp_path: Path, executor: ExecutorConfig | None = None) -> Agent:
    config = AgentConfig(pool="p", worker_id="w-1", work_dir=tmp_path / "w-1", executor=executor)
    return Agent(config, AgentPorts(None, None, None), registry=None, docker_client=None, clock=time.time)  # type: ignore[arg-type]


def test_drain_passes_over_a_run_whose_thread_is_gone(tmp_path):
    """A run whose thread died without giving its slot back kept ``_drain`` joining it for ever."""
    agent = _agent(tmp_path)
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    agent.slots.active["r-1"] = SimpleNamespace(thread=dead)  # type: ignore[assignment]
    drained = threading.Thread(target=agent._drain, daemon=True)
    drained.start()
    drained.join(5)
    assert not drained.is_alive()


def test_the_executor_configuration_is_used_as_given(tmp_path):
    given = ExecutorConfig(worker_id="w-1", work_dir=tmp_path / "w-1", kill_poll_seconds=0.25)
    assert _agent(tmp_path, given).executor_config is given
    assert _agent(tmp_path).executor_config == ExecutorConfig(worker_id="w-1", work_dir=tmp_path / "w-1")
    with pytest.raises(ValueError, match="must be the agent's"):  # rewritten after construction, before
        _agent(tmp_path, ExecutorConfig(worker_id="w-other", work_dir=tmp_path / "w-1"))
