"""The SDK's retries and error mapping against a real HTTP server on loopback that answers as a
test scripts it: 503s and 429s before a success, a connection dropped mid-request, bodies that
are not the API's error shape; and downloads of outputs whose paths would leave the directory
asked for. The client's sleep and random are injected, so nothing waits."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runplane.api.models import RunView
from runplane.client import (
    ApiError,
    AsyncClient,
    Client,
    Conflict,
    ConnectionFailed,
    DownloadFailed,
    InvalidRequest,
    LastAdminToken,
    NotFound,
    QuotaExceeded,
    RateLimited,
    ServerError,
    Unauthorized,
)

RUN = RunView.model_json_schema()["examples"][0]
TOKEN = {
    "id": "tok-0123456789abcdef",
    "user": "dana",
    "groups": [],
    "scopes": ["runs:read"],
    "created_at": "2026-11-23T09:30:00.125Z",
    "expires_at": None,
    "created_by": "admin",
    "token": "rp_secret",
}
DROP = "drop"
"""A scripted answer: read the whole request, then close the connection without answering."""


@dataclass
class Answer:
    status: int
    body: bytes | str | dict[str, Any] = b""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Script:
    """A loopback HTTP server that gives the scripted answers in order (the last one again once
    the script runs out) and records every request it read."""

    def __init__(self) -> None:
        self.answers: list[Answer | str] = []
        self.seen: list[Seen] = []
        script = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                script.seen.append(Seen(self.command, self.path, dict(self.headers.items()), body))
                answer = script.answers[min(len(script.seen), len(script.answers)) - 1]
                if answer == DROP:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                assert isinstance(answer, Answer)
                data = answer.body
                if isinstance(data, dict):
                    data = json.dumps(data)
                raw = data.encode() if isinstance(data, str) else data
                self.send_response(answer.status)
                for key, value in answer.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_DELETE = _any

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def play(self, *answers: Answer | str) -> Script:
        self.answers, self.seen = list(answers), []
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def server() -> Iterator[Script]:
    """One server for the module; each test plays its own script on it."""
    script = Script()
    yield script
    script.stop()


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def client(server: Script, sleeps: list[float]) -> Iterator[Client]:
    """A client of ``server`` whose backoff draws 1.0 (the largest delay) and whose sleeps are
    recorded instead of taken."""
    with Client(server.url, "t0k", sleep=sleeps.append, random=lambda: 1.0) as c:
        yield c


def error(status: int, code: str, message: str) -> Answer:
    return Answer(status, {"error": {"code": code, "message": message}})


def test_submit_is_retried_with_the_same_idempotency_key(server: Script, client: Client, sleeps: list[float]) -> None:
    server.play(error(503, "backend", "retry"), Answer(429, b"", {"Retry-After": "7"}), Answer(503), Answer(201, RUN))
    run = client.submit("python train.py", memory="2g")
    assert (run.id, run.created) == (RUN["id"], True)
    assert [s.method + " " + s.path for s in server.seen] == ["POST /v1/runs"] * 4
    keys = {s.headers["Idempotency-Key"] for s in server.seen}
    assert len(keys) == 1 and len(next(iter(keys))) == 36  # one fresh uuid4, sent every time
    assert {s.body for s in server.seen} == {b'{"command":"python train.py","resources":{"memory":"2g"}}'}
    assert sleeps == [0.2, 7.0, 0.8]  # backoff 0.2 * 2**n, but the server's Retry-After wins


def test_submit_is_retried_after_a_dropped_connection(server: Script, client: Client, sleeps: list[float]) -> None:
    server.play(DROP, Answer(200, RUN))
    run = client.submit("python train.py", idempotency_key="sweep-1")
    assert run.created is False  # 200: the key named an earlier run
    assert [s.headers["Idempotency-Key"] for s in server.seen] == ["sweep-1", "sweep-1"]
    assert sleeps == [0.2]


def test_token_creation_is_not_retried_after_a_dropped_connection(server: Script, client: Client) -> None:
    server.play(DROP, Answer(201, TOKEN))
    with pytest.raises(ConnectionFailed) as caught:
        client.create_token("dana", scopes=["runs:read"])
    assert len(server.seen) == 1  # the first may have made a token: a second would make another
    assert caught.value.status == 0 and caught.value.message.startswith(f"cannot reach {server.url}: ")


def test_token_creation_is_retried_after_429_and_503(server: Script, client: Client, sleeps: list[float]) -> None:
    server.play(Answer(429), Answer(503), Answer(201, TOKEN))
    made = client.create_token("dana", scopes=["runs:read"])
    assert made.token == "rp_secret"
    assert len(server.seen) == 3
    assert json.loads(server.seen[0].body) == {"user": "dana", "groups": [], "scopes": ["runs:read"]}


def test_a_502_to_token_creation_is_not_retried(server: Script, client: Client) -> None:
    server.play(Answer(502, "bad gateway"), Answer(201, TOKEN))
    with pytest.raises(ServerError):
        client.create_token("dana")
    assert len(server.seen) == 1  # a gateway may have passed it on: it may have been made


def test_retries_stop_after_retries(server: Script, sleeps: list[float]) -> None:
    server.play(error(503, "backend_error", "a backing service failed; retry"))
    with Client(server.url, "t", retries=2, sleep=sleeps.append, random=lambda: 1.0) as client:
        with pytest.raises(ServerError) as caught:
            client.get("r-1")
    assert len(server.seen) == 3  # the try and two more
    assert len(sleeps) == 2
    assert (caught.value.status, caught.value.code) == (503, "backend_error")


def test_no_retries_at_all(server: Script, sleeps: list[float]) -> None:
    server.play(Answer(503))
    with Client(server.url, "t", retries=0, sleep=sleeps.append) as client, pytest.raises(ServerError):
        client.get("r-1")
    assert (len(server.seen), sleeps) == (1, [])


def test_backoff_is_full_jitter_exponential_and_capped(server: Script, sleeps: list[float]) -> None:
    server.play(Answer(502))
    with Client(server.url, "t", retries=8, sleep=sleeps.append, random=lambda: 0.5) as client:
        with pytest.raises(ServerError):
            client.pools()
    assert sleeps == [0.1, 0.2, 0.4, 0.8, 1.6, 2.5, 2.5, 2.5]  # 0.5 * min(5, 0.2 * 2**n)


def test_retry_after_is_obeyed_up_to_30_seconds(server: Script, client: Client, sleeps: list[float]) -> None:
    server.play(Answer(429, b"", {"Retry-After": "120"}), Answer(503, b"", {"Retry-After": "0"}), Answer(200, RUN))
    client.get("r-1")
    assert sleeps == [30.0, 0.0]


def test_500_is_retried_for_a_read_only(server: Script, client: Client) -> None:
    server.play(Answer(500), Answer(200, RUN))
    assert client.get("r-1").id == RUN["id"]
    server.play(Answer(500), Answer(202, RUN))
    with pytest.raises(ServerError):
        client.kill("r-1")  # a kill is idempotent, but a 500 may mean a bug that repeats
    assert len(server.seen) == 1


def test_kill_is_retried_after_a_dropped_connection(server: Script, client: Client) -> None:
    server.play(DROP, Answer(202, RUN))
    assert client.kill("r-1").id == RUN["id"]
    assert [s.path for s in server.seen] == ["/v1/runs/r-1/kill"] * 2


def test_a_priority_set_is_retried_after_a_dropped_connection(server: Script, client: Client) -> None:
    """It sets a number rather than adding to one: sending it twice does what sending it once does."""
    server.play(DROP, Answer(200, RUN))
    assert client.set_priority("r-1", 70).id == RUN["id"]
    assert [(s.path, json.loads(s.body)) for s in server.seen] == [("/v1/runs/r-1/priority", {"priority": 70})] * 2


def test_a_keep_is_retried_after_a_dropped_connection(server: Script, client: Client) -> None:
    """It sets the pin rather than toggling it: sending it twice does what sending it once does."""
    server.play(DROP, Answer(200, RUN))
    assert client.keep("r-1", keep=False).id == RUN["id"]
    assert [(s.path, json.loads(s.body)) for s in server.seen] == [("/v1/runs/r-1/keep", {"keep": False})] * 2


def test_a_raw_submit_without_a_key_is_not_retried_after_a_drop(server: Script, client: Client) -> None:
    server.play(DROP, Answer(201, RUN))
    with pytest.raises(ConnectionFailed):
        client.request("POST", "/v1/runs", {"command": "x"})
    assert len(server.seen) == 1


def test_a_closed_port_is_connection_failed_after_retries(sleeps: list[float]) -> None:
    with socket.socket() as held:  # a port that nothing listens on
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", "t", retries=2, sleep=sleeps.append) as client:
        with pytest.raises(ConnectionFailed) as caught:
            client.create_token("dana")  # never sent: trying again is safe even for this one
    assert len(sleeps) == 2
    e = caught.value
    assert (e.status, e.code) == (0, "unreachable")
    assert e.message.startswith(f"cannot reach http://127.0.0.1:{port}: ")
    assert e.message.endswith("(is runplane's API up at this URL?)")  # the URL was given: no stack is guessed at


@pytest.mark.parametrize(
    ("answer", "kind", "code", "message"),
    [
        (Answer(502, "<html><body>Bad Gateway</body></html>"), ServerError, "http_error",
         "HTTP 502: <html><body>Bad Gateway</body></html>"),
        (Answer(404, "x" * 500), NotFound, "http_error", "HTTP 404: " + "x" * 200),
        (Answer(401, b""), Unauthorized, "http_error", "HTTP 401"),
        (Answer(409, {"error": "conflict"}), Conflict, "http_error", 'HTTP 409: {"error": "conflict"}'),
        (Answer(422, b"\xff\xfe not utf-8"), InvalidRequest, "http_error", "HTTP 422: \ufffd\ufffd not utf-8"),
        (Answer(418, {"error": {"code": "teapot", "message": "short and stout"}}), ApiError, "teapot",
         "short and stout"),
        (error(403, "quota_exceeded", "5 runs at once at most"), QuotaExceeded, "quota_exceeded",
         "5 runs at once at most"),
        (error(429, "rate_limited", "slow down"), RateLimited, "rate_limited", "slow down"),
        (error(409, "last_admin", "make another admin token first"), LastAdminToken, "last_admin",
         "make another admin token first"),
        (error(409, "conflict", "run r-1 has ended"), Conflict, "conflict", "run r-1 has ended"),
        (error(404, "not_found", "run 'r-1' not found"), NotFound, "not_found", "run 'r-1' not found"),
    ],
)  # fmt: skip
def test_errors_map_by_status_and_body(
    server: Script, sleeps: list[float], answer: Answer, kind: type[ApiError], code: str, message: str
) -> None:
    server.play(answer)
    with Client(server.url, "t", retries=0, sleep=sleeps.append) as client, pytest.raises(ApiError) as caught:
        client.get("r-1")
    e = caught.value
    assert type(e) is kind
    assert (e.status, e.code, e.message, str(e)) == (answer.status, code, message, message)


def test_a_success_that_is_not_json_is_an_api_error(server: Script, client: Client) -> None:
    server.play(Answer(200, "<html>captive portal</html>"))
    with pytest.raises(ApiError) as caught:
        client.request("GET", "/v1/me")
    assert (caught.value.code, caught.value.message) == (
        "invalid_response",
        "HTTP 200: not JSON: <html>captive portal</html>",
    )


def test_query_values_that_are_none_are_dropped(server: Script, client: Client) -> None:
    server.play(Answer(200, {"runs": [], "next_cursor": None}))
    client.request("GET", "/v1/runs", query={"state": None, "queue": "gpu", "limit": 5})
    assert server.seen[0].path == "/v1/runs?queue=gpu&limit=5"
    assert server.seen[0].headers["Authorization"] == "Bearer t0k"


def test_a_run_id_cannot_walk_to_another_route(server: Script, client: Client) -> None:
    server.play(Answer(200, RUN))
    client.get("r-1/../../tokens")
    assert server.seen[0].path == "/v1/runs/r-1%2F..%2F..%2Ftokens"


def test_the_async_client_retries_the_same_way(server: Script) -> None:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async def main() -> tuple[Any, Any]:
        async with AsyncClient(server.url, "t", sleep=sleep, random=lambda: 1.0) as client:
            server.play(Answer(503), DROP, Answer(201, RUN))
            run = await client.submit("python train.py")
            keys = {s.headers["Idempotency-Key"] for s in server.seen}
            server.play(DROP, Answer(201, TOKEN))
            with pytest.raises(ConnectionFailed):
                await client.create_token("dana")
            return run, keys

    run, keys = asyncio.run(main())
    assert run.created and len(keys) == 1
    assert sleeps == [0.2, 0.4]
    assert len(server.seen) == 1  # the token's POST: once


def outputs(server: Script, *paths: str) -> Answer:
    """An output listing of ``paths``, each downloadable from ``server`` (4 bytes)."""
    files = [{"path": p, "size": 4, "url": f"{server.url}/bucket/{i}"} for i, p in enumerate(paths)]
    return Answer(200, {"files": files, "next_cursor": None, "complete": True})


@pytest.mark.parametrize("hostile", ["../../x", "a/../../x", "/tmp/x", "link/x", "."])
def test_a_download_never_writes_outside_its_directory(server: Script, client: Client, tmp_path: Path, hostile: str):
    """An output path that leaves DEST (climbing out, absolute, through a symlink DEST holds, or
    DEST itself) refuses the whole download before any file is written, the good ones too."""
    dest, away = tmp_path / "dest", tmp_path / "away"
    dest.mkdir()
    away.mkdir()
    (dest / "link").symlink_to(away)
    hostile = hostile.replace("/tmp", str(away)) if hostile.startswith("/") else hostile
    server.play(Answer(200, RUN), outputs(server, "fine.txt", hostile), Answer(200, b"data"))
    run = client.get(RUN["id"])
    with pytest.raises(DownloadFailed) as refused:
        run.download(dest)
    assert refused.value.code == "unsafe_path"
    assert f"refusing output path {hostile!r}: it leaves {dest}" in refused.value.message
    assert [s.path.split("?")[0] for s in server.seen] == [f"/v1/runs/{RUN['id']}", f"/v1/runs/{RUN['id']}/outputs"]
    assert sorted(p.name for p in dest.iterdir()) == ["link"] and list(away.iterdir()) == []
    # the same listing without the hostile path downloads
    server.play(outputs(server, "fine.txt", "deep/er.txt"), Answer(200, b"data"))
    assert run.download(dest) == [dest / "fine.txt", dest / "deep" / "er.txt"]
    assert (dest / "deep" / "er.txt").read_bytes() == b"data"


def test_the_async_client_refuses_the_same_paths(server: Script, tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncClient(server.url, "t") as client:
            server.play(Answer(200, RUN), outputs(server, "fine.txt", "../x"), Answer(200, b"data"))
            run = await client.get(RUN["id"])
            with pytest.raises(DownloadFailed, match=r"refusing output path '\.\./x'"):
                await run.download(tmp_path / "dest")
            server.play(outputs(server, "fine.txt"), Answer(200, b"data"))
            assert await run.download(tmp_path / "dest") == [tmp_path / "dest" / "fine.txt"]

    asyncio.run(main())
    assert not (tmp_path / "x").exists()
    assert (tmp_path / "dest" / "fine.txt").read_bytes() == b"data"


def test_pools_reads_the_answer_of_a_server_that_has_no_caps_on_waiting_runs_or_sweeps(
    server: Script, client: Client
) -> None:
    from runplane.api.views import pool_view
    from runplane.domain.pools import Pool
    from runplane.domain.retention import Retention
    from runplane.domain.workers import PoolRecord

    pool = Pool(name="gpu", cpus=8, memory="32g", default_image="img", max_waiting_runs=5)
    shown = pool_view(pool, 0, {}, PoolRecord(pool="gpu"), Retention()).model_dump(mode="json")
    assert shown["max_waiting_runs"] == 5
    previous = {k: v for k, v in shown.items() if k not in ("max_waiting_runs", "max_open_sweeps")}
    server.play(Answer(200, {"pools": [previous]}))
    [got] = client.pools()
    assert (got.name, got.max_waiting_runs, got.max_open_sweeps) == ("gpu", None, None)
