"""The releases CHANGELOG.md records, newest first: each heading ``## X.Y.Z — YYYY-MM-DD`` is
followed by a line ``- commit: <40 hex digits>``, except the newest's: a commit cannot name itself,
so a release's line is written when the next release's section opens. The upgrade test builds the
release before the newest from the commit recorded here, and reads no other commit line."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CHANGELOG = Path(__file__).resolve().parents[1] / "CHANGELOG.md"
HEADING = re.compile(r"^## (?P<version>\d+\.\d+\.\d+) — (?P<date>\d{4}-\d{2}-\d{2})$")
COMMIT = re.compile(r"^- commit: (?P<commit>\S.*)$")
SHA = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Release:
    version: str
    date: str
    commit: str | None
    """The full hash, or None where the changelog does not name one yet."""


def releases(text: str) -> list[Release]:
    """Every release of a changelog's text, in its order. Raises ValueError for a release other
    than the newest without a commit line before the next heading (the newest may have none)."""
    found: list[Release] = []
    pending: tuple[str, str] | None = None

    def close() -> None:
        if pending is not None:
            if found:
                raise ValueError(f"release {pending[0]} names no commit (a line '- commit: ...')")
            found.append(Release(*pending, None))

    for line in text.splitlines():
        heading = HEADING.match(line.strip())
        if heading:
            close()
            pending = heading["version"], heading["date"]
            continue
        commit = COMMIT.match(line.strip())
        if commit and pending is not None:
            value = commit["commit"].strip()
            found.append(Release(*pending, value if SHA.fullmatch(value) else None))
            pending = None
    close()
    return found


def previous_release(text: str) -> Release:
    """The release before the newest; raises ValueError when there is none, or it has no commit."""
    listed = releases(text)
    if len(listed) < 2:
        raise ValueError("the changelog records no release before the newest")
    if listed[1].commit is None:
        raise ValueError(f"release {listed[1].version} names no commit of 40 hex digits")
    return listed[1]
