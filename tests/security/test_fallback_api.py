"""Fallback between pools against a hostile user, on both clouds' local stacks: pools to fall back
to that do not exist, do not fit the run, repeat or are not allowed to the caller, and a rule of
when to fall back without pools (or pools without a rule, or without the first pool), are refused
at submit with a 422 and a message that says why, and nothing is stored; a malformed list of
queues is a 422 naming it."""

import pytest

from tests.conftest import api_status

REFUSED = [
    ({"queue": ["parked", "nowhere"], "fallback_after": "1m"}, "fallback pool 'nowhere' does not exist"),
    ({"queue": ["parked", "manual", "parked"], "fallback_after": "1m"}, "pool parked is named twice"),
    ({"queue": ["parked", "manual"]}, "needs fallback_after or fallback_after_preemptions"),
    ({"queue": "parked", "fallback_after_preemptions": 1}, "need pools to fall back to"),
    ({"fallback": ["manual"], "fallback_after": "1m"}, "must name the first pool in queue"),
    ({"queue": ["parked", "manual"], "fallback_after": 5, "resources": {"memory": "3g"}}, "fallback pool manual"),
    (
        {"queue": ["big", "parked"], "fallback_after": 5, "priority": 60, "resources": {"disk": "1g"}},
        "fallback pool parked: priority 60 is above 50",
    ),
]


def test_pools_a_run_cannot_fall_back_to_are_refused_with_the_reason(mallory):
    client, _ = mallory
    for body, words in REFUSED:
        status, code, message = api_status(
            lambda body=body: client.request("POST", "/v1/runs", {"command": "true", **body})
        )
        assert (status, code) == (422, "not_allowed"), (body, message)
        assert words in message, (body, message)
    assert client.request("GET", "/v1/runs")["runs"] == []


@pytest.mark.parametrize(
    "queue",
    [[], ["parked", "a" * 70], ["parked", "m", "n", "o", "p", "q"], ["parked", 7], {"first": "parked"}],
)
def test_a_malformed_list_of_queues_is_a_422(mallory, queue):
    client, _ = mallory
    status, _, message = api_status(lambda: client.request("POST", "/v1/runs", {"command": "true", "queue": queue}))
    assert status == 422 and "queue" in message, message
