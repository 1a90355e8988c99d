"""One side's connection to a session's relay, the client's and the worker's alike: frames out
(numbered, cut to the relay's ``max_frame``, in its ``encoding``) and frames in, put back in order,
acked and handed on one at a time, with the meeting, the flow control and the keepalive of
runplane.domain.session_wire (its docstring says the rules).

A thread of the link's own reads the relay all the time: it answers PING, takes ACK (which is what
lets a waiting sender go on), says HELLO again until the peer's came, sends the ACK an idle reader
owes, and puts the peer's frames in order for ``recv``. What it holds is bounded by the peer's
window (a peer that acks) or by a pause in reading (an older peer: its relay's TCP backpressure
then slows that peer down). It sends a PING after ``PING_SECONDS`` of saying nothing and calls
the peer gone after ``SILENT_SECONDS`` of hearing nothing.

What the thread sends (PONG, ACK, HELLO again) waits behind a send in progress: a path of its own
would not help, as websockets' connection writes under a lock that its own reading takes too. A
send stuck for good would need the relay to stop reading this side while both sides' numbered frames
in flight stay within the window (bytes and frames) each way, which the relays' buffers hold (a
gateway takes every message at once); a side that hangs up cuts a stuck send off (``close``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from runplane.client._link_order import TICK_SECONDS, Inbound, Refused, SessionLost, size_of
from runplane.domain.session_wire import (
    GAP_SECONDS,
    HELLO_SECONDS,
    MAX_PAYLOAD,
    PROTOCOL_VERSION,
    UNNUMBERED,
    WINDOW,
    WINDOW_FRAMES,
    BadFrame,
    Frame,
    FrameType,
    Sequencer,
    ack,
    decode,
    frame_bytes,
    json_frame,
    message,
    no_frame,
    ping,
    read_ack,
    seq_ahead,
)
from runplane.domain.sessions import BINARY

log = logging.getLogger(__name__)

PING_SECONDS = 30.0
SILENT_SECONDS = 90.0  # a peer (or relay) that sent nothing for this long is gone
SEND_LOCK_SECONDS = 2.0  # how long hanging up waits for a send in progress before it drops the connection
GRACE = 60.0  # how long a link that lost its connection tries to get its peer back (``redial``)
REDIAL_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0)  # the waits between tries to dial again (the last one again and again)
RESUMABLE = frozenset({"client_gone", "worker_gone", "relay_lost", "peer_absent"})  # a relay's GONE: a drop
LINGER_SECONDS = 2.0
"""How long hanging up waits for a peer that acks to take what was sent (a relay that may reorder
could otherwise pass the hang-up on before the last frames: an EXIT, the last output)."""


class Link(Inbound):
    """``conn`` (a websockets sync connection, or anything with its ``send``, ``recv(timeout)`` and
    ``close``), spoken per ``encoding`` with frames of at most ``max_frame`` payload bytes. ``send``
    may be called from any thread, ``recv`` from one. Raises SessionLost (``relay_lost``) once the
    connection is over. With ``redial`` (a new connection to the relay, raising Refused once the
    session is over), a connection that drops is dialled again for up to ``grace`` seconds and the
    peer's HELLO resumes where it was (session_wire's docstring: Resuming)."""

    def __init__(
        self,
        conn: Any,
        max_frame: int = MAX_PAYLOAD,
        *,
        encoding: str = BINARY,
        clock: Callable[[], float] = time.monotonic,
        window: int = WINDOW,
        redial: Callable[[], Any] | None = None,
        grace: float = GRACE,
    ) -> None:
        self.conn = conn
        self.max_frame = max(1, min(max_frame, MAX_PAYLOAD))
        self.encoding = encoding
        self.clock = clock
        self.window = window
        self.redial = redial
        self.grace = grace
        self.bytes_out = 0  # DATA payload bytes sent, and taken
        self.bytes_in = 0
        self.closed = threading.Event()
        self.peer_hello: dict[str, Any] | None = None
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._seq = Sequencer()
        self._hello: dict[str, Any] | None = None  # what this side says in its HELLO
        self._hello_at = 0.0
        self._hello_every = HELLO_SECONDS  # doubled each time it is said again, up to 8 times
        self._sequenced = False  # the peer numbers from 1 after its HELLO (it says ``seen``)
        self._acks = False  # the peer acks, and takes ACK
        self._lost: SessionLost | None = None
        self._closing = False  # close() began: nothing more is sent, what comes is still handed on
        self._resuming = False  # the connection dropped: dialled again, until the peer's HELLO resumes
        self._resume_until = 0.0
        self._down = False  # a send found the connection gone: the reading thread dials again
        self._redialled = False  # a connection dropped once: each HELLO says ``resume``
        self._peer_resumed = False  # the peer's connection dropped once: each HELLO says ``resume`` too
        # the peer's frames
        self._ready: deque[Frame] = deque()
        self._ready_bytes = 0
        self._early: list[Frame] = []  # numbered frames that came before the peer's HELLO
        self._held: dict[int, Frame] = {}
        self._held_bytes = 0
        self._gap_since: float | None = None
        self._expected = 1
        self._delivered = 0
        self._over = False
        self._taken = 0  # the last seq handed on
        self._acked = 0  # the last seq acked to the peer
        self._unacked_in = 0
        self._unacked_in_frames = 0
        self._ack_due: float | None = None
        # this side's frames
        self._unacked: deque[tuple[int, int, Frame]] = deque()  # kept until acked: sent again on resuming
        self._unacked_out = 0  # bytes of the frames in _unacked, and of those about to be numbered
        self._unacked_frames = 0
        self._heard = self._said = clock()
        self._reader = threading.Thread(target=self._read, name="session-link", daemon=True)
        self._reader.start()

    # -- out --------------------------------------------------------------------------------

    def send(self, frame: Frame) -> None:
        """Send ``frame``: a HELLO as this side's (its ``seen`` and ``acks`` added here), any other
        numbered here (DATA cut to ``max_frame``), once the peer's HELLO came; DATA waits while the
        peer has more than the window not acked. Raises SessionLost."""
        if frame.type in (FrameType.EXIT, FrameType.GONE):
            with self._cond:
                self._over = True  # the session's end: a drop from now on is final
                self._cond.notify_all()
                if self._resuming and frame.type == FrameType.GONE:
                    return  # no connection carries it: the dialling again ends instead (the peer's is refused)
        if frame.type == FrameType.HELLO:
            self._say_hello(frame)
        elif frame.type in UNNUMBERED:
            self._put(frame)
        elif frame.type == FrameType.DATA and len(frame.payload) > self.max_frame:
            for i in range(0, len(frame.payload), self.max_frame):
                self._numbered(Frame(frame.type, frame.channel, 0, frame.payload[i : i + self.max_frame]))
        else:
            self._numbered(frame)

    def _say_hello(self, frame: Frame) -> None:
        try:
            said = frame.json()
        except BadFrame:
            said = {}
        with self._cond:
            self._hello = {"v": PROTOCOL_VERSION, **said, "acks": True}
            if self.redial is not None:
                self._hello["resumes"] = True
        self._hello_again()

    def _hello_again(self) -> None:
        with self._cond:
            if self._hello is None:
                return
            hello = {**self._hello, "seen": self.peer_hello is not None and not self._resuming}
            if self._redialled or self._peer_resumed:  # a peer whose connection alone dropped needs it too
                hello["resume"] = self._delivered
            self._hello_at = self.clock()
        self._say(json_frame(FrameType.HELLO, hello))

    def _numbered(self, frame: Frame) -> None:
        size = size_of(frame)
        with self._cond:
            while self._lost is None and not self._closing and self._meeting() and frame.type != FrameType.GONE:
                self._cond.wait(TICK_SECONDS)
            if self.peer_hello is None:  # a GONE before the peer came: outside the numbering
                self._check()
                self._put(Frame(frame.type, frame.channel, 0, frame.payload))
                return
            held_back = frame.type == FrameType.DATA and self._acks
            while self._lost is None and not self._closing and held_back and self._full():
                self._cond.wait(TICK_SECONDS)
            self._refuse_if_closing()
            reserved = self._acks  # in the window from now on: another sender waits for it too
            if reserved:
                self._unacked_out += size
                self._unacked_frames += 1
        try:
            with self._send_lock:
                with self._cond:
                    self._refuse_if_closing()  # close() may have begun while this waited for the lock
                    sent = Frame(frame.type, frame.channel, self._seq.next(), frame.payload)
                    if reserved:
                        self._unacked.append((sent.seq, size, sent))
                        reserved = False
                # numbered and sent even if close() begins now: close() waits for its ack
                self._write(sent, own=True)
        finally:
            if reserved:  # refused before it was numbered
                with self._cond:
                    self._unacked_out -= size
                    self._unacked_frames -= 1
                    self._cond.notify_all()
        if frame.type == FrameType.DATA:
            self.bytes_out += len(frame.payload)

    def _meeting(self) -> bool:  # with _cond held: numbered frames wait for the peer's HELLO
        return self.peer_hello is None or self._resuming

    def _full(self) -> bool:  # with _cond held: the peer has too much not acked
        return self._unacked_out > self.window or self._unacked_frames >= WINDOW_FRAMES

    def _refuse_if_closing(self) -> None:
        """With ``_cond`` held: raise SessionLost once the link is over or close() began."""
        self._check()
        if self._closing:
            raise SessionLost("relay_lost", "the session's link was closed")

    def _put(self, frame: Frame, own: bool = False) -> None:
        with self._send_lock:
            self._write(frame, own)

    def _say(self, frame: Frame) -> None:
        """What the link says of itself (PING, PONG, ACK, HELLO again): said while it closes too."""
        self._put(frame, own=True)

    def _write(self, frame: Frame, own: bool = False) -> None:
        from websockets.exceptions import ConnectionClosed

        self._check()
        if self._closing and not own:
            raise SessionLost("relay_lost", "the session's link was closed")
        try:
            self.conn.send(message(frame, self.encoding))
        except (ConnectionClosed, OSError):
            if not self._resumable():
                raise self._lose("the connection to the session's relay was lost") from None
            self._down = True  # a numbered frame is kept until acked: the reading thread dials again
            return
        self._said = self.clock()

    # -- in ---------------------------------------------------------------------------------

    def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            while not self.closed.is_set():
                if self._down:
                    self._dropped("the connection to the session's relay was lost")
                self._tick()
                with self._cond:
                    paused = not self._acks and self._ready_bytes > self.window
                    if paused:  # an older peer: let its relay's backpressure slow it down
                        self._cond.wait(TICK_SECONDS)
                if paused:
                    continue
                try:
                    data = self.conn.recv(timeout=TICK_SECONDS)
                except TimeoutError:
                    continue
                except ConnectionClosed:
                    self._dropped("the connection to the session's relay was lost")
                    continue
                self._heard = self.clock()
                try:
                    frame = decode(frame_bytes(data, self.encoding))
                except BadFrame as e:
                    raise self._lose(no_frame(data, e)) from None
                self._take(frame)
        except SessionLost:
            pass
        except Exception:  # the link ends, never silently stuck
            log.exception("a session's link failed")
            self._lose("the session's link failed")

    def _tick(self) -> None:
        now = self.clock()
        if now - self._heard >= SILENT_SECONDS:
            raise self._lose(f"nothing came from the session for {SILENT_SECONDS:.0f} s")
        if now - self._said >= PING_SECONDS:
            self._say(ping(int(time.time() * 1000)))
        with self._cond:
            if self._resuming and now >= self._resume_until:
                raise self._lose(self._gave_up("the peer did not come back"))
            hello = self._hello is not None and self._meeting() and now - self._hello_at >= self._hello_every
            if hello:
                self._hello_every = min(2 * self._hello_every, 8 * HELLO_SECONDS)
            owed = self._ack_due is not None and now >= self._ack_due
            gap = self._gap_since is not None and now - self._gap_since >= GAP_SECONDS and not self._resuming
        if gap:
            raise self._lose(f"a frame the relay lost held the session's others for {GAP_SECONDS:.0f} s")
        if hello:
            self._hello_again()
        if owed:
            self._ack()

    def _take(self, frame: Frame) -> None:
        kind = frame.type
        if kind == FrameType.PING:
            self._say(Frame(FrameType.PONG, 0, 0, frame.payload))
        elif kind == FrameType.ACK:
            with self._cond:
                self._acked_to(read_ack(frame))
        elif kind == FrameType.HELLO:
            self._peer_says_hello(frame)
        elif kind == FrameType.PONG:
            pass
        elif kind == FrameType.GONE and frame.seq == 0 and self._resumable() and _reason(frame) in RESUMABLE:
            self._dropped(f"the relay said {_reason(frame)}")
        else:
            if frame.seq == 0 and kind != FrameType.GONE and (self._sequenced or self.peer_hello is None):
                raise self._lose(f"the relay sent a {kind.name} frame outside the numbering")
            with self._cond:
                if frame.seq == 0 or (self.peer_hello is not None and not self._sequenced):
                    self._ready_now(frame)  # a relay's GONE, or an older peer's frame: as it comes
                elif self.peer_hello is None:
                    self._early.append(frame)
                    self._bound(len(self._early), sum(map(size_of, self._early)))
                else:
                    self._order(frame)

    def _peer_says_hello(self, frame: Frame) -> None:
        try:
            said = frame.json()
        except BadFrame as e:
            raise self._lose(f"the peer's HELLO is not one: {e}") from None
        with self._cond:
            first = self.peer_hello is None
            if first:
                self.peer_hello = said
                self._sequenced = "seen" in said
                self._acks = said.get("acks") is True
                self._ready_now(frame)
                early, self._early = self._early, []
                for each in early:
                    if self._sequenced:
                        self._order(each)
                    else:
                        self._ready_now(each)
            resume = said.get("resume")
            resumed = not first and self._acks and isinstance(resume, int) and not isinstance(resume, bool)
            self._peer_resumed = self._peer_resumed or (resumed and self.redial is not None)
        if resumed:
            self._resume(int(str(resume)), again=said.get("seen") is False)
        if said.get("seen") is False:
            self._hello_again()  # the peer has not had this side's HELLO: it may have been lost

    def _acked_to(self, seq: int) -> None:  # with _cond held
        while self._unacked and seq_ahead(self._unacked[0][0], seq) <= 0:
            self._unacked_out -= self._unacked.popleft()[1]
            self._unacked_frames -= 1
        self._cond.notify_all()

    # -- resuming ---------------------------------------------------------------------------

    def _resumable(self) -> bool:
        """Whether a dropped connection is dialled again: this side can, the peer met it and resumes
        too, and neither the session's end (an EXIT, a final GONE) nor the hang-up came."""
        peer = self.peer_hello
        return (
            self.redial is not None
            and self._acks
            and peer is not None
            and peer.get("resumes") is True
            and not self._closing
            and not self._over
            and self._lost is None
        )

    def _dropped(self, why: str) -> None:
        """On the reading thread: the connection is over (``why``): dial again, or the link is lost."""
        if not self._resumable():
            raise self._lose(why)
        assert self.redial is not None
        with self._cond:
            self._redialled = True
            if not self._resuming:
                self._resuming = True
                self._resume_until = self.clock() + self.grace
            self._gap_since = None
        log.info("a session's connection dropped (%s): dialling again", why)
        with self._send_lock:  # what is sent meanwhile waits for the new connection
            with contextlib.suppress(Exception):
                self.conn.close()
            delays = iter(REDIAL_DELAYS)
            while True:
                if self._ended():
                    raise self._lose("the session's link was closed")
                try:
                    conn = self.redial()
                except Refused as e:
                    raise self._lose(f"the connection to the session's relay was lost: {e}") from None
                except Exception as e:  # tried again until the grace is over
                    why = str(e) or type(e).__name__
                else:
                    if not self._ended():
                        break
                    with contextlib.suppress(Exception):  # hung up meanwhile: the new connection is not left open
                        conn.close()
                    continue
                left = self._resume_until - self.clock()
                if left <= 0:
                    raise self._lose(self._gave_up(why)) from None
                with self._cond:
                    self._cond.wait_for(self._ended, min(next(delays, REDIAL_DELAYS[-1]), left))
            self.conn = conn
            self._down = False
            self._heard = self._said = self.clock()
        with self._cond:
            self._hello_every = HELLO_SECONDS
        self._hello_again()

    def _ended(self) -> bool:  # dialling again stops: the hang-up, the session's end, or the link lost
        return self._closing or self._over or self._lost is not None

    def _gave_up(self, why: str) -> str:
        return f"the connection to the session's relay was lost, and reconnecting for {self.grace:.0f} s failed: {why}"

    def _resume(self, delivered: int, *, again: bool) -> None:
        """The peer's HELLO after a drop: it has every frame up to ``delivered``; what this side
        kept after it is sent again (``again``: the peer is new to this side's connection, or this
        side is resuming), in order, before any new one."""
        with self._send_lock:
            with self._cond:
                self._acked_to(delivered)
                kept = [sent for _, _, sent in self._unacked] if again or self._resuming else []
                self._resuming = False
                self._hello_every = HELLO_SECONDS
            for sent in kept:
                self._write(sent, own=True)
        if kept:
            log.info("a session's connection resumed: %d frames sent again", len(kept))

    # -- the end ----------------------------------------------------------------------------

    def _check(self) -> None:
        if self._lost is not None:
            raise self._lost

    def _lose(self, why: str) -> SessionLost:
        """The link is over (``why``): every wait ends with the SessionLost returned."""
        with self._cond:
            if self._lost is None:
                self._lost = SessionLost("relay_lost", why)
            self._cond.notify_all()
            lost = self._lost
        self.closed.set()
        return lost

    def close(self) -> None:
        """Hang up (quiet if already closed): nothing more is sent (a send stuck on a peer that
        reads nothing is cut off), what was sent is given LINGER_SECONDS to be acked (a peer that
        acks), and what comes until the connection's close is still handed on."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            owed = self._acks and self._taken != self._acked and self._lost is None and not self._resuming
        if owed and self._send_lock.acquire(timeout=SEND_LOCK_SECONDS):
            try:  # what this side took, acked at once: the peer may be waiting to hang up
                with contextlib.suppress(SessionLost):
                    self._write(ack(self._acking()), own=True)
            finally:
                self._send_lock.release()
        with self._cond:
            until = self.clock() + LINGER_SECONDS
            while self._lost is None and self._unacked and not self._resuming and (left := until - self.clock()) > 0:
                self._cond.wait(min(left, TICK_SECONDS))
        if self._send_lock.acquire(timeout=SEND_LOCK_SECONDS):
            self._send_lock.release()
        else:
            self.abort()
        with contextlib.suppress(Exception):  # hanging up must not fail: the connection is gone either way
            self.conn.close()
        self._lose("the session's link was closed")
        if self._reader is not threading.current_thread():
            self._reader.join(timeout=SEND_LOCK_SECONDS + 1)

    def abort(self) -> None:
        """Drop the connection at once (a blocked send or receive returns)."""
        sock = getattr(self.conn, "socket", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(2)


def _reason(frame: Frame) -> str:
    try:
        return str(frame.json().get("reason") or "")
    except BadFrame:
        return ""
