"""The version skew policy between agents and the control plane (docs/architecture.md, "Version
skew"): an agent may be of the control plane's release series (major.minor) or of the one before
it; an agent of an older series, or of a newer one, is refused.

Only the series is compared: releases within a series (patch releases) change no record or
message, so any two of them run side by side. A version is read by its leading ``major.minor``;
what follows (``.patch``, ``.dev1``, ``rc1``, ``+local``) does not matter, so a development build
of 0.2.0 (``0.2.0.dev1``) is of series 0.2. A version without a readable ``major.minor`` (``""``
from a worker item written before agents reported one, or a hand-made string) cannot be placed in
the window and is not refused: the agent's own check, which knows its version, is the one that
counts."""

from __future__ import annotations

import re

from runplane.domain.common import SCHEMA_VERSION
from runplane.domain.wire import Record

_SERIES = re.compile(r"^\s*v?(\d+)\.(\d+)(?!\d)")


def series(version: str) -> tuple[int, int] | None:
    """The release series (major, minor) of ``version``; None when it has none to read."""
    found = _SERIES.match(version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def oldest_agent(stack_version: str) -> str:
    """The oldest agent series a control plane of ``stack_version`` allows, as ``major.minor``:
    the series before its own (its own when it is the first of its major). ``""`` when
    ``stack_version`` has no series to read."""
    found = series(stack_version)
    if found is None:
        return ""
    major, minor = found
    return f"{major}.{max(0, minor - 1)}"


def agent_refusal(agent_version: str, stack_version: str, oldest: str | None = None) -> str | None:
    """Why an agent of ``agent_version`` may not serve a control plane of ``stack_version`` whose
    oldest allowed agent series is ``oldest`` (None or unreadable: this policy's, ``oldest_agent``),
    or None when it may. An agent or a stack version without a readable series is never refused."""
    agent, stack = series(agent_version), series(stack_version)
    if agent is None or stack is None:
        return None
    floor = (series(oldest) if oldest else None) or series(oldest_agent(stack_version)) or stack
    if agent > stack:
        return f"agent {agent_version} is newer than this stack ({stack_version}): upgrade the functions first"
    if agent < floor:
        return f"agent {agent_version} is older than this stack allows (>= {floor[0]}.{floor[1]})"
    return None


class StackRecord(Record):
    """The control plane's word to its agents, kept in the worker registry: its version and the
    oldest agent series it allows. The dispatcher's schedule writes it; an agent reads it when it
    registers. No record (a control plane from before the check): agents go on unchecked."""

    v: int = SCHEMA_VERSION
    version: str
    oldest_agent: str
    written_at: float
