"""Per-run overhead of the worker agent on a warm worker vs the same container run bare.

The embedded local stack (moto in-process, HTTP front, dispatcher, one local worker agent on the
real Docker engine, the same pool and agent flags as ``e2e_run.py``) runs ``sh -c true`` in
``runplane/test-busybox:1``, one run at a time. Nothing here is timed by the client: every
agent-side time comes from the run itself (its events' ``at`` times, written by the agent, and
``usage.timings``), read from the store once the run is final, and from the Docker engine's own
event stream (create, start, die, destroy of each run container, ``timeNano``), which shares the
host's clock with the agent.

The baseline is the Docker SDK with exactly the isolation the agent applies: ``containers.create``
with the kwargs of ``worker_agent.executor.container_spec`` for the same stored run (its own name,
a fresh output directory, the cores an ``Allocator`` hands out; a benchmark label instead of the
run labels, which no agent's orphan sweep touches) + start + wait + remove. A run disturbed from
outside (another stack's agent sweeping this engine, say) is reported, not counted, and redone.

Reported (medians, p90):

* claim -> container start: from the claimed (``preparing``) event to the ``running`` event (the
  agent writes it once ``start`` has returned), split with the engine's create/start events;
* exit -> final: from the container's exit (engine ``die`` event) to the final event, split into
  what the agent does after the exit before its run timer stops (``run`` end = running +
  ``usage.timings.run``), run end -> ``uploading`` event, and ``uploading`` -> final event;
* claim -> final (the agent's wall time for a run) and claim -> container removed.

``usage.timings`` are rounded to 1 ms, so "run end -> uploading" may show a small negative value.

RATIO is agent claim -> final / bare create+start+wait+remove (informational target 1.5x). The
agent removes the container after writing the final state; that removal is shown separately.

    python bench/agent_overhead.py [--n 15]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import agent_pids, bare_container, dev_stack, median, ratio_line, table
from e2e_run import AGENT_ARGS, IMAGE, POOLS_YAML, RUN_TIMEOUT

TARGET = 1.5
SPEC = {"command": "true", "name": "bench-agent-overhead"}  # the agent runs it as /bin/sh -c true
LABEL_RUN = "io.runplane.run_id"
# The bare containers carry this label instead of the run labels, so that no agent's orphan sweep
# (any agent starting on this engine removes run-labelled containers its own store does not know)
# takes them away mid-measurement.
LABEL_BARE = "io.runplane-bench.id"
MAX_SKIPPED = 5  # runs spoiled by something outside the benchmark before it gives up
POLL_SECONDS = 0.05  # store polling while a run goes; agent-side times do not depend on it
ACTIONS = ("create", "start", "die", "destroy")


class Spoiled(Exception):
    """A run that something outside the benchmark disturbed (not recorded; the round is redone)."""


class EngineEvents:
    """The Docker engine's container events for run containers, keyed by the run-id label."""

    def __init__(self, docker_client: Any) -> None:
        self.at: dict[str, dict[str, float]] = {}
        self._cond = threading.Condition()
        self._stream = docker_client.events(decode=True, filters={"type": "container", "event": list(ACTIONS)})
        self._thread = threading.Thread(target=self._read, name="docker-events", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self._stream:
                labels = event.get("Actor", {}).get("Attributes", {})
                run_id = labels.get(LABEL_RUN) or labels.get(LABEL_BARE)
                action = event.get("Action") or event.get("status")
                if run_id and action in ACTIONS:
                    with self._cond:
                        self.at.setdefault(run_id, {}).setdefault(action, event["timeNano"] / 1e9)
                        self._cond.notify_all()
        except Exception:  # the stream is closed at the end
            return

    def wait(self, run_id: str, action: str, timeout: float = 10.0) -> dict[str, float]:
        with self._cond:
            self._cond.wait_for(lambda: action in self.at.get(run_id, {}), timeout)
            return dict(self.at.get(run_id, {}))

    def close(self) -> None:
        self._stream.close()


class OverheadBench:
    def __init__(self, api_url: str) -> None:
        import docker

        from runplane import bootstrap
        from runplane.client import Client

        self.client = Client(api_url, "bench")
        self.store = bootstrap.stack().store
        self.docker = docker.from_env()
        self.events = EngineEvents(self.docker)
        self.scratch = Path(tempfile.mkdtemp(prefix="runplane-bench-mounts-"))
        self.agent: dict[str, list[float]] = {}
        self.timings: dict[str, list[float]] = {}
        self.bare: dict[str, list[float]] = {}
        self.template: Any = None  # a stored run, for container_spec
        self.bare_count = 0

    def agent_run(self, record: bool = True) -> None:
        posted = self.client.request("POST", "/v1/runs", SPEC)
        t = time.monotonic()
        while True:
            run = self.store.get(posted["id"])
            if run.state.terminal:
                break
            if time.monotonic() - t > RUN_TIMEOUT:
                raise RuntimeError(f"run {run.id} not finished after {RUN_TIMEOUT:.0f}s: {run.state}")
            time.sleep(POLL_SECONDS)
        if run.state.value != "succeeded":
            raise Spoiled(f"run {run.id} ended {run.state.value}: {run.failure.message if run.failure else ''}")
        self.template = run
        engine = self.events.wait(run.id, "destroy")
        if not record:
            return
        if set(ACTIONS) - set(engine):
            raise Spoiled(f"run {run.id}: engine events {sorted(engine)} only")
        at: dict[str, float] = {}
        for event in run.events:
            if event.state is not None:
                at.setdefault(event.state.value, event.at)
        timings = run.usage.timings
        claim, running, uploading, final = at["preparing"], at["running"], at["uploading"], at["succeeded"]
        run_end = running + timings["run"]
        steps = {
            "claim -> container start (running event)": running - claim,
            "  claim -> image checked (timings.pull)": timings.get("pull", 0.0),
            "  claim -> engine create event": engine["create"] - claim,
            "  engine create -> start event": engine["start"] - engine["create"],
            "  engine start event -> running event": running - engine["start"],
            "container exit (engine die) -> final event": final - engine["die"],
            "  die -> run end (running + timings.run)": run_end - engine["die"],
            "  run end -> uploading event": uploading - run_end,
            "  uploading -> final event": final - uploading,
            "run end -> final (run end->uploading + uploading->final)": final - run_end,
            "final event -> container removed (destroy)": engine["destroy"] - final,
            "agent claim -> final event": final - claim,
            "agent claim -> container removed": engine["destroy"] - claim,
            "container start -> die (engine events)": engine["die"] - engine["start"],
        }
        for label, value in steps.items():
            self.agent.setdefault(label, []).append(value)
        for key, value in timings.items():
            self.timings.setdefault(key, []).append(value)

    def bare_run(self, record: bool = True) -> None:
        """create + start + wait + remove with container_spec's kwargs for the same run."""
        import docker.errors

        self.bare_count += 1
        bare_id = f"bare-{self.bare_count}"
        try:
            code, (t, *marks, end) = bare_container(
                self.docker,
                self.template,
                IMAGE,
                self.scratch,
                name=f"runplane-bench-{bare_id}",
                labels={LABEL_BARE: bare_id},
            )
        except docker.errors.APIError as e:
            raise Spoiled(f"bare container {bare_id}: {e}") from e
        if code != 0:
            raise Spoiled(f"bare container {bare_id} exited {code}")
        engine = self.events.wait(bare_id, "destroy")
        if not record:
            return
        if set(ACTIONS) - set(engine):
            raise Spoiled(f"bare container {bare_id}: engine events {sorted(engine)} only")
        parts = {
            "bare create+start+wait+remove": end - t,
            "  create (incl. mkdtemp, kwargs)": marks[0] - t,
            "  start": marks[1] - marks[0],
            "  wait": marks[2] - marks[1],
            "  remove": end - marks[2],
            "container start -> die (engine events)": engine["die"] - engine["start"],
        }
        for label, value in parts.items():
            self.bare.setdefault(label, []).append(value)

    def rounds(self, n: int) -> None:
        """Alternate which path goes first; redo a path whose run was spoiled from outside."""
        skipped = 0
        paths = [(self.agent, self.agent_run), (self.bare, self.bare_run)]
        i = 0
        while min(len(next(iter(samples.values()), [])) for samples, _ in paths) < n:
            for samples, path in paths[i % 2 :] + paths[: i % 2]:
                if len(next(iter(samples.values()), [])) >= n:
                    continue
                try:
                    path()
                except Spoiled as e:
                    skipped += 1
                    print(f"  not counted: {e}")
                    if skipped > MAX_SKIPPED:
                        raise RuntimeError(f"{skipped} runs spoiled; is something else using this engine?") from e
            i += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=15, help="measured runs of each path (default 15)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured runs of each path first (default 2)")
    args = parser.parse_args()
    with dev_stack(POOLS_YAML, AGENT_ARGS, wait_agents=True) as stack:
        bench = OverheadBench(stack.api_url)
        try:
            t0 = time.perf_counter()
            bench.agent_run(record=False)
            print(f"first run (launches the worker agent): {time.perf_counter() - t0:.2f}s")
            for warm_up in [bench.agent_run] * max(0, args.warmup - 1) + [bench.bare_run] * args.warmup:
                try:
                    warm_up(record=False)
                except Spoiled as e:
                    print(f"  warm-up: {e}")
            agents = agent_pids()
            t0 = time.perf_counter()
            bench.rounds(args.n)
            print(f"{args.n} rounds took {time.perf_counter() - t0:.1f}s; {len(agents)} agent process(es)")
        finally:
            bench.events.close()
            shutil.rmtree(bench.scratch, ignore_errors=True)

    table(
        f"agent side of a trivial run ({IMAGE}, sh -c true), sequential, warm worker (run events + engine events)",
        list(bench.agent.items()),
    )
    table("agent's own timings (usage.timings)", sorted(bench.timings.items()))
    table("docker SDK, container_spec kwargs (same isolation)", list(bench.bare.items()))
    a, b = bench.agent, bench.bare
    claim_final = median(a["agent claim -> final event"])
    bare = median(b["bare create+start+wait+remove"])
    print(
        f"\n  claim -> start {median(a['claim -> container start (running event)']) * 1000:.0f} ms "
        f"vs bare create+start {(median(b['  create (incl. mkdtemp, kwargs)']) + median(b['  start'])) * 1000:.0f} ms; "
        f"exit -> final {median(a['container exit (engine die) -> final event']) * 1000:.0f} ms; "
        f"agent claim -> final - bare {(claim_final - bare) * 1000:.0f} ms"
    )
    print(
        ratio_line(
            "agent_overhead (agent claim->final / bare SDK create+start+wait+remove)", claim_final / bare, TARGET
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
