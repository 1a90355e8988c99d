"""The local terminal of an interactive session: raw mode (restored on every way out), its size,
and the signals a session forwards (written as one byte each to a pipe a ``Feeder`` reads)."""

from __future__ import annotations

import contextlib
import os
import signal
import termios
import tty
from collections.abc import Iterator
from types import FrameType


class Detached(Exception):
    """The user left the session (a second ^C, SIGTERM or SIGHUP): exit with ``status``."""

    def __init__(self, status: int) -> None:
        super().__init__(f"detached ({status})")
        self.status = status


def terminal_size(fd: int) -> tuple[int, int] | None:
    """``(rows, cols)`` of the terminal on ``fd``; None when it is not one."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    return size.lines, size.columns


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """The terminal on ``fd`` in raw mode (every key goes to the session as it is typed, ^C
    included), put back as it was however the block is left."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSADRAIN)  # not TCSAFLUSH: what was typed ahead still goes
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def forwarded_signals(control: int, *, terminal: bool) -> Iterator[None]:
    """Signal handlers for a session (main thread only), put back after. With a ``terminal``:
    SIGWINCH is written to ``control`` (a RESIZE), SIGTERM and SIGHUP detach. Without: SIGINT and
    SIGTERM are written to ``control`` (SIGNAL frames to the command); a second ^C detaches (130)."""
    interrupts = 0

    def forward(signo: int, _: FrameType | None) -> None:
        nonlocal interrupts
        if signo == signal.SIGINT:
            interrupts += 1
            if interrupts > 1:
                raise Detached(128 + signo)
        with contextlib.suppress(OSError):
            os.write(control, bytes([signo]))

    def detach(signo: int, _: FrameType | None) -> None:
        raise Detached(128 + signo)

    handlers = {signal.SIGWINCH: forward}
    if terminal:
        handlers |= {signal.SIGTERM: detach, signal.SIGHUP: detach}
    else:
        handlers |= {signal.SIGINT: forward, signal.SIGTERM: forward}
    saved = {signo: signal.signal(signo, handler) for signo, handler in handlers.items()}
    try:
        yield
    finally:
        for signo, handler in saved.items():
            signal.signal(signo, handler)
