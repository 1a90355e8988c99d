"""The API's resolver serves requests on several threads at once, each reading its own request."""

import threading

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver

from runplane.api.gateway import http_event
from runplane.api.resolver import ConcurrentResolver


def _app(resolver_class, rendezvous):
    app = resolver_class()

    @app.get("/who")
    def who():
        # both requests are inside a route at once before either reads its headers again
        first = app.current_event.get_header_value("x-user")
        app.append_context(user=first)
        rendezvous()
        return {"header": app.current_event.get_header_value("x-user"), "context": app.context.get("user"),
                "first": first}  # fmt: skip

    return app


def _serve_two(app):
    answers = {}

    def call(user):
        event = http_event("GET", "/who", "", {"X-User": user}, b"", "127.0.0.1")
        answers[user] = app.resolve(event, None)

    threads = [threading.Thread(target=call, args=(u,)) for u in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return answers


def test_two_requests_resolved_at_once_each_read_their_own_headers_and_context():
    barrier = threading.Barrier(2, timeout=5)
    answers = _serve_two(_app(ConcurrentResolver, barrier.wait))
    for user in ("alice", "bob"):
        assert answers[user]["statusCode"] == 200, answers[user]
        assert f'"header":"{user}"' in answers[user]["body"].replace(" ", "")
        assert f'"context":"{user}"' in answers[user]["body"].replace(" ", "")


def test_the_plain_resolver_would_mix_them_up():
    """Why the resolver exists: Powertools' own keeps one request per class, so the second
    request overwrites the first one's event while both are inside their routes."""
    barrier = threading.Barrier(2, timeout=5)
    answers = _serve_two(_app(APIGatewayHttpResolver, barrier.wait))
    headers = {a["body"].replace(" ", "").split('"header":"')[1].split('"')[0] for a in answers.values()}
    assert len(headers) == 1  # both answered with the same request's header


def test_an_event_wrapped_in_its_proxy_class_is_resolved_the_same():
    from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2

    app = _app(ConcurrentResolver, lambda: None)
    event = APIGatewayProxyEventV2(http_event("GET", "/who", "", {"X-User": "carol"}, b"", "127.0.0.1"))
    answer = app.resolve(event, None)
    assert answer["statusCode"] == 200 and '"carol"' in answer["body"]


def test_routes_first_called_at_the_same_moment_all_keep_working():
    """Each route builds its middleware chain on its first call; two first calls at once must not
    build it twice (a chain built twice answers every later call with a 500)."""
    import sys

    app = ConcurrentResolver()
    names = [f"r{i}" for i in range(150)]
    for name in names:
        app.get(f"/{name}")(lambda name=name: {"route": name})
    failures = []
    start = threading.Barrier(6, timeout=10)

    def call_all():
        start.wait()
        for name in names:  # all in the same order: each route's first calls come together
            answer = app.resolve(http_event("GET", f"/{name}", "", {}, b"", "127.0.0.1"), None)
            if answer["statusCode"] != 200:
                failures.append((name, answer["statusCode"]))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: first calls overlap
    try:
        threads = [threading.Thread(target=call_all) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert failures == []
    for name in names:  # and afterwards, one by one
        assert app.resolve(http_event("GET", f"/{name}", "", {}, b"", "127.0.0.1"), None)["statusCode"] == 200
