"""One cloud's half of the local stack: the storage services, and how its functions are called."""

from __future__ import annotations

import abc
import threading
from dataclasses import dataclass
from typing import BinaryIO

from runplane.bootstrap import Stack
from runplane.settings import StackSettings


@dataclass(frozen=True)
class FrontRequest:
    """An HTTP request as the local front read it; ``path`` and ``query`` are still encoded.
    ``stream``, when there is one, is where the body is still to be read from (a PUT of an object
    URL, whose body can be larger than any other request's), and ``body`` is empty."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    client_ip: str
    host: str
    stream: BinaryIO | None = None


@dataclass(frozen=True)
class FrontResponse:
    """An answer for the front to write. ``file``, when there is one, is the body instead of
    ``body``: an open file (an object behind a signed URL), sent from where it is to its end in
    chunks, then closed by the front, as it would be of a HEAD."""

    status: int
    headers: dict[str, str]
    body: bytes
    file: BinaryIO | None = None


class Cloud(abc.ABC):
    """What the local stack needs from a cloud. ``start`` comes first, then ``build`` with the
    stack's settings (``settings()`` among them), then ``provision``; the other calls may then come
    from any thread."""

    services: str
    """What serves the stores, for people: "moto", "azurite"."""
    endpoint: str = ""
    public_url: str = ""
    """Where the stack's front is reached, set before ``start``."""

    @abc.abstractmethod
    def start(self) -> dict[str, str]:
        """Start (or reach) the storage services; returns what the processes of the stack (agents,
        functions of their own) need in their environment besides the stack's settings (credentials,
        the functions' app settings). Raises ValueError when they cannot be had."""

    @abc.abstractmethod
    def settings(self) -> dict[str, str]:
        """The stack settings (``StackSettings`` fields) that point at the started services."""

    @abc.abstractmethod
    def build(self, settings: StackSettings) -> Stack:
        """The stack of ``settings`` on these services, for this process."""

    @abc.abstractmethod
    def provision(self, stack: Stack) -> None:
        """Create the tables, queues and containers of ``stack`` (kept when they exist)."""

    @abc.abstractmethod
    def http(self, request: FrontRequest) -> FrontResponse:
        """Serve one request with the cloud's HTTP function, as its front door would."""

    @abc.abstractmethod
    def poll_events(self, stop: threading.Event) -> None:
        """One round of feeding the events queue to the dispatcher function, as the platform's
        trigger does; when the queue is empty it waits about a second at most (or until stop)."""

    @abc.abstractmethod
    def fire_schedule(self) -> None:
        """Call the scheduled functions (dispatcher, reaper) once; failures are logged."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop what ``start`` started."""
