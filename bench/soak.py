"""A soak: many runs of mixed length on a few agents while agents, the dispatcher and the reaper are
killed with SIGKILL at random and come back.

The embedded local stack serves the API (its default: SQLite and files, as `runplane dev` starts it); the dispatcher
and the reaper run as processes of their own (``runplane.devstack.functions_process``), and
``--agents`` worker agents as processes this script starts (short leases: 3 s, heartbeats every
second). ``--runs`` runs are submitted through the API, each ``sleep D; echo TOKEN > out.txt``
with D one of 0, 0.2, 1 and 3 s and a token of its own. Meanwhile a chaos thread kills one of
those processes (chosen at random) every 1 to ``--kill-every`` seconds with SIGKILL and starts it
again after up to a second (an agent under the same id and work directory, as a service manager
would). With ``--force-agent-kill`` its first kill is of an agent while it runs one of the 3 s
runs, so that at least one run loses an attempt whatever the seed. Once every run was submitted
and half of them ended the chaos stops, and the script waits for every run to end. Then it checks:

* every run is in a terminal state, with exactly one terminal event (none lost), and that state
  is ``succeeded``, or ``failed`` with ``worker_lost`` when worker deaths used up its attempts;
* no attempt of a run was started twice: the Docker engine's start events, by the run and
  attempt labels of each container, counted over the whole soak (none doubled), and every
  attempt that ran (a ``running`` event) has its start among them (the events were all read).
  Attempts of one run may overlap: a killed agent's container runs on until its agent comes
  back and stops it, while the run's next attempt, on another worker, already started;
* every succeeded run's ``out.txt`` in object storage is its own token (none missing);
* every message in the pool queue's dead-letter queue names a run that ended;
* every run that went back to its queue did so because its worker died (its lease lapsed, or the
  worker came back), and, with ``--force-agent-kill``, at least one run lost an attempt so and
  went back to its queue for another.

It prints the seed (a fresh one unless ``--seed`` is given: the same seed replays the same runs
and kills), the counts by state and failure reason, the kills, the runs retried after a lost
attempt, and the checks, and exits 1 if a check failed.

    python bench/soak.py [--runs 1000] [--agents 4] [--kill-every 6] [--seed N] [--force-agent-kill]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import dev_stack

IMAGE = "runplane/test-busybox:1"
POOL = "soak"
POOLS_YAML = (
    f"pools: [{{name: {POOL}, backend: local, cpus: 1, memory: 1g, max_workers: 0, default_image: '{IMAGE}'}}]\n"
)
AGENT_FLAGS = [
    "--lease-seconds", "3", "--heartbeat-seconds", "1", "--poll-seconds", "1", "--kill-poll-seconds", "0.5",
    "--pull", "never", "--network-mode", "host", "--upload-deadline-seconds", "30",
]  # fmt: skip
DURATIONS = (0, 0.2, 1, 3)
# why a run went back to its queue when its worker died: its lease lapsed, or the worker came back
LOSS = re.compile(r"re-queued: (worker soak-\d+ stopped renewing its lease|its worker restarted)")


@dataclass
class Report:
    runs: int
    seed: int = 0
    force_agent_kill: bool = False
    seconds: float = 0.0
    states: collections.Counter[str] = field(default_factory=collections.Counter)
    kills: collections.Counter[str] = field(default_factory=collections.Counter)
    attempts: collections.Counter[int] = field(default_factory=collections.Counter)
    lost: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    stray_dead_letters: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    unseen: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    """Runs that lost an attempt to a worker's death and went back to their queue for another."""
    requeued_otherwise: list[str] = field(default_factory=list)
    forced: str = ""
    """The forced first kill: whose, during which run."""
    dead_letters: int = 0
    tokens: dict[str, str] = field(default_factory=dict)
    """Each run's token, by run id."""

    @property
    def ok(self) -> bool:
        checks = (self.lost, self.doubled, self.missing, self.stray_dead_letters, self.unexpected, self.unseen)
        retried = bool(self.retried) or not self.force_agent_kill
        return not any(checks) and not self.requeued_otherwise and retried

    def lines(self) -> list[str]:
        return [
            f"seed {self.seed} (the same runs and kills again: --seed {self.seed})",
            f"{self.runs} runs in {self.seconds:.0f}s; kills: "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.kills.items()))
            + (f"; first: {self.forced}" if self.forced else ""),
            "ended: " + ", ".join(f"{k} {v}" for k, v in sorted(self.states.items())),
            "attempts used: " + ", ".join(f"{k}: {v} runs" for k, v in sorted(self.attempts.items())),
            f"lost (not ended, or not exactly one terminal event): {len(self.lost)} {self.lost[:5]}",
            f"doubled (an attempt started twice): {len(self.doubled)} {self.doubled[:5]}",
            f"missing outputs (succeeded, out.txt absent or wrong): {len(self.missing)} {self.missing[:5]}",
            f"dead letters: {self.dead_letters}, of runs not ended: {len(self.stray_dead_letters)} "
            f"{self.stray_dead_letters[:5]}",
            f"ended otherwise than succeeded or out of attempts to worker deaths: {len(self.unexpected)} "
            f"{self.unexpected[:5]}",
            f"started more often than the engine said (its events not all read): {len(self.unseen)} {self.unseen[:5]}",
            f"retried after an attempt lost to a worker's death: {len(self.retried)} {self.retried[:5]}"
            + (" (a kill was forced: at least 1 expected)" if self.force_agent_kill else ""),
            f"re-queued for another reason than a worker's death: {len(self.requeued_otherwise)} "
            f"{self.requeued_otherwise[:5]}",
        ]


class Process:
    """One of the soak's processes: started, killed with SIGKILL, started again."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.argv, self.log, self.env = name, argv, log, env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def soak(
    runs: int = 1000,
    agents: int = 4,
    kill_every: float = 6.0,
    seed: int | None = None,
    timeout: float | None = None,
    say: Callable[[str], None] = print,
    force_agent_kill: bool = False,
) -> Report:
    """Run the soak on a local stack of its own; the report says what the checks found. ``seed``:
    the runs' lengths and the kills (None: a fresh one, which the report names)."""
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    say(f"seed {seed}")
    rng = random.Random(seed)
    report = Report(runs, seed, force_agent_kill)
    work = Path(tempfile.mkdtemp(prefix="runplane-soak-"))
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    # hints a killed agent held come back sooner
    with dev_stack(POOLS_YAML, functions=False, token="soak", settings={"rehint_seconds": 10}) as stack:
        env = {**os.environ, **stack.environment}  # the stack's own processes are started here
        python = sys.executable
        procs = [
            Process("dispatcher", [python, "-m", "runplane.devstack.functions_process", "dispatcher",
                                   "--schedule-seconds", "2"], work / "dispatcher.log", env),
            Process("reaper", [python, "-m", "runplane.devstack.functions_process", "reaper",
                               "--schedule-seconds", "1"], work / "reaper.log", env),
        ]  # fmt: skip
        for i in range(agents):
            argv = [python, "-m", "worker_agent", "--pool", POOL, "--id", f"soak-{i}"]
            procs.append(Process(f"agent-{i}", [*argv, "--work-dir", str(work / "agents"), *AGENT_FLAGS],
                                 work / f"agent-{i}.log", env))  # fmt: skip
        for p in procs:
            p.start()
        starts = _watch_starts(stack)
        try:
            report = _drive(stack.api_url, procs, rng, runs, kill_every, timeout or 120 + runs * 3, report, say)
        finally:
            for p in procs:
                p.stop()
            starts.stop()
            _clean_up(work, agents)
        _check(report, starts.counts, say)
    return report


def _drive(
    api_url: str,
    procs: list[Process],
    rng: random.Random,
    runs: int,
    kill_every: float,
    timeout: float,
    report: Report,
    say: Callable[[str], None],
) -> Report:
    from runplane import bootstrap
    from runplane.client import Client
    from runplane.domain.states import RunState

    store = bootstrap.stack().store
    client = threading.local()
    specs = [(i, rng.choice(DURATIONS), f"soak-{i}-{rng.getrandbits(32):08x}") for i in range(runs)]
    stop_chaos = threading.Event()
    chaos_rng = random.Random(rng.getrandbits(64))  # its own: the submit threads never draw from it
    long_runs: list[str] = []  # the 3 s runs, once submitted
    agents = {f"soak-{p.name.removeprefix('agent-')}": p for p in procs if p.name.startswith("agent-")}

    def running_long() -> tuple[Process, str] | None:
        """An agent and the 3 s run it runs now, if any: killing it costs that run an attempt."""
        for run_id in list(long_runs):
            run = store.get(run_id)
            if run.state == RunState.RUNNING and run.worker_id in agents:
                return agents[run.worker_id], run_id
        return None

    first = running_long if report.force_agent_kill else None
    chaos = threading.Thread(target=_chaos, args=(procs, chaos_rng, kill_every, stop_chaos, report, first), daemon=True)
    t0 = time.monotonic()
    chaos.start()

    def submit(spec: tuple[int, float, str]) -> tuple[str, str]:
        if not hasattr(client, "c"):
            client.c = Client(api_url, "soak", retries=5)
        i, duration, token = spec
        body = {"command": f"sleep {duration}; echo {token} > out.txt", "queue": POOL, "name": f"soak-{i}"}
        return client.c.request("POST", "/v1/runs", body)["id"], token

    try:
        with ThreadPoolExecutor(8) as pool:
            submitted = list(pool.map(submit, specs))
        tokens = dict(submitted)
        long_runs += [run_id for (run_id, _), (_, duration, _) in zip(submitted, specs, strict=True) if duration == 3]
        say(f"submitted {runs} runs in {time.monotonic() - t0:.0f}s")
        left = list(tokens)
        last_say = time.monotonic()
        while left and time.monotonic() - t0 < timeout:
            time.sleep(0.5)
            left = [run_id for run_id in left if not store.get(run_id).state.terminal]
            if len(left) <= runs // 2 and not stop_chaos.is_set():
                stop_chaos.set()
                say(f"half ended after {time.monotonic() - t0:.0f}s: chaos stops ({sum(report.kills.values())} kills)")
            if time.monotonic() - last_say > 15:
                last_say = time.monotonic()
                say(f"  {runs - len(left)} of {runs} ended after {time.monotonic() - t0:.0f}s")
    finally:  # on an error too: no process is killed, or started again, after this
        stop_chaos.set()
        chaos.join()
    report.seconds = time.monotonic() - t0
    report.tokens = tokens
    return report


def _chaos(
    procs: list[Process],
    rng: random.Random,
    kill_every: float,
    stop: threading.Event,
    report: Report,
    first: Callable[[], tuple[Process, str] | None] | None = None,
) -> None:
    if first is not None:  # the first kill: an agent while it runs a 3 s run
        found = None
        while found is None and not stop.wait(0.2):
            found = first()
        if found is None:
            return
        victim, run_id = found
        victim.kill()
        report.kills[victim.name.split("-")[0]] += 1
        report.forced = f"{victim.name} while it ran {run_id}"
        stop.wait(rng.uniform(0.0, 1.0))
        victim.start()
    while not stop.wait(rng.uniform(1.0, kill_every)):
        victim = rng.choice(procs)
        victim.kill()
        report.kills[victim.name.split("-")[0]] += 1
        stop.wait(rng.uniform(0.0, 1.0))
        victim.start()


class _Starts:
    """The Docker engine's container start events of this stack's runs, counted by (run, attempt)."""

    def __init__(self, stack_id: str) -> None:
        import docker

        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.client = docker.from_env()
        self.events = self.client.events(
            decode=True, filters={"type": "container", "event": "start", "label": f"io.runplane.stack={stack_id}"}
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for event in self.events:
                labels = event.get("Actor", {}).get("Attributes", {})
                if "io.runplane.run_id" in labels:
                    self.counts[(labels["io.runplane.run_id"], labels.get("io.runplane.attempt", "?"))] += 1
        except Exception:  # closed at the end
            return

    def stop(self) -> None:
        time.sleep(1)  # the last events in flight
        self.events.close()


def _watch_starts(stack: Any) -> _Starts:
    from runplane import bootstrap

    return _Starts(bootstrap.stack().settings.stack_id())


def _check(report: Report, starts: collections.Counter[tuple[str, str]], say: Callable[[str], None]) -> None:
    from runplane import bootstrap
    from runplane.domain.states import RunState
    from runplane.services.logs import outputs_prefix

    stack = bootstrap.stack()
    tokens = report.tokens
    for run_id, token in tokens.items():
        run = stack.store.get(run_id)
        terminal_events = [e for e in run.events if e.state is not None and e.state.terminal]
        if not run.state.terminal or len(terminal_events) != 1:
            report.lost.append(f"{run_id} ({run.state}, {len(terminal_events)} terminal events)")
            continue
        ended = f"{run.state}" + (f"/{run.failure.reason}" if run.failure else "")
        report.states[ended] += 1
        report.attempts[run.attempt] += 1  # claims made: the attempts it used
        if ended not in ("succeeded", "failed/worker_lost"):
            report.unexpected.append(f"{run_id}: {ended}: {run.failure.message if run.failure else ''}"[:200])
        claims = [e for e in run.events if e.state == RunState.PREPARING]
        if len(claims) != run.attempt:  # one claim per attempt, each its own
            report.doubled.append(f"{run_id}: {len(claims)} claims for {run.attempt} attempts")
        running = sum(1 for e in run.events if e.state == RunState.RUNNING)
        if running > run.attempt:
            report.doubled.append(f"{run_id}: {running} starts written for {run.attempt} attempts")
        seen = sum(n for (started_run, _), n in starts.items() if started_run == run_id)
        if seen < running:  # each attempt that ran started a container the engine told of
            report.unseen.append(f"{run_id}: {running} attempts ran, {seen} starts seen")
        requeues = [e.message for e in run.events if e.message.startswith("re-queued")]
        report.requeued_otherwise += [f"{run_id}: {m}"[:200] for m in requeues if not LOSS.fullmatch(m)]
        if any(LOSS.fullmatch(m) for m in requeues):
            report.retried.append(f"{run_id} ({run.attempt} attempts, {ended})")
        if run.state == RunState.SUCCEEDED:
            try:
                data = stack.objects.get_bytes(outputs_prefix(run.id, run.attempt) + "out.txt")
            except Exception as e:  # whatever the store says: the output is not there
                report.missing.append(f"{run_id}: {e}")
                continue
            if data.decode().strip() != token:
                report.missing.append(f"{run_id}: out.txt holds {data[:40]!r}")
    report.doubled = [f"{run} attempt {attempt} x{n}" for (run, attempt), n in starts.items() if n > 1]
    dead = _dead_letters(stack)
    report.dead_letters = len(dead)
    report.stray_dead_letters = [
        run_id for run_id in dead if run_id in tokens and not stack.store.get(run_id).state.terminal
    ]
    if not starts:
        report.doubled.append("no container start was seen at all: the engine's events were not read")


def _dead_letters(stack: Any) -> list[str]:
    """The run ids of the messages the pool's queue set aside (the local queue's dead letters, or
    SQS's dead-letter queue)."""
    from runplane.adapters.aws.sqs import dead_letter_queue_name, pool_queue_name
    from runplane.adapters.local.queues import pool_queue
    from runplane.domain.messages import RunMessage

    if stack.settings.cloud == "local":
        return [
            RunMessage.model_validate_json(body).run_id for body in stack.queue.dead_letters(pool_queue(POOL), 10000)
        ]
    sqs = stack.queue.client
    url = sqs.get_queue_url(QueueName=dead_letter_queue_name(pool_queue_name(stack.settings.prefix, POOL)))["QueueUrl"]
    found = []
    while True:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=300)
        messages = got.get("Messages", [])
        if not messages:
            return found
        found += [RunMessage.model_validate_json(m["Body"]).run_id for m in messages]


def _clean_up(work: Path, agents: int) -> None:
    """Containers and mounts the killed agents left."""
    import shutil

    import docker

    from worker_agent.workdir import sweep_dead

    client = docker.from_env()
    for i in range(agents):
        for c in client.containers.list(all=True, filters={"label": f"io.runplane.worker_id=soak-{i}"}):
            with contextlib.suppress(docker.errors.APIError):
                c.remove(force=True)
    sweep_dead(work / "agents")
    shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs (default 1000)")
    parser.add_argument("--agents", type=int, default=4, help="worker agents, one slot each (default 4)")
    parser.add_argument("--kill-every", type=float, default=6.0, help="most seconds between kills (default 6)")
    parser.add_argument(
        "--seed", type=int, default=None, help="seed of the runs' lengths and the kills (default: fresh)"
    )
    parser.add_argument(
        "--force-agent-kill",
        action="store_true",
        help="kill an agent first while it runs a 3 s run, and fail unless some run was retried after it",
    )
    args = parser.parse_args()
    report = soak(args.runs, args.agents, args.kill_every, args.seed, force_agent_kill=args.force_agent_kill)
    for line in report.lines():
        print(line)
    print(f"RESULT soak: {'ok' if report.ok else 'FAILED'} (target: 0 lost, 0 doubled, 0 missing; seed {report.seed})")
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
