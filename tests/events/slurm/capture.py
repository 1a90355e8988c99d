"""Record real slurmrestd (and squeue) replies as fixtures for the unit tests.

Needs the local Slurm of scripts/start-slurm.sh (run it first); takes about two minutes (one
job waits for its time limit). Usage: .venv/bin/python tests/events/slurm/capture.py
Each NAME.json holds the request, the HTTP status and the reply body verbatim.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SLURM = Path("/var/lib/runplane-slurm")
API = "/slurm/v0.0.38"
WORK = Path("/tmp/runplane-slurm-capture")
SQUEUE_FORMAT = "%i|%j|%T|%V|%r"
SUBMITTED: list[str] = []  # cancelled at the end, whatever happens


def call(method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, str]:
    host = (SLURM / "rest.url").read_text().strip().removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=30)
    token = (SLURM / "rest.token").read_text().strip() if token is None else token
    headers = {"Content-Type": "application/json"}
    if token:  # an empty token sends no credentials at all
        headers |= {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token}
    conn.request(method, API + path, body=json.dumps(body) if body is not None else None, headers=headers)
    reply = conn.getresponse()
    return reply.status, reply.read().decode()


def save(name: str, method: str, path: str, body: Any = None, token: str | None = None) -> dict[str, Any]:
    status, text = call(method, path, body, token)
    (HERE / f"{name}.json").write_text(
        json.dumps({"request": f"{method} {API}{path}", "status": status, "body": text}, indent=1) + "\n"
    )
    return json.loads(text) if text.startswith("{") else {}


def job(worker: str, script: str, **fields: Any) -> dict[str, Any]:
    pool = worker.rsplit("-", 1)[0]
    return {
        "job": {
            "name": f"runplane-{pool}--{worker}",
            "cpus_per_task": 1,
            "memory_per_node": 64,
            "current_working_directory": str(WORK),
            "standard_output": f"{WORK}/{worker}.log",
            "environment": {"PATH": "/usr/bin:/bin"},
            **fields,
        },
        "script": f"#!/bin/sh\n{script}\n",
    }


def submit(worker: str, script: str, **fields: Any) -> str:
    status, text = call("POST", "/job/submit", job(worker, script, **fields))
    assert status == 200, text
    SUBMITTED.append(str(json.loads(text)["job_id"]))
    return SUBMITTED[-1]


def state(job_id: str) -> str:
    return str(json.loads(call("GET", f"/job/{job_id}")[1])["jobs"][0]["job_state"])


def wait(job_id: str, states: set[str], timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while state(job_id) not in states:
        assert time.monotonic() < deadline, f"job {job_id} never reached {states}"
        time.sleep(0.5)


def squeue(name: str, *args: str) -> None:
    out = subprocess.run(["squeue", "--noheader", *args, f"--format={SQUEUE_FORMAT}"], capture_output=True, text=True)
    (HERE / name).write_text(out.stdout)


def main() -> None:
    WORK.mkdir(exist_ok=True)
    save("submit_refused", "POST", "/job/submit", job("cap-big", "true", cpus_per_task=512))
    save("submit_unparsable", "POST", "/job/submit", job("cap-sig", "true", signal="B:TERM@60"))
    done = save("submit_ok", "POST", "/job/submit", job("cap-ok", "exit 0"))
    ok = str(done["job_id"])
    SUBMITTED.append(ok)
    exit3 = submit("cap-exit3", "exit 3")
    nolog = submit("cap-nolog", "true", standard_output="/nonexistent/dir/cap-nolog.log")
    for job_id, name in ((ok, "job_completed"), (exit3, "job_failed_exit"), (nolog, "job_launch_failed")):
        wait(job_id, {"COMPLETED", "FAILED"})
        save(name, "GET", f"/job/{job_id}")
    cancelled = submit("cap-cancel", "exec sleep 300")
    wait(cancelled, {"RUNNING"})
    save("cancel_ok", "DELETE", f"/job/{cancelled}")
    wait(cancelled, {"CANCELLED"})
    save("job_cancelled", "GET", f"/job/{cancelled}")
    save("cancel_ended", "DELETE", f"/job/{cancelled}")
    running = submit("cap-run", "exec sleep 300")
    wait(running, {"RUNNING"})
    pending = submit("cap-pending", "exec sleep 300", hold=True)  # pending whatever else runs
    other = submit("other-run", "exec sleep 300", hold=True)
    save("job_running", "GET", f"/job/{running}")
    save("job_pending", "GET", f"/job/{pending}")
    save("jobs", "GET", "/jobs")
    squeue("squeue.txt")
    squeue("squeue_all.txt", "--states=all")
    save("job_unknown", "GET", "/job/999999")
    save("cancel_unknown", "DELETE", "/job/999999")
    token = (SLURM / "rest.token").read_text().strip()
    save("jobs_bad_token", "GET", "/jobs", token=token[:-4] + "AAAA")
    save("jobs_no_credentials", "GET", "/jobs", token="")
    save("submit_bad_token", "POST", "/job/submit", job("cap-x", "true"), token=token[:-4] + "AAAA")
    for job_id in (running, pending, other):
        call("DELETE", f"/job/{job_id}")  # frees the CPU the next job needs
    timeout = submit("cap-timeout", "exec sleep 300", time_limit=1)
    wait(timeout, {"TIMEOUT"})
    save("job_timeout", "GET", f"/job/{timeout}")


if __name__ == "__main__":
    try:
        main()
    finally:
        for job_id in SUBMITTED:
            call("DELETE", f"/job/{job_id}")
