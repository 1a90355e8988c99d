"""Secret values out of a run's shipped output: each one, wherever it appears, becomes ``MASK``,
also when a read of the stream ends in the middle of it.

A read is searched once for every pattern at a time (one regular expression, compiled once per
run), and only what a match not yet complete may start in is held back: the longest end of the
output that begins some pattern, usually nothing, so a line with no such end goes out at once."""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable

from runplane.domain.secrets import MASK, MIN_MASKED_LENGTH

_MASK = MASK.encode()

MAX_LINE_PATTERNS = 1000
"""The most lines of values of several lines masked in one run, the longest first: the lines of a
run's values beyond these (the shortest) are not masked on their own; each whole value still is."""

_Trie = dict[int, "_Trie"]

_HEAD = 16
"""Patterns of this many bytes or more are found by their first ``_HEAD`` bytes, then compared
whole; the expression stays small whatever the values' size."""


def masked_patterns(values: Iterable[str]) -> list[bytes]:
    """What is masked for ``values``: each value of at least ``MIN_MASKED_LENGTH`` characters, and
    each line of at least that many of a value of several lines (a key file printed line by line),
    at most ``MAX_LINE_PATTERNS`` lines in all, the longest first, as UTF-8, longest first; blanks
    around each are left out (what a value read from a file ends with)."""
    whole: set[str] = set()
    lines: set[str] = set()
    for value in values:
        text = value.strip()
        if len(text) >= MIN_MASKED_LENGTH:
            whole.add(text)
        for line in value.splitlines():
            text = line.strip()  # a line of blanks alone would mask every indentation
            if len(text) >= MIN_MASKED_LENGTH:
                lines.add(text)
    kept = heapq.nsmallest(MAX_LINE_PATTERNS, (t.encode() for t in lines - whole), key=_longest_first)
    return sorted([*(text.encode() for text in whole), *kept], key=_longest_first)


def _longest_first(pattern: bytes) -> tuple[int, bytes]:
    return -len(pattern), pattern


def _alternation(words: Iterable[bytes]) -> bytes:
    """A regular expression matching the longest of ``words`` that begins where it is tried: their
    trie, each node one branch per next byte, so a try reads each byte once whatever their number."""
    trie: _Trie = {}
    for word in words:
        node = trie
        for byte in word:
            node = node.setdefault(byte, {})
        node[-1] = {}  # a word ends here

    def branches(node: _Trie) -> bytes:
        parts = [re.escape(bytes([byte])) + nested(node[byte]) for byte in sorted(node) if byte >= 0]
        return b"|".join(parts)

    def nested(node: _Trie) -> bytes:
        if len(node) == 1 and -1 in node:
            return b""
        inner = branches(node)
        if -1 in node:  # the longer first: a greedy option
            return b"(?:" + inner + b")?"
        return inner if len(node) == 1 else b"(?:" + inner + b")"

    return branches(trie)


class Patterns:
    """A run's patterns, compiled once (for both streams): ``scan`` finds, in one pass, where each
    begins and where a pattern not yet complete may begin."""

    def __init__(self, patterns: list[bytes]) -> None:
        self.patterns = patterns
        self._long: dict[bytes, list[bytes]] = {}  # head: the patterns of at least _HEAD bytes, longest first
        for pattern in patterns:
            if len(pattern) >= _HEAD:
                self._long.setdefault(pattern[:_HEAD], []).append(pattern)
        short = {p for p in patterns if len(p) < _HEAD}
        # the longest short pattern a head begins with: what is masked where a head is and no long pattern
        self._short_in_head = {
            head: next((head[:k] for k in range(_HEAD - 1, 0, -1) if head[:k] in short), b"") for head in self._long
        }
        # every beginning of a pattern shorter than the pattern and than _HEAD
        self._starts = {p[:k] for p in patterns for k in range(1, min(len(p), _HEAD))}
        words = short | set(self._long)
        self._find = re.compile(_alternation(words)) if words else None

    def continues(self, data: bytes) -> bool:
        """Whether all of ``data`` is the beginning of a pattern of at least ``_HEAD`` bytes (and
        not all of it): a value being printed, held back whole until it ends or turns out not to be
        one, with no need to search it again on each read meanwhile."""
        longer = self._long.get(data[:_HEAD], ()) if len(data) >= _HEAD else ()
        return any(len(p) > len(data) and p.startswith(data) for p in longer)

    def scan(self, data: bytes, final: bool) -> tuple[list[tuple[int, int]], int]:
        """The spans of ``data`` that some pattern covers (overlapping occurrences joined, in
        order), and where the longest end of ``data`` that is the beginning of a pattern (and
        not all of it) begins: ``len(data)`` when none or when ``final``."""
        hold = len(data)
        spans: list[tuple[int, int]] = []
        find = self._find
        if find is None:  # no patterns
            return spans, hold
        found = find.search(data)
        while found is not None:
            start, word = found.start(), found.group()
            end = start + len(word)
            if len(word) == _HEAD:
                longer = self._long[word]
                end = start + len(next((p for p in longer if data.startswith(p, start)), self._short_in_head[word]))
                if hold == len(data) and not final:
                    rest = data[start:]
                    if any(len(p) > len(rest) and p.startswith(rest) for p in longer):
                        hold = start
            if end > start:
                if spans and start < spans[-1][1]:
                    spans[-1] = (spans[-1][0], max(spans[-1][1], end))
                else:
                    spans.append((start, end))
            found = find.search(data, start + 1)
        if hold == len(data) and not final:
            hold = next((k for k in range(max(0, len(data) - _HEAD + 1), len(data)) if data[k:] in self._starts), hold)
        return spans, hold


class Masker:
    """Masks one stream: ``feed`` each read, ``end`` once the stream has ended; each returns what
    may be shipped. What is held back until the next read (or the end) is the longest end of the
    output that begins a pattern, as the next read may complete it; the bytes held from there on
    that already went out (masked) are kept, never shipped again, so that a value overlapping
    them is masked with them. Occurrences that overlap are masked as one: the output is what
    masking the whole stream at once gives."""

    def __init__(self, values: Iterable[str] | Patterns) -> None:
        self.search = values if isinstance(values, Patterns) else Patterns(masked_patterns(values))
        self.patterns = self.search.patterns
        self._tail = b""  # the output from where a pattern not yet complete may begin
        self._out = 0  # how much of _tail went out already (all of it masked)

    def __bool__(self) -> bool:
        """Whether there is anything to mask (a run without secrets skips the work entirely)."""
        return bool(self.patterns)

    def feed(self, data: bytes) -> bytes:
        return self._take(data, final=False)

    def end(self) -> bytes:
        return self._take(b"", final=True)

    def _take(self, data: bytes, final: bool) -> bytes:
        seen = self._tail + data
        if not final and self.search.continues(seen):
            self._tail = seen  # as a full search would give: nothing goes out, all of it is held
            return b""
        spans, hold = self.search.scan(seen, final)
        gone = self._out
        cut = max(hold, gone)
        # an occurrence across the cut is whole here (every one starting before the cut is): it
        # goes out masked in full rather than in two parts
        for start, end in spans:
            if start < cut < end:
                cut = end
        out = bytearray()
        at = gone
        for start, end in spans:
            if end <= gone:
                continue
            if start >= cut:
                break
            if start >= gone:  # else it goes on from the mask that went out last
                out += seen[at:start]
                out += _MASK
            at = end
        out += seen[at:cut]
        self._tail = seen[hold:]
        self._out = cut - hold
        return bytes(out)
