"""moto's server in a process of its own, as the local stack starts it."""

import sys
import urllib.request

import pytest

from runplane.devstack.moto_process import MotoProcess
from runplane.domain.errors import BackendError


def test_it_serves_on_the_port_it_took_and_is_gone_once_stopped():
    moto = MotoProcess()
    endpoint = moto.start()
    process = moto.process
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=10) as resp:
            assert resp.status == 200
    finally:
        moto.stop()
    assert process is not None and process.poll() is not None  # exited, and reaped
    moto.stop()  # twice is harmless


def test_a_child_that_never_says_it_serves_is_an_error_and_is_stopped(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")  # exits at once without a word
    moto = MotoProcess()
    with pytest.raises(BackendError, match="moto's server did not start"):
        moto.start()
    assert moto.process is None
