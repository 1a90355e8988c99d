"""The SDK's secrets requests, without a server: where each goes, and that a request carrying a
value never shows it (printed, logged or in a traceback), while the bytes sent hold it."""

from __future__ import annotations

import pytest

from runplane.client import Client
from runplane.client._admin_plans import secrets_path
from runplane.client._core import ApiRequest, Send, Sensitive


def test_a_request_carrying_a_value_shows_stars_and_sends_the_value():
    with Client("http://127.0.0.1:9", "t") as client:
        plan = client._plans.set_secret("wandb", "hunter2-and-more", None)
        step = next(plan)
        plan.close()
        assert isinstance(step, Send) and isinstance(step.request.body, Sensitive)
        for shown in (repr(step), str(step), repr(step.request), str(step.request.body)):
            assert "hunter2" not in shown and "'***'" in shown, shown
        args = client._plans.http_args(step.request)
    assert (args["method"], args["url"]) == ("PUT", "http://127.0.0.1:9/v1/secrets/wandb")
    assert args["content"] == b'{"value":"hunter2-and-more"}'
    assert "hunter2" not in repr(ApiRequest("PUT", "/v1/secrets/x", body=Sensitive(value="hunter2")))


def test_a_value_that_is_not_text_is_refused_before_anything_is_sent():
    with Client("http://127.0.0.1:9", "t") as client, pytest.raises(TypeError, match="text"):
        next(client._plans.set_secret("raw", b"bytes", None))  # type: ignore[arg-type]


def test_paths_of_a_users_and_a_groups_secrets():
    assert secrets_path(None) == "/v1/secrets"
    assert secrets_path(None, "wandb") == "/v1/secrets/wandb"
    assert secrets_path("vision", "hf") == "/v1/groups/vision/secrets/hf"
    assert secrets_path("vision") == "/v1/groups/vision/secrets"
    assert secrets_path(None, "../tokens") == "/v1/secrets/..%2Ftokens"  # a name cannot walk to another route
    for group, name in (("", None), (None, "")):
        with pytest.raises(ValueError, match="empty"):
            secrets_path(group, name)
