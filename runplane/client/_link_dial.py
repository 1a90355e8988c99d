"""How a session's Link dials its relay: the WebSocket connection, and a relay's URL as it may be shown."""

from __future__ import annotations

import logging
import urllib.parse
from typing import Any

from runplane.domain.session_wire import max_message

log = logging.getLogger(__name__)

OPEN_TRIES = 2
"""How many times an opening that times out is tried (see ``connect``)."""


def connect(
    url: str, headers: dict[str, str], encoding: str, *, open_timeout: float = 10.0, env_proxy: bool = True
) -> Any:
    """The WebSocket connection to a relay (a websockets ``ClientConnection``), its messages up to
    the largest frame of ``encoding``. An opening that times out is tried again once: over TLS 1.3 a
    server's session tickets can come while the opening request is written, and the client's reading
    thread taking them at that moment can leave the request unsent (the relay then never answers).
    Raises what websockets raises (InvalidHandshake, InvalidURI, OSError, TimeoutError)."""
    from websockets.sync.client import connect as ws_connect

    for attempt in range(1, OPEN_TRIES + 1):
        try:
            return ws_connect(
                url,
                additional_headers=headers,
                compression=None,
                max_size=max_message(encoding),
                open_timeout=open_timeout,
                ping_interval=None,  # the session's own PING frames keep it alive, through any relay
                close_timeout=2.0,
                **({} if env_proxy else {"proxy": None}),
            )
        except TimeoutError:
            if attempt == OPEN_TRIES:
                raise
            log.info("the relay at %s did not answer the opening within %.0f s: trying again", shown(url), open_timeout)
    raise AssertionError("unreachable")


def shown(url: str) -> str:
    """``url`` as it may be logged or shown: without its query (a relay's URL may carry an access token there)."""
    return urllib.parse.urlsplit(url)._replace(query="", fragment="").geturl()
