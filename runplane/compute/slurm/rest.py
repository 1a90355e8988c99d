"""Slurm through slurmrestd (OpenAPI v0.0.38, as served by Slurm 22.05).

Over TCP each request carries a JWT (``X-SLURM-USER-NAME`` / ``X-SLURM-USER-TOKEN``); the
token is read from its file on every request, so a rotated token is picked up without a
restart. Over a unix socket slurmrestd's local auth needs no token: jobs run as the user
slurmrestd runs as.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import os
import socket
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from runplane.compute.options import stack_environment
from runplane.compute.slurm.jobs import JobSpec, SlurmJob, rest_job
from runplane.domain.errors import BackendError

API = "/slurm/v0.0.38"
INVALID_JOB_ID = 2017  # ESLURM_INVALID_JOB_ID: the controller does not (or no longer) know the job
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


class SlurmRestError(BackendError):
    """slurmrestd answered with errors. ``numbers`` holds Slurm's error numbers (stable codes,
    unlike the messages)."""

    def __init__(self, message: str, status: int, errors: list[dict[str, Any]]) -> None:
        super().__init__(message, status=status, slurm_errors=errors)
        self.status = status
        self.numbers = {n for e in errors if (n := _number(e)) is not None}


def _number(error: Mapping[str, Any]) -> int | None:
    value = error.get("error_number", error.get("error_code"))
    return value if isinstance(value, int) else None


def check_reply(status: int, body: bytes, where: str) -> dict[str, Any]:
    """The JSON document of a slurmrestd reply; raises SlurmRestError when it reports errors
    (its ``errors`` list, or an HTTP error status) with Slurm's own messages."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        text = body.decode(errors="replace").strip()[:300] or "(empty reply)"
        raise SlurmRestError(f"{where}: HTTP {status}: {text}", status, [])
    errors = [e for e in data.get("errors") or [] if isinstance(e, dict)]
    if errors or status >= 400:
        said = "; ".join(_describe(e) for e in errors) or "no error given"
        raise SlurmRestError(f"{where}: {said} (HTTP {status})", status, errors)
    return data


def _describe(error: Mapping[str, Any]) -> str:
    message = str(error.get("error") or "")
    description = str(error.get("description") or "")
    text = f"{message}: {description}" if message and description and description != message else message or description
    number = _number(error)
    return f"{text} [{number}]" if number is not None else text


def parse_job(item: Mapping[str, Any]) -> SlurmJob:
    """One entry of a ``jobs`` list (``GET /jobs`` or ``GET /job/{id}``)."""
    submitted = item.get("submit_time")
    return SlurmJob(
        id=str(item.get("job_id", "")),
        name=str(item.get("name") or ""),
        state=str(item.get("job_state") or ""),
        reason=str(item.get("state_reason") or ""),
        submitted=float(submitted) if isinstance(submitted, int | float) else 0.0,
    )


def parse_jobs(data: Mapping[str, Any]) -> list[SlurmJob]:
    return [parse_job(item) for item in data.get("jobs") or [] if isinstance(item, dict)]


def token_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, read without checking its signature (slurmctld checks that): used
    for the user name (``sun``) and to report an expired token (``exp``) before sending it."""
    parts = token.split(".")
    if len(parts) != 3:
        raise ValueError("not a JWT (expected three dot-separated parts)")
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"not a JWT ({e})") from e
    if not isinstance(claims, dict):
        raise ValueError("not a JWT (its claims are not an object)")
    return claims


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class RestTransport:
    """Submits, lists, describes and cancels jobs through slurmrestd at ``url``.

    A worker job gets an explicit environment (slurmrestd passes none on its own): ``PATH``,
    the dispatcher's ``RUNPLANE_*`` settings and the pool's ``environment``; never the
    dispatcher's credentials.
    """

    local = False  # the nodes' file systems are not this machine's: nothing is made here

    def __init__(
        self,
        url: str,
        token_file: str | None = None,
        user: str | None = None,
        *,
        clock: Callable[[], float],
        environ: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.url = url
        self.token_file = str(Path(token_file).expanduser()) if token_file else None
        self.user = user
        self.clock = clock
        self.environ = environ
        self.timeout = timeout
        self.name = f"slurmrestd at {url}"
        if url.startswith("unix:"):
            self._socket: str | None = url[len("unix:") :]
            self._base = ""
        else:
            self._socket = None
            self._base = urlsplit(url).path.rstrip("/")

    def _connection(self) -> http.client.HTTPConnection:
        if self._socket is not None:
            return _UnixConnection(self._socket, self.timeout)
        parts = urlsplit(self.url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return cls(parts.netloc, timeout=self.timeout)

    def _auth(self) -> tuple[dict[str, str], str]:
        """The auth headers, and how this request authenticates (for error messages)."""
        if self.token_file is None:
            return {}, "local auth"
        try:
            token = Path(self.token_file).read_text().strip().removeprefix("SLURM_JWT=")
        except OSError as e:
            raise BackendError(f"{self.name}: cannot read the JWT in {self.token_file}: {e.strerror}") from e
        try:
            claims = token_claims(token)
        except ValueError as e:
            raise BackendError(f"{self.name}: the JWT in {self.token_file} is unusable: {e}") from e
        expires = claims.get("exp")
        if isinstance(expires, int | float) and expires <= self.clock():
            when = datetime.fromtimestamp(expires, UTC).isoformat(timespec="seconds")
            raise BackendError(
                f"{self.name}: the JWT in {self.token_file} expired at {when}; "
                "make a new one with `scontrol token username=USER lifespan=SECONDS`"
            )
        user = self.user or claims.get("sun")
        if not isinstance(user, str) or not user:
            raise BackendError(f"{self.name}: the JWT in {self.token_file} names no user; set options.jwt_user")
        return {"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": token}, f"user {user}, JWT from {self.token_file}"

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One call to slurmrestd; the reply's JSON, or SlurmRestError / BackendError."""
        headers, auth = self._auth()
        where = f"{self.name} ({auth}): {method} {API}{path}"
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = self._connection()
        try:
            conn.request(method, f"{self._base}{API}{path}", body=payload, headers=headers)
            reply = conn.getresponse()
            status, data = reply.status, reply.read()
        except (OSError, http.client.HTTPException) as e:
            raise BackendError(f"{where}: slurmrestd is unreachable: {e}") from e
        finally:
            conn.close()
        return check_reply(status, data, where)

    def environment(self, spec: JobSpec) -> dict[str, str]:
        environ = os.environ if self.environ is None else self.environ
        return {"PATH": DEFAULT_PATH, **stack_environment(environ, hide_credentials=False), **spec.environment}

    def submit(self, spec: JobSpec, script: str) -> str:
        data = self.request("POST", "/job/submit", {"job": rest_job(spec, self.environment(spec)), "script": script})
        job_id = data.get("job_id")
        if not isinstance(job_id, int):
            raise BackendError(f"{self.name}: the submission was answered without a job id")
        return str(job_id)

    def jobs(self) -> list[SlurmJob]:
        return parse_jobs(self.request("GET", "/jobs"))

    def job(self, job_id: str) -> SlurmJob | None:
        try:
            data = self.request("GET", f"/job/{quote(job_id, safe='')}")
        except SlurmRestError as e:
            if INVALID_JOB_ID in e.numbers:
                return None
            raise
        return next((job for job in parse_jobs(data) if job.id == job_id), None)

    def cancel(self, job_id: str) -> None:
        # The default signal, like scancel: SIGTERM, then SIGKILL after KillWait. A job that
        # ended is cancelled quietly by slurmrestd; one the controller forgot reports 2017.
        try:
            self.request("DELETE", f"/job/{quote(job_id, safe='')}")
        except SlurmRestError as e:
            if INVALID_JOB_ID not in e.numbers:
                raise
