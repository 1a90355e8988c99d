"""Which input sources a run may name. Checked at submit (the API) and again by the agent before
it reads a byte, so a run stored by an older API, or written to the store by other means, cannot
read what its owner may not."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from runplane.domain.errors import InvalidRequest, NotAllowed


def bucket_of(source: str) -> tuple[str, str] | None:
    """``(bucket, key)`` of an ``s3://bucket/key`` source; None for other kinds."""
    if not source.startswith("s3://"):
        return None
    bucket, _, key = source[5:].partition("/")
    return bucket, key


def check_bucket_source(
    name: str,
    source: str,
    groups: Iterable[str],
    allowlist: Mapping[str, frozenset[str]],
    own_bucket: str,
) -> None:
    """Raise InvalidRequest unless an ``s3://`` input may be read by a member of ``groups``: the
    bucket is not the stack's own (which holds every user's logs and outputs), it is allowed for
    everyone (``*``) or for one of ``groups``, and the key is not empty. Other sources pass."""
    parts = bucket_of(source)
    if parts is None:
        return
    bucket, key = parts
    if not key or key == "/":
        raise InvalidRequest(f"input {name}: name an object or a prefix inside the bucket, not the whole bucket")
    if bucket == own_bucket:
        raise NotAllowed(
            f"input {name}: the stack's own bucket cannot be an input; use run:<id>[/path] for a run's outputs"
        )
    allowed = set(allowlist.get("*", frozenset()))
    for group in groups:
        allowed |= allowlist.get(group, frozenset())
    if bucket not in allowed:
        hint = f"allowed for you: {', '.join(sorted(allowed))}" if allowed else "no bucket is allowed for you"
        raise NotAllowed(f"input {name}: bucket {bucket} is not one the operator allows as an input ({hint})")


@dataclass(frozen=True)
class InputPolicy:
    """What the operator allows runs to read: ``allowlist`` (group or ``*`` -> buckets) and the
    stack's own bucket, which is never allowed. The empty policy allows no bucket at all."""

    allowlist: Mapping[str, frozenset[str]] = field(default_factory=dict)
    own_bucket: str = ""

    def check(self, name: str, source: str, groups: Iterable[str]) -> None:
        """Raise InvalidRequest unless a member of ``groups`` may read ``source``."""
        check_bucket_source(name, source, groups, self.allowlist, self.own_bucket)
