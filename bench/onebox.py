"""The stack `runplane dev` starts, on one machine, against the bare operations underneath it.

Three modes, each on the embedded stack exactly as ``runplane dev`` starts it (``--cloud local``,
the default: SQLite and the file system; ``--cloud aws`` or ``--cloud azure`` re-run the same
measure on the cloud emulators), with a pools file of the benchmark's own and the agents started
with ``--network-mode host`` (this machine's Docker has no default bridge; a trivial run has no
network either way):

* ``warm``: one trivial run at a time (``--secret``: each naming a secret) on one warm worker of
  one slot, from ``POST /v1/runs`` until the client's ``Run.wait`` sees it final, against
  ``docker run --rm --network none IMAGE sh -c true`` (the same image, the same command the agent
  starts), interleaved; plus where the run's time goes, from its events and the agent's
  ``usage.timings``, and for reference the agent's own container made by hand
  (``_common.bare_container``: its isolation, no stack).
* ``batch``: ``--runs`` trivial runs submitted at once on ``--workers`` warm workers of ``--slots``
  slots, until every one is final, against as many ``docker run --rm --network none`` from a
  thread pool of ``workers x slots`` (``throughput.py``'s paths, on this stack).
* ``submit``: ``--clients`` threads submitting ``--runs`` runs at once to a pool with no workers
  (they stay queued), against the bare inserts a submit performs, as many from as many threads: on
  the local cloud an INSERT of a stored run's JSON into a SQLite database in WAL mode (its own
  file, the stack's pragmas, one transaction each), on the aws cloud a ``PutItem`` of the stored
  item (new id, ``attribute_not_exists(id)``) to the same DynamoDB.

Each prints medians, the machine's load average before and after, and one RATIO line.

    python bench/onebox.py warm   [--n 20] [--secret] [--cloud local|aws|azure]
    python bench/onebox.py batch  [--runs 200] [--workers 4] [--slots 1] [--clients 8] [--rounds 2]
    python bench/onebox.py submit [--clients 16] [--runs 800] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import queue
import sqlite3
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
from _common import bare_container, dev_stack, median, p90, ratio_line, table
from submit_throughput import burst
from throughput import Throughput, wait_workers

from runplane import bootstrap
from runplane.adapters.local.queues import DDL as queues_ddl
from runplane.adapters.local.queues import EVENTS_QUEUE, pool_queue
from runplane.adapters.local.quotas import DDL as quotas_ddl
from runplane.adapters.local.runs import DDL as runs_ddl
from runplane.adapters.local.runs import SqliteRunStore
from runplane.adapters.records import jsonable, written_json
from runplane.domain.messages import DispatchEvent, RunMessage

IMAGE = "runplane/test-busybox:1"
AGENT_ARGS = "--network-mode host"
CLOUDS = ("local", "aws", "azure")
TARGETS = {"warm": 1.1, "batch": 1.2, "submit": 1.2}
POLL_SECONDS = 0.02
"""``Run.wait``'s pause between reads of a stack that cannot wait for a change (one that can
answers as soon as the run changes)."""
BARE = ["docker", "run", "--rm", "--network", "none", IMAGE, "sh", "-c", "true"]
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")  # no metric line per submit in the output


def pools_yaml(workers: int, slots: int) -> str:
    """One pool of ``workers`` warm local workers (none: runs stay queued) of ``slots`` slots."""
    return (
        f"pools: [{{name: default, backend: local, cpus: {max(slots, 1)}, memory: {4 * max(slots, 1)}g, "
        f"slots: {max(slots, 1)}, min_workers: {workers}, max_workers: {workers}, idle_seconds: 3600, "
        f"default_image: '{IMAGE}'}}]\n"
    )


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


@contextlib.contextmanager
def stack_for(cloud: str, workers: int, slots: int, **config: Any) -> Iterator[Any]:
    print(f"cloud {cloud}; {load()}")
    with dev_stack(pools_yaml(workers, slots), AGENT_ARGS, wait_agents=True, cloud=cloud, **config) as stack:
        if workers:
            wait_workers(stack.api_url, workers)
        yield stack
    print(f"done; {load()}")


def bare_run() -> float:
    t = time.perf_counter()
    subprocess.run(BARE, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


# -- warm: one trivial run at a time ---------------------------------------------------------

MARKS = (  # (label, from mark, to mark), the marks of one run in the order they happen
    ("POST -> run recorded (its queued event)", "posted", "queued"),
    ("recorded -> hint received by the agent", "queued", "hint"),
    ("hint received -> claimed (usage.timings.claim)", "hint", "claimed"),
    ("claimed -> container create called (image check, run dir)", "claimed", "create"),
    ("container create (usage.timings.create)", "create", "created"),
    ("container start (usage.timings.start)", "created", "started"),
    ("started -> exit handled (usage.timings.run)", "started", "exited"),
    ("exit handled -> end recorded (outputs, final write)", "exited", "ended"),
    ("end recorded -> client saw it", "ended", "seen"),
)
ANSWERED = "(POST -> submit answered, overlaps the steps after it)"


def marks_of(run: Any, posted: float, seen: float) -> dict[str, float]:
    """The wall-clock moments of one finished run: the client's own, its events', and the agent's
    timings counted from the events they follow (every process here shares the host's clock)."""
    at = {str(e.state): e.at for e in reversed(run.events) if e.state}
    timings = run.usage.timings if run.usage else {}
    started = at["running"]
    return {
        "posted": posted,
        "queued": at["queued"],
        "hint": at["preparing"] - timings.get("claim", 0.0),
        "claimed": at["preparing"],
        "create": started - timings.get("start", 0.0) - timings.get("create", 0.0),
        "created": started - timings.get("start", 0.0),
        "started": started,
        "exited": started + timings.get("run", 0.0),
        "ended": at[str(run.state)],
        "seen": seen,
    }


def warm(args: argparse.Namespace) -> str:
    from runplane.client import Client

    with stack_for(args.cloud, 1, 1) as stack, tempfile.TemporaryDirectory(prefix="runplane-bench-") as scratch:
        client, store, engine = Client(stack.api_url, "bench"), bootstrap.stack().store, docker.from_env()
        template: list[Any] = []
        extra: dict[str, Any] = {}
        if args.secret:  # the run names a secret: the agent reads and opens it after the claim, and masks it
            client.set_secret("bench-token", "a value of forty characters, or near it")
            extra["secrets"] = {"TOKEN": "bench-token"}

        def e2e(steps: dict[str, list[float]] | None = None) -> float:
            posted, t = time.time(), time.perf_counter()
            run = client.submit("true", name="bench-warm", **extra)
            answered = time.time()
            run.wait(timeout=60, poll=POLL_SECONDS)
            elapsed, seen = time.perf_counter() - t, time.time()
            if run.state != "succeeded":
                raise RuntimeError(f"run {run.id} ended {run.state}")
            if steps is not None:
                marks = marks_of(store.get(run.id), posted, seen)
                for label, start, end in MARKS:
                    steps.setdefault(label, []).append(marks[end] - marks[start])
                steps.setdefault(ANSWERED, []).append(answered - posted)
            template[:] = template or [store.get(run.id)]
            return elapsed

        def sdk() -> float:
            """The agent's own container for the same run, made by hand: its isolation, no stack."""
            labels = {"io.runplane-bench": "1"}  # not a run's labels: an agent sweeps those it does not know
            name = f"runplane-bench-{uuid.uuid4().hex[:12]}"
            code, (t, *_, end) = bare_container(engine, template[0], IMAGE, Path(scratch), name=name, labels=labels)
            assert code == 0, code
            return end - t

        for _ in range(2):
            e2e()
            bare_run()
            sdk()
        samples: dict[str, list[float]] = {"e2e": [], "bare": [], "sdk": []}
        steps: dict[str, list[float]] = {}
        order: list[tuple[str, Callable[[], float]]] = [("e2e", lambda: e2e(steps)), ("bare", bare_run), ("sdk", sdk)]
        for i in range(args.n):
            for label, path in order[i % 3 :] + order[: i % 3]:
                samples[label].append(path())
    table(
        f"a trivial run ({IMAGE}, sh -c true){' naming a secret' if args.secret else ''}, one at a time, "
        f"one warm worker x 1 slot ({args.cloud})",
        [
            ("runplane: POST /v1/runs -> Run.wait sees it final", samples["e2e"]),
            ("docker run --rm --network none", samples["bare"]),
            ("for reference: the agent's container by hand (docker SDK)", samples["sdk"]),
        ],
    )
    table("where a warm run's time goes (median of each step)", list(steps.items()))
    total = sum(median(v) for k, v in steps.items() if k != ANSWERED)
    print(f"\n  sum of the step medians {total * 1000:.0f} ms; runplane median {median(samples['e2e']) * 1000:.0f} ms")
    ratio = median(samples["e2e"]) / median(samples["bare"])
    return ratio_line(f"onebox_warm_{args.cloud} (runplane / docker run)", ratio, TARGETS["warm"])


# -- batch: many trivial runs on a few warm workers ----------------------------------------


def batch(args: argparse.Namespace) -> str:
    parallel = args.workers * args.slots
    samples: dict[str, list[float]] = {"runplane": [], "bare": []}
    with stack_for(args.cloud, args.workers, args.slots) as stack:
        bench = Throughput(stack.api_url, args.runs, parallel, args.clients)
        Throughput(stack.api_url, parallel * 2, parallel, args.clients).runplane(record=False)  # warm
        paths: list[tuple[str, Callable[[], float]]] = [("runplane", bench.runplane), ("bare", bench.bare_cli)]
        for i in range(args.rounds):
            for label, path in paths if i % 2 == 0 else paths[::-1]:
                samples[label].append(path())
                print(f"  round {i + 1}: {label} {samples[label][-1]:.1f}s ({load()})", flush=True)
    n, r, b = args.runs, median(samples["runplane"]), median(samples["bare"])
    print(f"\n{n} trivial runs on {args.workers} warm workers x {args.slots} slot(s) ({args.cloud})")
    for label, seconds in (
        (f"runplane: {args.clients} clients submit, until all final", r),
        (f"docker run --rm --network none, {parallel} at a time", b),
    ):
        print(f"  {label:<52} {seconds:8.2f} s  {n / seconds:6.1f} runs/s")
    print(
        f"  submit phase {median(bench.submit_times):.2f} s; each run submitted -> claimed: median "
        f"{median(bench.waits):.2f} s, p90 {p90(bench.waits):.2f} s"
    )
    print(
        f"  CPU-seconds a run: agents {median(bench.agent_cpu):.3f}, this process (API, dispatcher) "
        f"{median(bench.stack_cpu):.3f}, moto {median(bench.moto_cpu):.3f}, dockerd + containerd "
        f"{median(bench.engine_cpu):.3f}"
    )
    name = f"onebox_batch_{n}_{args.workers}x{args.slots}_{args.cloud} (runplane / docker run)"
    return ratio_line(name, r / b, TARGETS["batch"])


# -- submit: many clients at once ----------------------------------------------------------


def sqlite_inserts(path: Path, row: str) -> Callable[[dict[str, object]], None]:
    """An INSERT of ``row`` under a new id into a database of its own at ``path``, as the local
    stores write: WAL, ``synchronous=NORMAL``, one ``BEGIN IMMEDIATE`` transaction each."""
    ddl = sqlite3.connect(path, isolation_level=None)
    ddl.execute("PRAGMA journal_mode=WAL")
    ddl.execute("CREATE TABLE IF NOT EXISTS runs (id TEXT PRIMARY KEY, data TEXT NOT NULL)")
    ddl.close()

    def insert(state: dict[str, object]) -> None:
        c = _bare_connection(state, path)
        c.execute("BEGIN IMMEDIATE")
        c.execute("INSERT INTO runs (id, data) VALUES (?, ?)", ("r-" + uuid.uuid4().hex[:24], row))
        c.execute("COMMIT")

    return insert


def _bare_connection(state: dict[str, object], path: Path) -> sqlite3.Connection:
    """A client thread's own connection to ``path``, with the local stores' pragmas."""
    c = state.get("db")
    if c is None:
        c = state["db"] = sqlite3.connect(path, timeout=30, isolation_level=None)
        c.execute("PRAGMA synchronous=NORMAL")
        c.execute("PRAGMA busy_timeout=30000")
    assert isinstance(c, sqlite3.Connection)
    return c


SUBMIT_WRITES = 4
"""The write transactions of one submit of a run that waits for nothing on the local stores
(``services.runs.submit_run``): the user's lane (``fair_tag``), the run, its pool's hint, the event."""


def submit_writes(path: Path, run_id: str) -> Callable[[dict[str, object]], None]:
    """The writes one submit of ``run_id`` performed, bare: in a database of its own at ``path``
    with the local stores' own tables and indexes, the same rows (their columns and JSON: the
    stored run under a new id, the user's lane, the hint, the event), each write a ``BEGIN
    IMMEDIATE`` transaction with the read a conditional write makes in it, as the stores do; no
    models, no JSON made, no front."""
    stack = bootstrap.stack()
    run = stack.store.get(run_id)
    lane = stack.quotas.lane(run.queue, run.owner, run.spec.priority)
    lane_key, lane_data = f"{lane.pool}#{lane.priority}#{lane.user}", written_json(lane)
    row = SqliteRunStore._row(run)[1:]
    hint = (pool_queue(run.queue), written_json(RunMessage(run_id=run.id, attempt=run.attempt)))
    event = (EVENTS_QUEUE, written_json(DispatchEvent(pool=run.queue)))
    ddl = sqlite3.connect(path, isolation_level=None)
    ddl.execute("PRAGMA journal_mode=WAL")
    for statement in ";".join((runs_ddl, queues_ddl, quotas_ddl)).split(";"):
        if statement.strip():
            ddl.execute(statement)
    ddl.close()

    def write(state: dict[str, object]) -> None:
        c = _bare_connection(state, path)
        c.execute("BEGIN IMMEDIATE")  # the lane: read its version, write the next
        found = c.execute("SELECT version FROM quotas WHERE kind = 'lane' AND key = ?", (lane_key,)).fetchone()
        version = found[0] + 1 if found else 1
        c.execute(
            "INSERT OR REPLACE INTO quotas (kind, key, version, data) VALUES ('lane', ?, ?, ?)",
            (lane_key, version, lane_data),
        )
        c.execute("COMMIT")
        new_id = "r-" + uuid.uuid4().hex[:24]
        c.execute("BEGIN IMMEDIATE")  # the run: none of its id yet, then the row
        c.execute("SELECT data FROM runs WHERE id = ?", (new_id,)).fetchone()
        c.execute(
            "INSERT INTO runs (id, owner, queue, state, listed, created_at, rank, data) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (new_id, *row),
        )
        c.execute("COMMIT")
        for queue_name, body in (hint, event):
            now = time.time()
            c.execute("BEGIN IMMEDIATE")
            c.execute(
                "INSERT INTO queue_messages (queue, visible_at, body, sent_at) VALUES (?, ?, ?, ?)",
                (queue_name, now, body, now),
            )
            c.execute("COMMIT")

    return write


def dynamodb_puts(endpoint: str, run_id: str) -> Callable[[dict[str, object]], None]:
    """A ``PutItem`` of the stored item of ``run_id`` under a new id, as a submit writes it."""
    import boto3

    settings = bootstrap.stack().settings
    table_name = bootstrap.aws_names(settings).runs_table
    url = settings.dynamodb_endpoint_url or endpoint
    item = boto3.client("dynamodb", endpoint_url=url).get_item(TableName=table_name, Key={"id": {"S": run_id}})["Item"]

    def put(state: dict[str, object]) -> None:
        ddb = state.get("ddb")
        if ddb is None:  # a session per thread: boto3's sessions are not thread-safe
            ddb = state["ddb"] = boto3.session.Session().client("dynamodb", endpoint_url=url)
        new = dict(item, id={"S": "r-" + uuid.uuid4().hex[:24]})
        ddb.put_item(TableName=table_name, Item=new, ConditionExpression="attribute_not_exists(id)")  # type: ignore[attr-defined]

    return put


def submit(args: argparse.Namespace) -> str:
    if args.cloud == "azure":
        raise SystemExit("submit: the bare baseline is written for the local and aws clouds")
    body = json.dumps({"command": "true", "name": "bench-submit"}).encode()
    headers = {"Content-Type": "application/json", "Authorization": "Bearer bench"}
    samples: dict[str, list[float]] = {"api": [], "bare": [], "writes": [], "me": []}
    with stack_for(args.cloud, 0, 1, schedule_seconds=3600) as stack:
        host, port = stack.api_url.removeprefix("http://").split(":")

        idle: queue.SimpleQueue[http.client.HTTPConnection] = queue.SimpleQueue()

        def ask(state: dict[str, object], method: str, path: str, expect: int) -> bytes:
            """One call on a keep-alive connection: a client's own for the whole burst, taken from
            those of the rounds before (so connects are not timed) and given back after each call."""
            try:
                conn = idle.get_nowait()
            except queue.Empty:
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
            conn.request(method, path, body=body if method == "POST" else None, headers=headers)
            resp = conn.getresponse()
            answer = resp.read()
            idle.put(conn)
            if resp.status != expect:
                raise RuntimeError(f"{method} {path} answered {resp.status}: {answer[:200]!r}")
            return answer

        def api(state: dict[str, object]) -> None:
            state["last"] = json.loads(ask(state, "POST", "/v1/runs", 201))["id"]

        def me(state: dict[str, object]) -> None:
            ask(state, "GET", "/v1/me", 200)

        first: dict[str, object] = {}
        api(first)
        paths = [("api", api), ("me", me)]
        if args.cloud == "local":
            row = json.dumps(jsonable(bootstrap.stack().store.get(str(first["last"]))))
            paths.append(("bare", sqlite_inserts(stack.config.state_dir.parent / "bare.db", row)))
            paths.append(("writes", submit_writes(stack.config.state_dir.parent / "writes.db", str(first["last"]))))
        else:
            paths.append(("bare", dynamodb_puts(stack.endpoint, str(first["last"]))))
        for _, call in paths:  # warm: connections, the handler's first calls
            burst(args.clients, args.clients * 2, call)
        for i in range(args.rounds):
            for label, call in paths[i % len(paths) :] + paths[: i % len(paths)]:
                samples[label].append(burst(args.clients, args.runs, call))
                print(f"  round {i + 1}: {label} {samples[label][-1]:.2f}s", flush=True)
    a, b = median(samples["api"]), median(samples["bare"])
    what = "one INSERT into SQLite (WAL)" if args.cloud == "local" else "PutItem to the same DynamoDB"
    print(f"\n{args.runs} submits from {args.clients} clients at once, onto a pool with no workers ({args.cloud})")
    rows = [("POST /v1/runs (keep-alive)", a, "submits/s")]
    if samples["writes"]:
        rows.append(
            (f"bare: the {SUBMIT_WRITES} writes a submit performs, a txn each", median(samples["writes"]), "submits/s")
        )
    rows.append((f"bare: {what}", b, "submits/s"))
    rows.append(("for reference: GET /v1/me (front, handler, token read)", median(samples["me"]), "calls/s"))
    for label, seconds, unit in rows:
        print(f"  {label:<56} {seconds:7.2f} s  {args.runs / seconds:8.1f} {unit}")
    if not samples["writes"]:
        return ratio_line(
            f"onebox_submit_{args.cloud} ({args.clients} clients, API / bare inserts)", a / b, TARGETS["submit"]
        )
    print(f"  ratio to one INSERT: {a / b:.2f}x")
    name = f"onebox_submit_{args.cloud} ({args.clients} clients, API / the bare writes it performs)"
    return ratio_line(name, a / median(samples["writes"]), TARGETS["submit"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cloud", choices=CLOUDS, default="local", help="whose stores (default local: runplane dev's)")
    modes = parser.add_subparsers(dest="mode", required=True)
    one = modes.add_parser("warm", parents=[common], help="a warm trivial run vs docker run")
    one.add_argument("--n", type=int, default=20, help="measured rounds of each (default 20)")
    one.add_argument("--secret", action="store_true", help="each run names a secret (docs/secrets.md)")
    many = modes.add_parser("batch", parents=[common], help="many trivial runs vs as many docker runs at once")
    many.add_argument("--runs", type=int, default=200, help="runs a round (default 200)")
    many.add_argument("--workers", type=int, default=4, help="warm workers (default 4)")
    many.add_argument("--slots", type=int, default=1, help="slots a worker (default 1)")
    many.add_argument("--clients", type=int, default=8, help="threads submitting (default 8)")
    many.add_argument("--rounds", type=int, default=2, help="measured rounds of each (default 2)")
    subs = modes.add_parser("submit", parents=[common], help="many clients submitting at once vs the bare inserts")
    subs.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    subs.add_argument("--runs", type=int, default=800, help="submits a round (default 800)")
    subs.add_argument("--rounds", type=int, default=2, help="measured rounds of each (default 2)")
    args = parser.parse_args()
    measure: dict[str, Callable[[argparse.Namespace], str]] = {"warm": warm, "batch": batch, "submit": submit}
    print(measure[args.mode](args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
