"""A small HTTP client for the runplane API (standard library only)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEV_FILE = Path("~/.runplane/dev.json").expanduser()
DEFAULT_URL = "http://127.0.0.1:8080"


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Response:
    """An answer of the API that succeeded: its HTTP status (201 for a run made, 200 for one an
    ``Idempotency-Key`` found, ...) and its parsed JSON body (None when it has none)."""

    status: int
    body: Any


@dataclass
class Client:
    url: str
    token: str | None
    timeout: float = 30

    @classmethod
    def from_env(cls) -> Client:
        """RUNPLANE_API_URL / RUNPLANE_TOKEN, else what a running ``runplane dev`` wrote down."""
        url = os.environ.get("RUNPLANE_API_URL")
        token = os.environ.get("RUNPLANE_TOKEN")
        if (url is None or token is None) and DEV_FILE.exists():
            try:
                dev = json.loads(DEV_FILE.read_text())
                url = url or dev.get("api_url")
                token = token or dev.get("token")
            except (OSError, ValueError):
                pass
        return cls((url or DEFAULT_URL).rstrip("/"), token)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """The parsed JSON body of a successful answer; raises ApiError for any other."""
        return self.request_with_status(method, path, body, query, headers).body

    def request_with_status(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """Like ``request``, with the answer's HTTP status kept."""
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = json.dumps(body).encode() if body is not None else None
        if not url.startswith(("http://", "https://")):
            raise ApiError(0, "bad_url", f"RUNPLANE_API_URL must start with http:// or https://, got {self.url!r}")
        req = urllib.request.Request(url, data=data, method=method)  # noqa: S310 - scheme checked above
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - URL is the user's API
                raw, status = resp.read(), resp.status
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                err = json.loads(raw)["error"]
                raise ApiError(e.code, err.get("code", "error"), err.get("message", "")) from None
            except (ValueError, KeyError, TypeError):
                raise ApiError(e.code, "http_error", f"HTTP {e.code}: {raw[:200].decode(errors='replace')}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ApiError(
                0, "unreachable", f"cannot reach {self.url}: {reason} (is `runplane dev` running? set RUNPLANE_API_URL)"
            ) from None
        return Response(status, json.loads(raw) if raw else None)

    def download(self, url: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as resp, dest.open("wb") as out:  # noqa: S310
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
        except (urllib.error.URLError, OSError) as e:
            raise ApiError(0, "download_failed", f"download of {dest.name} failed: {e}") from None
