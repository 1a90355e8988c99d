"""The embedded stack's SessionRelay: the WebSocket its own front serves at ``/v1/relay``
(runplane/devstack/relay.py), in the process where the API answers too."""

from __future__ import annotations

from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

from runplane.domain.sessions import RelayEndpoint, Session

RELAY_PATH = "/v1/relay"
MAX_FRAME = 64 * 1024


class Hangup(Protocol):
    def close(self, session_id: str, reason: str) -> None:
        """Hang up both sides of a session; quiet when none is connected."""


class FrontSessionRelay:
    """Sides dial ``public_url``'s WebSocket form (ws:// for http://, wss:// for https://) at
    RELAY_PATH with their ticket as a bearer token; ``hub`` is what hangs sessions up."""

    def __init__(self, public_url: str, hub: Hangup, max_frame: int = MAX_FRAME) -> None:
        parts = urlsplit(public_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"the relay needs the stack's http(s) URL, not {public_url[:200]!r}")
        scheme = "wss" if parts.scheme == "https" else "ws"
        self.url = urlunsplit((scheme, parts.netloc, parts.path + RELAY_PATH, "", ""))
        self.hub, self.max_frame = hub, max_frame

    def endpoint(self, session: Session, ticket: str) -> RelayEndpoint:
        return RelayEndpoint(url=self.url, headers={"Authorization": f"Bearer {ticket}"}, max_frame=self.max_frame)

    def close(self, session_id: str, reason: str) -> None:
        self.hub.close(session_id, reason)
