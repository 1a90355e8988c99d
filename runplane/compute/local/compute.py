"""Worker agents as child processes, tracked by pid files so any process can list them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from runplane.backend import BackendJob, ComputeBackend
from runplane.compute.options import new_worker_id
from runplane.domain.errors import BackendError
from runplane.domain.pools import Pool
from runplane.settings import StackSettings

ENDED_KEEP_SECONDS = 86400.0


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (to tell a reused pid apart), or None if gone/zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


class LocalCompute(ComputeBackend):
    def __init__(
        self,
        state_dir: str | Path,
        env: Mapping[str, str] | None = None,
        command: Sequence[str] = (sys.executable, "-m", "worker_agent"),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state_dir = Path(state_dir).expanduser()
        self.env = dict(env) if env is not None else None
        self.command = list(command)
        self.clock = clock
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._exit_codes: dict[int, int] = {}

    def _dir(self, pool: Pool) -> Path:
        path = self.state_dir / pool.name
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # agents' logs: this user's alone
        path.mkdir(mode=0o700, exist_ok=True)
        return path

    def launch(self, pool: Pool, count: int, agent_args: Sequence[str]) -> list[BackendJob]:
        jobs: list[BackendJob] = []
        for _ in range(count):
            worker_id = new_worker_id(pool.name)
            log_path = self._dir(pool) / f"{worker_id}.log"
            env = dict(os.environ if self.env is None else self.env)
            try:
                with log_path.open("ab") as log:
                    proc = subprocess.Popen(
                        [*self.command, *agent_args, "--id", worker_id],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
            except OSError as e:
                raise BackendError(f"cannot start a local agent: {e}", jobs=jobs) from e
            self._children[proc.pid] = proc
            now = self.clock()
            record = {
                "id": worker_id,
                "pid": proc.pid,
                "started": _start_time(proc.pid),
                "created_at": now,
                "log": str(log_path),
            }
            (self._dir(pool) / f"{worker_id}.json").write_text(json.dumps(record))
            jobs.append(
                BackendJob(worker_id, pool.name, "running", worker_id, now, {"pid": proc.pid, "log": str(log_path)})
            )
        return jobs

    def signal_all(self, pool: Pool, sig: signal.Signals) -> list[BackendJob]:
        """Send ``sig`` to every live agent of ``pool``; returns those it reached. Unlike
        ``cancel``, their records stay: ``list`` shows each until it has exited. SIGTERM lets an
        agent finish its runs first; SIGKILL ends it now, leaving its runs' containers, its work
        dir's mounts and its worker record to whoever sent it."""
        reached = []
        for job in self.list(pool):
            try:
                os.kill(int(job.detail["pid"]), sig)
            except ProcessLookupError:
                continue
            reached.append(job)
        return reached

    def _reap(self) -> None:
        for pid, proc in list(self._children.items()):
            code = proc.poll()
            if code is not None:
                del self._children[pid]
                self._exit_codes[pid] = code

    def _ended(self, path: Path, record: dict[str, object]) -> None:
        """Keep what is known of an agent that exited, for ``describe``; drop the live record."""
        code = self._exit_codes.pop(int(str(record["pid"])), None)
        log_tail = ""
        with contextlib.suppress(OSError):
            lines = [line for line in Path(str(record.get("log"))).read_text(errors="replace").splitlines() if line]
            log_tail = lines[-1][:300] if lines else ""
        ended = {**record, "exit_code": code, "log_tail": log_tail, "ended_at": self.clock()}
        path.with_suffix(".ended").write_text(json.dumps(ended))
        path.unlink(missing_ok=True)

    def list(self, pool: Pool) -> list[BackendJob]:
        self._reap()
        for ended in self._dir(pool).glob("*.ended"):
            with contextlib.suppress(OSError):
                if self.clock() - ended.stat().st_mtime > ENDED_KEEP_SECONDS:
                    ended.unlink()
        jobs = []
        for path in sorted(self._dir(pool).glob("*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            started = _start_time(record["pid"])
            if started is None or started != record.get("started"):
                self._ended(path, record)
                continue
            jobs.append(
                BackendJob(
                    record["id"],
                    pool.name,
                    "running",
                    record["id"],
                    record["created_at"],
                    {"pid": record["pid"], "log": record.get("log")},
                )
            )
        return jobs

    def cancel(self, pool: Pool, job_id: str) -> None:
        path = self._dir(pool) / f"{job_id}.json"
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        if _start_time(record["pid"]) == record.get("started"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(record["pid"], signal.SIGTERM)
        path.unlink(missing_ok=True)
        self._reap()

    def describe(self, pool: Pool, job_id: str) -> BackendJob | None:
        """A live agent, or one that exited: ``finished`` on exit code 0 (idle or done), else
        ``failed`` with the exit code and the last line of its log as the reason."""
        live = next((job for job in self.list(pool) if job.id == job_id), None)
        if live is not None:
            return live
        try:
            record = json.loads((self._dir(pool) / f"{job_id}.ended").read_text())
        except (OSError, ValueError):
            return None
        code = record.get("exit_code")
        detail = {"pid": record["pid"], "log": record.get("log"), "exit_code": code}
        if code == 0:
            return BackendJob(job_id, pool.name, "finished", job_id, record["created_at"], detail)
        exit_text = f"agent exited with code {code}" if code is not None else "agent exited"
        detail["reason"] = exit_text + (f": {record['log_tail']}" if record.get("log_tail") else "")
        return BackendJob(job_id, pool.name, "failed", job_id, record["created_at"], detail)


def build(settings: StackSettings) -> LocalCompute:
    """The backend of ``local`` pools: agents as processes of this machine, their records and
    logs under ``settings.local_state_dir``, started with this process's environment and
    ``settings`` in it."""
    return LocalCompute(settings.local_state_dir, env=settings.exported(os.environ))
