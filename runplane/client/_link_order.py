"""The receiving half of a session's Link (runplane.client._link): the peer's numbered frames put
back in seq order, handed on one at a time by ``recv``, and the ACK that what was taken owes."""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable

from runplane.domain.session_wire import (
    ACK_BYTES,
    ACK_FRAMES,
    HEADER,
    MAX_HELD,
    MAX_PAYLOAD,
    Frame,
    FrameType,
    ack,
    next_seq,
    seq_ahead,
)

TICK_SECONDS = 0.2
"""How often the reading thread looks at its timers (an idle ACK, HELLO again, a gap, a ping)."""
ACK_DELAY = 0.05
"""How long a reader that took frames waits for more before it acks them."""


class SessionLost(Exception):
    """The session ended before its command did: ``reason`` is the GONE frame's (``client_gone``,
    ``worker_gone``, ``run_ended``, ``closed``, ...) or ``relay_lost`` when the relay connection
    broke or fell silent."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def size_of(frame: Frame) -> int:
    return HEADER.size + len(frame.payload)


class Refused(Exception):
    """What a link's ``redial`` raises when the session cannot be rejoined (it is over): the loss is final."""


class Inbound:
    """The peer's frames, for a Link (which owns the state below and says how to lose the link)."""

    clock: Callable[[], float]
    window: int
    bytes_in: int
    _cond: threading.Condition
    _acks: bool
    _sequenced: bool
    _ready: deque[Frame]
    _ready_bytes: int
    _held: dict[int, Frame]
    _held_bytes: int
    _gap_since: float | None
    _expected: int
    _delivered: int  # the last seq put in order (what a HELLO that resumes says)
    _over: bool  # an EXIT or a GONE came: a drop from now on is final
    _taken: int
    _acked: int
    _unacked_in: int
    _unacked_in_frames: int
    _ack_due: float | None

    def _check(self) -> None:
        raise NotImplementedError

    def _lose(self, why: str) -> SessionLost:
        raise NotImplementedError

    def _say(self, frame: Frame) -> None:
        raise NotImplementedError

    def recv(self, timeout: float | None = None) -> Frame | None:
        """The peer's next frame (a GONE as any other; only the peer's first HELLO), or None after
        ``timeout`` seconds. Raises SessionLost once the connection is over and nothing is left."""
        deadline = None if timeout is None else self.clock() + timeout
        with self._cond:
            while not self._ready:
                self._check()
                left = TICK_SECONDS if deadline is None else min(TICK_SECONDS, deadline - self.clock())
                if left <= 0:
                    return None
                self._cond.wait(left)
            frame = self._ready.popleft()
            self._ready_bytes -= size_of(frame)
            if frame.seq and self._sequenced:
                self._taken = frame.seq
                self._unacked_in += size_of(frame)
                self._unacked_in_frames += 1
            owed = self._acks and (self._unacked_in >= ACK_BYTES or self._unacked_in_frames >= ACK_FRAMES)
            if self._acks and self._taken != self._acked and self._ack_due is None:
                self._ack_due = self.clock() + ACK_DELAY
            self._cond.notify_all()
        if frame.type == FrameType.DATA:
            self.bytes_in += len(frame.payload)
        if owed:
            with contextlib.suppress(SessionLost):  # the next recv says so
                self._ack()
        return frame

    def _ack(self) -> None:
        self._say(ack(self._acking()))

    def _acking(self) -> int:
        """The seq to ack now: what was taken, counted as acked from here."""
        with self._cond:
            taken, self._acked, self._ack_due = self._taken, self._taken, None
            self._unacked_in = self._unacked_in_frames = 0
        return taken

    def _order(self, frame: Frame) -> None:
        """With ``_cond`` held: ``frame`` of a numbering peer, handed on in seq order."""
        if seq_ahead(frame.seq, self._expected) < 0 or frame.seq in self._held:
            return  # a copy of one handed on, or held, already
        self._held[frame.seq] = frame
        self._held_bytes += size_of(frame)
        came = False
        while (next_one := self._held.pop(self._expected, None)) is not None:
            self._held_bytes -= size_of(next_one)
            self._expected = next_seq(self._expected)
            self._delivered = next_one.seq
            self._ready_now(next_one)
            came = True
        if not self._held:
            self._gap_since = None
        elif came or self._gap_since is None:  # the gap is the one before the frame now expected
            self._gap_since = self.clock()
        self._bound(len(self._held), self._held_bytes)

    def _bound(self, frames: int, size: int) -> None:
        if frames > MAX_HELD or size > self.window + 4 * MAX_PAYLOAD:  # a window, and what may pass it
            raise self._lose(f"the relay lost a frame: {frames} frames came after it")

    def _ready_now(self, frame: Frame) -> None:
        self._over = self._over or frame.type in (FrameType.EXIT, FrameType.GONE)
        self._ready.append(frame)
        self._ready_bytes += size_of(frame)
        if self._acks and self._ready_bytes > 4 * self.window:
            raise self._lose("the peer sent far past its window")
        self._cond.notify_all()
