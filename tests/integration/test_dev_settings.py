"""``runplane dev`` hands its settings to the composition root: the functions in its process serve
the stack it built from them, its environment is as it was once it stops (Powertools' own switches
are set while it runs), and its agents get the settings in theirs."""

import os
import uuid
from pathlib import Path

import pytest
import requests

from runplane import bootstrap
from runplane.compute.local.compute import LocalCompute
from runplane.devstack.stack import POWERTOOLS, DevConfig, DevStack, free_port
from runplane.settings import StackSettings


def _handed() -> bootstrap.Stack | None:
    """The stack handed to this process now (put back as it was)."""
    found = bootstrap.use(None)
    bootstrap.use(found)
    return found


def test_the_local_stack_serves_its_settings_without_writing_them_to_the_environment(
    moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in POWERTOOLS:  # unset, so that start sets them (put back after the test)
        monkeypatch.delenv(name, raising=False)
    before, handed_before = dict(os.environ), _handed()
    prefix = f"s{uuid.uuid4().hex[:8]}"
    config = DevConfig(
        port=free_port(),
        aws_endpoint_url=moto_endpoint,
        prefix=prefix,
        state_dir=tmp_path,
        write_dev_file=False,
        functions=False,
        settings={"rehint_seconds": 7},
    )
    dev = DevStack(config)
    dev.start()
    try:
        served = bootstrap.stack()
        assert served.settings == dev.settings
        assert (served.settings.prefix, served.settings.rehint_seconds) == (prefix, 7)
        changed = {name for name in {*before, *os.environ} if os.environ.get(name) != before.get(name)}
        assert changed == set(POWERTOOLS)  # the one change while it runs

        pools = requests.get(f"{dev.api_url}/v1/pools", headers={"Authorization": f"Bearer {dev.token}"}, timeout=30)
        assert pools.status_code == 200, pools.text

        local = served.backend(served.pools.pools[0])
        assert isinstance(local, LocalCompute) and local.env is not None
        assert StackSettings.from_env(local.env) == dev.settings
        assert StackSettings.from_env(dev.environment) == dev.settings
    finally:
        dev.stop()
    assert _handed() is handed_before
    assert dict(os.environ) == before  # what start set for Powertools, stop took back
