"""The frames a session's two sides exchange through the relay: one frame per WebSocket message.

A frame is a 7-byte header, ``type`` (u8), ``channel`` (u16) and ``seq`` (u32, big-endian), then its
payload. ``seq`` numbers the frames a side sends (from 1; PING and PONG carry 0) so that a relay
that may deliver out of order (a gateway's) can be put right by the receiver; the one-machine
relay keeps the order. Channels: 0 the
session itself, 1 stdin, 2 stdout, 3 stderr, and from 16 the connections of a port-forward (the
client picks even numbers). A run's bytes only ever travel as DATA payload: nothing a run writes
can be read as a frame of another type.

=========  =====================================================================
type       payload
=========  =====================================================================
HELLO      JSON ``{"v": 1, "side", "rows"?, "cols"?}``: the first frame of each side
DATA       bytes of ``channel``
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
=========  =====================================================================
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

HEADER = struct.Struct(">BHI")
MAX_PAYLOAD = 64 * 1024
"""The most payload bytes one frame carries (a relay may allow fewer: its ``max_frame``)."""
MAX_JSON = 4096
STDIN, STDOUT, STDERR = 1, 2, 3
FIRST_PORT_CHANNEL = 16
MAX_CHANNEL = 0xFFFF
PROTOCOL_VERSION = 1


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


def chunks(channel: int, data: bytes, max_payload: int = MAX_PAYLOAD) -> list[bytes]:
    """``data`` of ``channel`` cut into DATA payloads of at most ``max_payload`` bytes."""
    size = max(1, min(max_payload, MAX_PAYLOAD))
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


class Sequencer:
    """Numbers the frames one side sends."""

    def __init__(self) -> None:
        self.sent = 0

    def next(self) -> int:
        self.sent = (self.sent % 0xFFFFFFFF) + 1
        return self.sent
