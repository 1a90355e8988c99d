"""The HTTP API as one Powertools resolver: ``app``, with every route of runplane/api/routes (and the
document's own, in runplane/api/openapi.py) declared on it. Entry points import ``app`` from here."""

from __future__ import annotations

from runplane.api import openapi
from runplane.api.app import app, logger, tracer

__all__ = ["app", "logger", "openapi", "tracer"]
