"""The dashboard's files as every front serves them: the resolver behind API Gateway (the Lambda
and ``runplane dev``) and the Azure Function, through the host's routing. Right types, headers that
keep the page to its own origin, and nothing outside ``runplane/web`` reachable."""

import json
import re
from pathlib import Path

import pytest

from functions.azure import function_app
from runplane.api import ui
from runplane.api.gateway import http_event, response_parts
from runplane.api.http import app
from runplane.api.openapi import openapi_document
from runplane.devstack.functions_host import FunctionsHost, HostOptions

WEB = Path(ui.__file__).parents[1] / "web"
HOST_JSON = Path(function_app.__file__).with_name("host.json")
SETTINGS = {
    "RunplaneStorage": "UseDevelopmentStorage=true",
    "RunplaneEventsQueue": "p-events",
    "RunplaneSchedule": "*/5 * * * * *",
}


def via_gateway(method, path):
    return response_parts(app.resolve(http_event(method, path, "", {}, b"", "203.0.113.9"), None))


@pytest.fixture(scope="module")
def host():
    return FunctionsHost(function_app.make_app(), HostOptions.from_host_json(HOST_JSON), SETTINGS)


def via_azure(host, method, path):
    response = host.http(method, f"http://h{path}", path, "", {}, b"")
    headers = {k.lower(): v for k, v in response.headers.items()}
    headers.setdefault("content-type", response.mimetype)
    return response.status_code, headers, response.get_body()


FRONTS = ["gateway", "azure"]


def fetch(front, host, method, path):
    return via_gateway(method, path) if front == "gateway" else via_azure(host, method, path)


@pytest.mark.parametrize("front", FRONTS)
@pytest.mark.parametrize(
    ("path", "file", "media"),
    [
        ("/ui", "index.html", "text/html"),
        ("/ui/", "index.html", "text/html"),
        ("/ui/index.html", "index.html", "text/html"),
        ("/ui/app.js", "app.js", "text/javascript"),
        ("/ui/runs.js", "runs.js", "text/javascript"),
        ("/ui/app.css", "app.css", "text/css"),
    ],
)
def test_each_file_with_its_type_and_headers_that_keep_it_to_its_origin(front, host, path, file, media):
    status, headers, body = fetch(front, host, "GET", path)
    assert status == 200
    assert body == (WEB / file).read_bytes()
    assert headers["content-type"].split(";")[0].strip() == media
    csp = {d.split()[0]: d.split()[1:] for d in headers["content-security-policy"].split(";") if d.strip()}
    assert csp["default-src"] == ["'none'"]
    for directive in ("script-src", "style-src", "connect-src"):
        assert csp[directive] == ["'self'"], directive  # no inline code, no other host
    assert csp["frame-ancestors"] == ["'none'"]
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"


def test_every_module_the_page_loads_is_served_and_nothing_from_another_host():
    index = (WEB / "index.html").read_text()
    sources = re.findall(r'(?:src|href)="([^"]+)"', index)
    for js in WEB.glob("*.js"):
        sources += [f"/ui/{m}" for m in re.findall(r'from "\./([^"]+)"', js.read_text())]
        text = js.read_text().replace('"http://www.w3.org/2000/svg"', "")  # a name, never fetched
        assert not re.search(r"https?://", text), js.name
        assert ".innerHTML" not in text  # text from the API is set as text, never parsed
    for source in sources:
        if source.startswith("data:") or source.startswith("#"):
            continue
        assert source.startswith("/ui/"), source
        assert via_gateway("GET", source)[0] == 200, source


@pytest.mark.parametrize("front", FRONTS)
@pytest.mark.parametrize(
    "path",
    [
        "/ui/../api/ui.py",
        "/ui/..%2fapi%2fui.py",
        "/ui/%2e%2e/%2e%2e/pyproject.toml",
        "/ui/..%5c__init__.py",
        "/ui/__init__.py",
        "/ui/.hidden.js",
        "/ui/app.js%00.html",
        "/ui/sub/app.js",
        "/ui/nothing.js",
        "/ui/" + "a" * 5000 + ".js",
        "/ui/APP.JS",
    ],
)
def test_paths_that_leave_the_folder_or_name_no_file_are_404(front, host, path):
    status, _, body = fetch(front, host, "GET", path)
    assert status == 404, body[:200]
    if body:  # the Azure host answers an unrouted path with an empty 404
        assert json.loads(body)["error"]["code"] == "not_found"
        assert b"import" not in body and b"[project]" not in body


@pytest.mark.parametrize("front", FRONTS)
def test_only_get_reads_the_files(front, host):
    status, headers, _ = fetch(front, host, "POST", "/ui/app.js")
    assert (status, headers.get("allow")) == (405, "GET")


def test_the_page_calls_only_routes_the_api_documents():
    documented = [
        re.compile("^" + re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(path)) + "$") for path in openapi_document()["paths"]
    ]
    called = set()
    for js in WEB.glob("*.js"):
        for literal in re.findall(r'"(/v1/[^"]*)"|`(/v1/[^`]*)`', js.read_text()):
            called.add(re.sub(r"\$\{[^}]*\}", "ID", "".join(literal)))
    assert len(called) >= 10  # the page's calls were found
    assert not [path for path in called if not any(p.match(path) for p in documented)], called


def test_a_link_target_is_the_pages_own_route_or_an_address_that_safe_href_let_through():
    """An address from the API (an output's download URL, an input) becomes a link only through
    ``safeHref``, which passes http(s) alone: a ``javascript:`` URL is never made clickable."""
    targets = []
    for js in WEB.glob("*.js"):
        text = js.read_text()
        targets += [(js.name, m) for m in re.findall(r"\bhref: ([^,}]+)", text)]
        if re.search(r"\{ href[,\s}]", text):  # the shorthand: `href` must come from safeHref there
            assert re.search(r"const href = safeHref\(", text), js.name
    assert len(targets) >= 8  # the page's links were found
    unsafe = [(name, t) for name, t in targets if not re.match(r'["`]#/|href$', t.strip())]
    assert not unsafe, unsafe


def test_every_refresh_loop_is_the_one_that_drops_stale_replies_and_backs_off():
    """Pages refresh through ``refresher`` alone: no page arms its own timer, so no page runs two
    loops, answers to an overtaken read are dropped, and errors make the loop wait longer."""
    for js in WEB.glob("*.js"):
        text = js.read_text()
        if js.name == "dom.js":
            continue
        assert "setTimeout(" not in text and "setInterval(" not in text, js.name
    dom = (WEB / "dom.js").read_text()
    assert dom.count("setTimeout(") == 1 and "mine === seq" in dom
