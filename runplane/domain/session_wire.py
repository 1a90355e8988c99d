"""The frames a session's two sides exchange through the relay: one frame per WebSocket message.

A frame is a 7-byte header, ``type`` (u8), ``channel`` (u16) and ``seq`` (u32, big-endian), then its
payload. A relay carries it as a binary message of its bytes, or, where the relay's endpoint says
``encoding: base64`` (gateways that refuse binary messages), as a text message of their base64
(``message`` and ``frame_bytes``). Channels: 0 the session itself, 1 stdin, 2 stdout, 3 stderr, and
from 16 the connections of a port-forward (the client picks even numbers). A run's bytes only ever
travel as DATA payload: nothing a run writes can be read as a frame of another type.

=========  =====================================================================
type       payload
=========  =====================================================================
HELLO      JSON ``{"v": 1, "side", "seen", "acks", "resumes"?, "resume"?, "rows"?, "cols"?}``
DATA       bytes of ``channel`` (at most the relay's ``max_frame``)
EOF        none: ``channel`` ends (stdin's end is the command's end of input)
RESIZE     ``rows`` u16, ``cols`` u16 (a terminal's new size)
SIGNAL     ``signo`` u8 (to the command, sessions without a terminal)
OPEN       JSON ``{"port"}``: a new connection on ``channel`` (port-forward)
OPEN_OK    none
OPEN_FAIL  JSON ``{"reason"}``
CLOSE      none: ``channel``'s connection is reset
EXIT       JSON ``{"code", "reason"?}``: after every DATA of the command
PING/PONG  ``t`` u64 (milliseconds): keepalive
GONE       JSON ``{"reason"}``: the session ends (the peer went, the run ended, it was closed)
ACK        ``seq`` u32: every frame of the peer up to ``seq`` was taken by this side
=========  =====================================================================

Meeting. A relay may lose what a side sends before its peer is connected (a gateway's), so HELLO,
like PING, PONG and ACK, is outside the numbering (``seq`` 0) and may be lost or come twice. A
HELLO says ``seen``: whether its sender has had the peer's HELLO; a side that gets one with
``seen: false`` answers with its own (``seen: true``); a side says its HELLO again after
``HELLO_SECONDS``, then twice as long each time (up to 8 times as long), until it has the peer's.
Nothing but HELLO, PING and PONG is sent before the peer's HELLO came (a GONE then goes
unnumbered). A HELLO without ``seen`` is an older peer's: it numbers every
frame but PING and PONG, and its relay keeps the order.

Order. Every other frame a side sends after its HELLO is numbered from 1 (one count per
direction). A receiver hands them on in ``seq`` order, holding early ones (at most ``WINDOW``
bytes and ``MAX_HELD`` frames); a gap that outlasts that, or ``GAP_SECONDS`` (counted from when
the frame now missing became the next one), ends the session (``relay_lost``). Seqs run from 1 to
2**32 - 1 and then from 1 again: their order is that of serial numbers (RFC 1982, ``seq_ahead``).
Only a GONE (a relay's own, or a side's before it had its peer's HELLO) comes with ``seq`` 0 and is
taken as it comes; any other numbered type with ``seq`` 0 (but from an older peer) ends the session.

Flow. With a peer whose HELLO says ``acks: true``, a side sends ACK with the last ``seq`` it took
(handed on to the command, the terminal or the connection) every ``ACK_BYTES`` taken and when it
has taken something not yet acked and idles, and every ``ACK_FRAMES`` frames; a sender of DATA
waits while more than ``WINDOW`` bytes of its numbered frames (header and payload), or
``WINDOW_FRAMES`` of them, are not acked. So a slow reader slows its peer down
through any relay, and what a side holds stays bounded; a side that hangs up gives what it sent a
moment to be acked first, so that a relay that reorders does not pass the hang-up on before it
(the last output, the EXIT). With an older peer neither side acks and the one-machine relay's own
backpressure (TCP) does it.

Resuming. A relay ends both connections of a session when one drops (the peer gets GONE
``client_gone``, ``worker_gone``, ``relay_lost`` or ``peer_absent``, or its connection just closes);
a gateway also closes every connection after 2 hours. A side whose HELLO says ``resumes: true``
(it can dial again) keeps every numbered frame it sent until it is acked (so at most the window),
and when its peer's HELLO said ``resumes: true`` too, such a loss is not the session's end: the
side dials again (a fresh ticket; the worker writes a new secret's hash into the session) for up to
``GRACE`` seconds, then says HELLO with ``resume``: the last ``seq`` of the peer's it put in order
(each HELLO it says from then on says it). A side that gets a HELLO with ``resume`` from the peer
it met counts everything up to it as acked and, when it is dialling again itself or the HELLO says
``seen: false``, sends its kept frames after it again, in order, with their seqs, before any new
one; a receiver drops the copies it already had. Numbering, acks and the window carry on. Final,
as before: a GONE ``closed``, ``run_ended``, ``too_fast``, ``replaced``; any loss once an EXIT or
a GONE was sent or taken, or once the side hung up; any loss with a peer that does not resume.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from runplane.domain.sessions import BASE64

HEADER = struct.Struct(">BHI")
MAX_PAYLOAD = 64 * 1024
"""The most payload bytes one frame carries (a relay may allow fewer: its ``max_frame``)."""
MAX_JSON = 4096
ERROR_CHARS = 200
"""How much of a relay's error text a side quotes when it ends the session on it (``no_frame``)."""
STDIN, STDOUT, STDERR = 1, 2, 3
FIRST_PORT_CHANNEL = 16
MAX_CHANNEL = 0xFFFF
PROTOCOL_VERSION = 1
WINDOW = 1024 * 1024
"""The most bytes of numbered frames a side has sent and its peer not acked (peers that ack)."""
ACK_BYTES = 256 * 1024
"""A receiver acks at least every this many bytes it took."""
MAX_HELD = 1024
"""The most frames a receiver holds that came before one missing."""
WINDOW_FRAMES = MAX_HELD // 2
"""The most numbered frames a side has sent and its peer not acked (peers that ack): what the
window's bytes allow of small frames stays within what a receiver holds."""
ACK_FRAMES = WINDOW_FRAMES // 4
"""A receiver acks at least every this many frames it took."""
SEQ_SPAN = 0xFFFFFFFF
"""How many seqs there are: 1 to 2**32 - 1, then 1 again (0 is outside the numbering)."""
GAP_SECONDS = 30.0
"""How long a missing frame may keep the ones after it waiting."""
HELLO_SECONDS = 1.0
"""How soon a side says HELLO again while it has not had its peer's (then twice as long each time)."""


class FrameType(IntEnum):
    HELLO = 1
    DATA = 2
    EOF = 3
    RESIZE = 4
    SIGNAL = 5
    OPEN = 6
    OPEN_OK = 7
    OPEN_FAIL = 8
    CLOSE = 9
    EXIT = 10
    PING = 11
    PONG = 12
    GONE = 13
    ACK = 14


UNNUMBERED = frozenset({FrameType.HELLO, FrameType.PING, FrameType.PONG, FrameType.ACK})
"""The frames that carry ``seq`` 0 (from a peer that says ``seen`` in its HELLO)."""


_JSON_TYPES = {FrameType.HELLO, FrameType.OPEN, FrameType.OPEN_FAIL, FrameType.EXIT, FrameType.GONE}


class BadFrame(ValueError):
    """Bytes that are not a frame (a side that sends one is disconnected)."""


@dataclass(frozen=True)
class Frame:
    type: FrameType
    channel: int = 0
    seq: int = 0
    payload: bytes = b""

    def encode(self) -> bytes:
        if len(self.payload) > MAX_PAYLOAD:
            raise BadFrame(f"a frame carries at most {MAX_PAYLOAD} bytes")
        return HEADER.pack(int(self.type), self.channel, self.seq) + self.payload

    def json(self) -> dict[str, Any]:
        """The payload of a JSON frame, read strictly as an object (BadFrame otherwise)."""
        if self.type not in _JSON_TYPES:
            raise BadFrame(f"a {self.type.name} frame holds no JSON")
        try:
            data = json.loads(self.payload)
        except ValueError as e:
            raise BadFrame(f"a {self.type.name} frame's payload is not JSON") from e
        if not isinstance(data, dict):
            raise BadFrame(f"a {self.type.name} frame's payload is not an object")
        return data


def decode(data: bytes) -> Frame:
    """One frame from one message. Raises BadFrame."""
    if len(data) < HEADER.size:
        raise BadFrame("a frame is at least its header")
    kind, channel, seq = HEADER.unpack_from(data)
    try:
        frame_type = FrameType(kind)
    except ValueError as e:
        raise BadFrame(f"no frame type {kind}") from e
    payload = bytes(data[HEADER.size :])
    if len(payload) > MAX_PAYLOAD:
        raise BadFrame(f"a frame carries at most {MAX_PAYLOAD} bytes")
    if frame_type in _JSON_TYPES and len(payload) > MAX_JSON:
        raise BadFrame(f"a {frame_type.name} frame carries at most {MAX_JSON} bytes")
    if frame_type == FrameType.RESIZE and len(payload) != 4:
        raise BadFrame("a RESIZE frame is rows and cols, two bytes each")
    if frame_type == FrameType.SIGNAL and len(payload) != 1:
        raise BadFrame("a SIGNAL frame is one byte")
    if frame_type in (FrameType.PING, FrameType.PONG) and len(payload) != 8:
        raise BadFrame(f"a {frame_type.name} frame is eight bytes")
    if frame_type == FrameType.ACK and len(payload) != 4:
        raise BadFrame("an ACK frame is a seq, four bytes")
    return Frame(frame_type, channel, seq, payload)


def json_frame(frame_type: FrameType, data: dict[str, Any], channel: int = 0, seq: int = 0) -> Frame:
    payload = json.dumps(data, separators=(",", ":")).encode()
    if len(payload) > MAX_JSON:
        raise BadFrame(f"a {frame_type.name} frame carries at most {MAX_JSON} bytes")
    return Frame(frame_type, channel, seq, payload)


def resize(rows: int, cols: int, seq: int = 0) -> Frame:
    return Frame(FrameType.RESIZE, 0, seq, struct.pack(">HH", min(max(rows, 1), 0xFFFF), min(max(cols, 1), 0xFFFF)))


def read_resize(frame: Frame) -> tuple[int, int]:
    rows, cols = struct.unpack(">HH", frame.payload)
    return rows, cols


def signal_frame(signo: int, seq: int = 0) -> Frame:
    if not 1 <= signo <= 64:
        raise BadFrame("a signal is 1 to 64")
    return Frame(FrameType.SIGNAL, 0, seq, bytes([signo]))


def ping(millis: int, pong: bool = False) -> Frame:
    return Frame(FrameType.PONG if pong else FrameType.PING, 0, 0, struct.pack(">Q", millis & (2**64 - 1)))


def ack(seq: int) -> Frame:
    return Frame(FrameType.ACK, 0, 0, struct.pack(">I", seq & 0xFFFFFFFF))


def read_ack(frame: Frame) -> int:
    return int(struct.unpack(">I", frame.payload)[0])


def message(frame: Frame, encoding: str) -> bytes | str:
    """``frame`` as the WebSocket message a relay of ``encoding`` carries."""
    data = frame.encode()
    return base64.b64encode(data).decode("ascii") if encoding == BASE64 else data


def frame_bytes(message: bytes | str, encoding: str) -> bytes:
    """A frame's bytes from a relay's WebSocket message (a binary message, or base64 text where
    ``encoding`` says so). Raises BadFrame for the other kind of message, or text that is no base64."""
    if encoding == BASE64:
        if not isinstance(message, str):
            raise BadFrame("this relay carries frames as base64 text, not binary messages")
        try:
            return base64.b64decode(message.encode("ascii"), validate=True)
        except (ValueError, binascii.Error) as e:
            raise BadFrame("a text message that is not base64") from e
    if isinstance(message, str):
        raise BadFrame("this relay carries frames as binary messages, not text")
    return bytes(message)


def no_frame(message: object, error: BadFrame) -> str:
    """Why ``message`` (no frame: ``error``) ends a side's link. A gateway's own answer (its JSON
    error text, where frames travel as text) is quoted, clipped, without its control characters."""
    if isinstance(message, str) and message.lstrip().startswith("{"):
        text = message.strip()
        said = "".join(c if c.isprintable() else " " for c in text[:ERROR_CHARS])
        return f"the relay answered with an error instead of a frame: {said}{'...' if len(text) > ERROR_CHARS else ''}"
    return f"the relay sent what is no frame: {error}"


def max_message(encoding: str) -> int:
    """The largest WebSocket message a frame makes through a relay of ``encoding``."""
    size = MAX_PAYLOAD + HEADER.size
    return 4 * ((size + 2) // 3) if encoding == BASE64 else size


def chunks(channel: int, data: bytes, max_payload: int = MAX_PAYLOAD) -> list[bytes]:
    """``data`` of ``channel`` cut into DATA payloads of at most ``max_payload`` bytes."""
    size = max(1, min(max_payload, MAX_PAYLOAD))
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def next_seq(seq: int) -> int:
    """The seq after ``seq`` (after 2**32 - 1 comes 1)."""
    return (seq % SEQ_SPAN) + 1


def seq_ahead(seq: int, of: int) -> int:
    """How far ``seq`` comes after ``of``, read as serial numbers (RFC 1982): 0 when they are the same,
    negative when ``seq`` came before (up to half the seqs either way)."""
    ahead = (seq - of) % SEQ_SPAN
    return ahead - SEQ_SPAN if ahead > SEQ_SPAN // 2 else ahead


class Sequencer:
    """Numbers the frames one side sends, from the one after ``sent``."""

    def __init__(self, sent: int = 0) -> None:
        self.sent = sent

    def next(self) -> int:
        self.sent = next_seq(self.sent)
        return self.sent
