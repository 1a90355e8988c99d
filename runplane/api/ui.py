"""The dashboard: its files under ``/ui/``, served by the API's own resolver, so every front that
serves the API (the Lambda, the Azure Function, ``runplane dev``) serves the page on the same
origin. The page is static and holds no secret: it calls ``/v1/`` with the token its user gives
it (kept in the browser's ``sessionStorage``), so these routes take no token.

Only the files of ``runplane/web`` whose names are plain (``app.js``, never a path) are served;
anything else is a 404, so no request can reach a file outside that folder.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib.resources import files

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router

from runplane.domain import errors

ASSET_NAME = re.compile(r"[a-z][a-z0-9-]{0,40}\.(html|js|css|svg)")
CONTENT_TYPES = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "svg": "image/svg+xml",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""Nothing but this origin's own files: no inline script or style, no other host, no framing."""
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = Router()  # type: ignore[no-untyped-call]  # (Powertools leaves its __init__ unannotated)


@lru_cache(maxsize=32)
def asset(name: str) -> str | None:
    """The text of the dashboard's file ``name``, or None when there is no such file (or the name
    is not a plain file name of the kinds served)."""
    if not ASSET_NAME.fullmatch(name):
        return None
    resource = files("runplane.web") / name
    return resource.read_text("utf-8") if resource.is_file() else None


def _file(name: str) -> Response[str]:
    text = asset(name)
    if text is None:
        raise errors.NotFound(f"no dashboard file {name[:80]!r}")
    return Response(status_code=200, content_type=CONTENT_TYPES[name.rpartition(".")[2]], body=text, headers=HEADERS)


@router.get("/ui")
def index() -> Response[str]:
    return _file("index.html")


@router.get("/ui/")
def index_slash() -> Response[str]:
    return _file("index.html")


@router.get("/ui/<name>")
def ui_file(name: str) -> Response[str]:
    return _file(name)
