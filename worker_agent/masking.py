"""Secret values out of a run's shipped output: each one, wherever it appears, becomes ``MASK``,
also when a read of the stream ends in the middle of it."""

from __future__ import annotations

from collections.abc import Iterable

from runplane.domain.secrets import MASK, MIN_MASKED_LENGTH

_MASK = MASK.encode()


def masked_patterns(values: Iterable[str]) -> list[bytes]:
    """What is masked for ``values``: each value of at least ``MIN_MASKED_LENGTH`` characters, and
    each line of at least that many of a value of several lines (a key file printed line by line),
    as UTF-8, longest first; blanks around each are left out (what a value read from a file
    ends with)."""
    found: set[str] = set()
    for value in values:
        for line in (value, *value.splitlines()):
            text = line.strip()  # a line of blanks alone would mask every indentation
            if len(text) >= MIN_MASKED_LENGTH:
                found.add(text)
    return sorted((text.encode() for text in found), key=lambda b: (-len(b), b))


def _covered(data: bytes, patterns: list[bytes]) -> list[tuple[int, int]]:
    """The spans of ``data`` that some pattern covers, overlapping occurrences joined, in order."""
    spans: list[tuple[int, int]] = []
    for pattern in patterns:
        at = data.find(pattern)
        while at >= 0:
            spans.append((at, at + len(pattern)))
            at = data.find(pattern, at + 1)
    spans.sort()
    joined: list[tuple[int, int]] = []
    for start, end in spans:
        if joined and start < joined[-1][1]:
            joined[-1] = (joined[-1][0], max(joined[-1][1], end))
        else:
            joined.append((start, end))
    return joined


class Masker:
    """Masks one stream: ``feed`` each read, ``end`` once the stream has ended; each returns what
    may be shipped. Up to ``len(longest pattern) - 1`` bytes of a read are held back until the
    next read (or the end), as they may begin a value the next read completes; the last such
    bytes already shipped are kept (never shipped again) so that a value beginning in them is
    still found. Occurrences that overlap are masked as one."""

    def __init__(self, values: Iterable[str]) -> None:
        self.patterns = masked_patterns(values)
        self.hold = max((len(p) for p in self.patterns), default=1) - 1
        self._shipped = b""  # the last bytes shipped (at most ``hold``), as they were before masking
        self._held = b""

    def __bool__(self) -> bool:
        """Whether there is anything to mask (a run without secrets skips the work entirely)."""
        return bool(self.patterns)

    def feed(self, data: bytes) -> bytes:
        return self._take(data, final=False)

    def end(self) -> bytes:
        return self._take(b"", final=True)

    def _take(self, data: bytes, final: bool) -> bytes:
        seen = self._shipped + self._held + data
        base = len(self._shipped)
        cut = len(seen) if final else max(base, len(seen) - self.hold)
        spans = _covered(seen, self.patterns)
        # an occurrence across the cut is whole here (every one starting before the cut is): it
        # goes out masked in full rather than in two parts
        for start, end in spans:
            if start < cut < end:
                cut = end
        out = bytearray()
        at = base
        for start, end in spans:
            if end <= base or start >= cut:
                continue
            out += seen[at : max(start, base)]
            out += _MASK
            at = min(end, cut)
        out += seen[at:cut]
        self._shipped = seen[max(0, cut - self.hold) : cut] if self.hold else b""
        self._held = seen[cut:]
        return bytes(out)
