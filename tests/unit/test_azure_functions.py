"""The Azure Functions app without storage: its bindings, host.json, the HTTP conversion, and
the local Functions host's routing and settings."""

import base64
import json
from pathlib import Path

import azure.functions as func
import pytest

from functions.azure import api, function_app
from runplane.api import azure_front
from runplane.api.gateway import http_event, response_parts
from runplane.devstack.functions_host import FunctionsHost, HostOptions, route_pattern, timespan_seconds

HOST_JSON = Path(function_app.__file__).with_name("host.json")
SETTINGS = {
    "RunplaneStorage": "UseDevelopmentStorage=true",
    "RunplaneEventsQueue": "p-events",
    "RunplaneSchedule": "*/5 * * * * *",
}


def bindings():
    """{function name: its trigger binding}, as the host indexes them (function.json form)."""
    out = {}
    for f in function_app.make_app().get_functions():
        data = json.loads(f.get_function_json())
        assert data["scriptFile"] == "function_app.py"
        out[f.get_function_name()] = next(b for b in data["bindings"] if b["type"].endswith("Trigger"))
    return out


def test_one_app_holds_the_api_dispatcher_reaper_and_relay_events():
    assert isinstance(function_app.app, func.FunctionApp)  # what the host indexes
    found = bindings()
    assert set(found) == {"api", "ui", "dispatcher_events", "dispatcher_schedule", "reaper", "relay_events"}
    relay = found["relay_events"]  # Web PubSub's event handler: its own signatures, not a token
    assert (relay["route"], relay["authLevel"].lower()) == ("relay/events", "anonymous")
    http = found["api"]
    assert (http["route"], http["authLevel"].lower()) == ("v1/{*path}", "anonymous")
    assert "methods" not in http  # every method reaches the API, as with API Gateway's ANY
    assert (found["ui"]["route"], found["ui"]["authLevel"].lower()) == ("ui/{*path}", "anonymous")
    assert "methods" not in found["ui"]  # the API answers 405 itself
    queue = found["dispatcher_events"]
    assert (queue["type"], queue["queueName"], queue["connection"]) == (
        "queueTrigger",
        "%RunplaneEventsQueue%",
        "RunplaneStorage",
    )
    assert found["dispatcher_schedule"]["schedule"] == found["reaper"]["schedule"] == "%RunplaneSchedule%"


def test_host_json_serves_the_api_at_v1_and_retries_events_plainly():
    host = json.loads(HOST_JSON.read_text())
    assert host["version"] == "2.0"
    options = HostOptions.from_host_json(HOST_JSON)
    assert options.route_prefix == ""  # so /v1/... reaches the API's own routes
    # one event at a time per instance, retried 5 times 10 s apart, then <queue>-poison
    assert (options.batch_size, host["extensions"]["queues"]["newBatchThreshold"]) == (1, 0)
    assert (options.max_dequeue_count, options.visibility_timeout) == (5, 10)
    assert options.message_encoding == "base64"  # as the queue adapter writes them
    assert options.max_polling_interval == 2


def test_host_options_defaults_are_the_real_hosts(tmp_path):
    path = tmp_path / "host.json"
    path.write_text('{"version": "2.0", "extensions": {"queues": {"maxPollingInterval": 1500}}}')
    options = HostOptions.from_host_json(path)
    assert (options.route_prefix, options.batch_size, options.max_dequeue_count) == ("api", 16, 5)
    assert (options.visibility_timeout, options.message_encoding) == (0, "base64")
    assert options.max_polling_interval == 1.5  # a number is milliseconds


@pytest.mark.parametrize(
    ("span", "seconds"), [("00:00:10", 10), ("01:02:03", 3723), ("1.00:00:00", 86400), ("00:00:00.5", 0.5)]
)
def test_timespans(span, seconds):
    assert timespan_seconds(span) == seconds


def test_a_bad_timespan_is_refused():
    with pytest.raises(ValueError, match="not a time span"):
        timespan_seconds("10s")


@pytest.mark.parametrize(
    ("prefix", "path", "params"),
    [
        ("", "/v1/runs/r-1/logs", {"path": "runs/r-1/logs"}),
        ("", "/v1", {"path": None}),
        ("", "/V1/health", {"path": "health"}),
        ("api", "/api/v1/health", {"path": "health"}),
        ("", "/v2/health", None),
        ("", "/v1health", None),
        ("api", "/v1/health", None),
    ],
)
def test_route_templates(prefix, path, params):
    match = route_pattern(prefix, "v1/{*path}").fullmatch(path)
    assert (match.groupdict() if match else None) == params


def test_client_ip_from_forwarded_for():
    assert azure_front.client_ip("203.0.113.9:50312") == "203.0.113.9"
    assert azure_front.client_ip("[2001:db8::1]:443, 10.0.0.1") == "2001:db8::1"
    assert azure_front.client_ip("2001:db8::1") == "2001:db8::1"
    assert azure_front.client_ip(None) == "0.0.0.0"


def test_request_becomes_the_gateway_event_the_aws_front_builds():
    body = b'{"command": "x"}'
    req = func.HttpRequest(
        method="post",
        url="https://app.azurewebsites.net/v1/runs?limit=2&state=queued&state=failed",
        headers={"Authorization": "Bearer t", "X-Forwarded-For": "203.0.113.9:1234", "Host": "app"},
        params={"limit": "2"},
        route_params={"path": "runs"},
        body=body,
    )
    event = azure_front.to_event(req)
    expected = http_event(
        "POST",
        "/v1/runs",
        "limit=2&state=queued&state=failed",
        {"authorization": "Bearer t", "x-forwarded-for": "203.0.113.9:1234", "host": "app"},
        body,
        "203.0.113.9",
    )
    for volatile in ("requestId", "time", "timeEpoch"):
        event["requestContext"].pop(volatile)
        expected["requestContext"].pop(volatile)
    assert event == expected
    assert event["queryStringParameters"] == {"limit": "2", "state": "queued,failed"}


def test_binary_bodies_survive_both_ways():
    raw = bytes(range(256))
    req = func.HttpRequest(method="PUT", url="http://h/v1/x", headers={}, body=raw)
    event = azure_front.to_event(req)
    assert event["isBase64Encoded"] is True
    assert base64.b64decode(event["body"]) == raw
    result = {"statusCode": 200, "headers": {"Content-Type": "application/octet-stream"}, "body": event["body"]}
    result["isBase64Encoded"] = True
    response = azure_front.to_response(result)
    assert (response.status_code, response.get_body(), response.mimetype) == (200, raw, "application/octet-stream")


def test_resolver_answer_becomes_an_http_response():
    result = {
        "statusCode": 201,
        "headers": {"Content-Type": "application/json", "Location": "/v1/runs/r-1"},
        "multiValueHeaders": {"Vary": ["Accept", "Origin"]},
        "body": '{"id": "r-1"}',
        "isBase64Encoded": False,
    }
    response = azure_front.to_response(result)
    assert response.status_code == 201
    assert response.get_body() == b'{"id": "r-1"}'
    assert response.mimetype == "application/json"
    assert dict(response.headers) == {
        "content-type": "application/json",
        "location": "/v1/runs/r-1",
        "vary": "Accept, Origin",
    }
    assert response_parts(result)[1]["vary"] == "Accept, Origin"


def call_api(method, path, body=b"", headers=None):
    """The HTTP function called in-process, as the host would call it."""
    user_function = api.http_api.build().get_user_function()
    req = func.HttpRequest(
        method=method,
        url=f"http://127.0.0.1:7071{path}",
        headers=headers or {},
        route_params={"path": path.removeprefix("/v1/")},
        body=body,
    )
    response = user_function(req)
    return response.status_code, json.loads(response.get_body() or b"null")


def test_routes_that_need_no_stack():
    assert call_api("GET", "/v1/health") == (200, {"status": "ok"})
    status, doc = call_api("GET", "/v1/openapi.json")
    assert status == 200 and "/v1/runs" in doc["paths"]
    status, body = call_api("DELETE", "/v1/health")
    assert status == 405
    assert body == {"error": {"code": "method_not_allowed", "message": "DELETE is not allowed; use GET"}}
    status, body = call_api("GET", "/v1/nothing")
    assert status == 404
    assert body == {"error": {"code": "not_found", "message": "no route for GET /v1/nothing"}}


def call_host(host, method, path):
    response = host.http(method, f"http://h{path}", path, "", {}, b"")
    return response.status_code, json.loads(response.get_body() or b"null")


def test_local_host_routes_by_the_apps_bindings():
    host = FunctionsHost(function_app.make_app(), HostOptions.from_host_json(HOST_JSON), SETTINGS)
    assert [t.queue for t in host.queue_triggers] == ["p-events"]
    assert set(host.timers) == {"dispatcher_schedule", "reaper"}
    ok = host.http("GET", "http://h/v1/health", "/v1/health", "", {}, b"")
    assert (ok.status_code, json.loads(ok.get_body())) == (200, {"status": "ok"})
    assert host.http("GET", "http://h/api/v1/health", "/api/v1/health", "", {}, b"").status_code == 404
    assert host.http("GET", "http://h/", "/", "", {}, b"").get_body() == b""
    status, body = call_host(host, "OPTIONS", "/v1/runs")
    assert (status, body["error"]["code"]) == (405, "method_not_allowed")  # the API's own answer, not the host's


def test_local_host_refuses_an_unset_binding_setting():
    with pytest.raises(ValueError, match="app setting RunplaneEventsQueue is not set"):
        FunctionsHost(
            function_app.make_app(),
            HostOptions.from_host_json(HOST_JSON),
            {k: v for k, v in SETTINGS.items() if k != "RunplaneEventsQueue"},
        )
