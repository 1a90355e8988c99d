"""A run's checkpoints: what its checkpoint directory held at one moment, kept in the object store so
that a later attempt of the run, on any worker, starts from there.

A checkpoint is a manifest, which names the directory's files (each by the SHA-256 of its bytes) and
its directories, and one blob per distinct content. The keys:

- ``runs/<run id>/checkpoints/<seq:08d>/manifest.json``: checkpoint number ``seq`` of the run's
  series, written last, once every blob it names is stored: a sync cut halfway leaves no manifest,
  and the checkpoint before it stays the newest;
- ``runs/<run id>/checkpoints/blobs/<sha256>``: a file's bytes, named by their SHA-256, so a file
  that has not changed since the checkpoint before is not uploaded again.

A manifest is read as a record another release may have written (``wire.stored``), and refused whole
when anything in it could write outside the directory it is restored into or is not what it says: a
path that is absolute, climbs (``..``), holds a backslash, a NUL or an empty or ``.`` component, or
names one entry twice or under a file; a mode with more than permission bits (a symlink's, a
device's, setuid); a blob key other than its own series' blob of its SHA-256; a total that is not the
sum of its files' sizes.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from runplane.domain.common import RUN_ID_PATTERN, SCHEMA_VERSION, WHOLE, duration_or_text, read_duration
from runplane.domain.errors import PayloadTooLarge, RunplaneError
from runplane.domain.retention import kind_prefix
from runplane.domain.uploads import SHA256_PATTERN
from runplane.domain.wire import Record

CHECKPOINTS = "checkpoints"
"""The kind of a run's objects that its checkpoints are (``retention.kind_prefix``)."""
MANIFEST_NAME = "manifest.json"
BLOBS = "blobs/"
MAX_SEQ = 99_999_999
"""The highest checkpoint number: eight digits keep the manifests' keys in their numbers' order."""
MAX_ENTRIES = 100_000
"""The most files and directories one checkpoint names."""
MAX_MANIFEST_BYTES = 64 * 1024**2
"""The largest manifest read: one of ``MAX_ENTRIES`` entries of long paths is well under it."""
MAX_PATH_CHARS = 4096
MAX_NAME_BYTES = 255
PERMISSION_BITS = 0o777
"""What a manifest keeps of a mode: no file type, no setuid, setgid or sticky bit."""

_SEQ_DIGITS = 8


def checkpoints_prefix(run_id: str) -> str:
    """Every object of ``run_id``'s checkpoint series: its manifests, then its blobs."""
    return kind_prefix(run_id, CHECKPOINTS)


def manifest_key(run_id: str, seq: int) -> str:
    return f"{checkpoints_prefix(run_id)}{seq:0{_SEQ_DIGITS}d}/{MANIFEST_NAME}"


def blobs_prefix(run_id: str) -> str:
    return checkpoints_prefix(run_id) + BLOBS


def blob_key(run_id: str, sha256: str) -> str:
    """Where the bytes whose SHA-256 is ``sha256`` are kept in ``run_id``'s series."""
    return blobs_prefix(run_id) + sha256


_MANIFEST_TAIL = re.compile(rf"^(\d{{{_SEQ_DIGITS}}})/{re.escape(MANIFEST_NAME)}$")


def manifest_seq(run_id: str, key: str) -> int | None:
    """The checkpoint number of a key of ``run_id``'s series that is a manifest's; None for another key."""
    prefix = checkpoints_prefix(run_id)
    found = _MANIFEST_TAIL.match(key[len(prefix) :]) if key.startswith(prefix) else None
    return int(found.group(1)) if found else None


def path_refusal(path: str) -> str | None:
    """Why ``path`` cannot name an entry of a checkpoint (relative to its directory, ``/``-separated,
    each component a plain name), or None when it can."""
    if not path:
        return "an empty path"
    if len(path) > MAX_PATH_CHARS:
        return f"a path longer than {MAX_PATH_CHARS} characters"
    if path.startswith("/"):
        return "an absolute path"
    if "\\" in path:
        return "a path holding a backslash"
    if "\x00" in path:
        return "a path holding a NUL"
    for part in path.split("/"):
        if part in ("", ".", ".."):
            return f"a path with a {part!r} component" if part else "a path with an empty component"
        try:
            size = len(part.encode())
        except UnicodeEncodeError:
            return "a path that is not UTF-8"
        if size > MAX_NAME_BYTES:
            return f"a name longer than {MAX_NAME_BYTES} bytes"
    return None


def _checked_path(path: str) -> str:
    why = path_refusal(path)
    if why is not None:
        raise ValueError(f"{why}: {path[:80]!r}")
    return path


class CheckpointFile(Record):
    """A regular file of a checkpoint."""

    path: str
    """Relative to the checkpoint directory, ``/``-separated."""
    size: int = Field(ge=0)
    sha256: str = Field(pattern=SHA256_PATTERN)
    mode: int = Field(ge=0, le=PERMISSION_BITS)
    mtime_ns: int
    """Its modification time (nanoseconds since the epoch): restored with it, and what tells the next
    sync, with its size and mode, that it has not changed since."""
    key: str
    """The blob that holds its bytes: ``blob_key(series, sha256)``."""

    @field_validator("path")
    @classmethod
    def _safe_path(cls, path: str) -> str:
        return _checked_path(path)


class CheckpointDir(Record):
    """A directory of a checkpoint (so that an empty one is restored too, and each with its mode)."""

    path: str
    mode: int = Field(ge=0, le=PERMISSION_BITS)

    @field_validator("path")
    @classmethod
    def _safe_path(cls, path: str) -> str:
        return _checked_path(path)


class Manifest(Record):
    """One checkpoint of a run's series: its files and directories, written after its blobs."""

    v: int = SCHEMA_VERSION
    series: str = Field(pattern=f"^{RUN_ID_PATTERN}$")
    """The run whose series this is: its blobs are under that run's prefix."""
    seq: int = Field(ge=1, le=MAX_SEQ)
    attempt: int = Field(default=0, ge=0)
    """The attempt of the run that wrote it."""
    created_at: float
    files: list[CheckpointFile] = Field(default_factory=list, max_length=MAX_ENTRIES)
    dirs: list[CheckpointDir] = Field(default_factory=list, max_length=MAX_ENTRIES)
    total_bytes: int = Field(ge=0)
    """The sum of its files' sizes."""

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        if len(self.files) + len(self.dirs) > MAX_ENTRIES:
            raise ValueError(f"more than {MAX_ENTRIES} files and directories")
        if sum(f.size for f in self.files) != self.total_bytes:
            raise ValueError("total_bytes is not the sum of its files' sizes")
        for f in self.files:
            if f.key != blob_key(self.series, f.sha256):
                raise ValueError(f"file {f.path[:80]!r} names a blob other than its series' of its SHA-256")
        files = {f.path for f in self.files}
        paths = [*files, *(d.path for d in self.dirs)]
        if len(paths) != len(set(paths)):
            raise ValueError("a path is named twice")
        for path in paths:
            parts = path.split("/")
            for end in range(1, len(parts)):
                if "/".join(parts[:end]) in files:
                    raise ValueError(f"{path[:80]!r} is under a file")
        return self


CHECKPOINT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")
"""What a run may be sent to say "checkpoint now, you are about to be stopped"."""
MIN_INTERVAL = 1.0
MAX_INTERVAL = 7 * 86400.0
MAX_GRACE = 3600.0
DEFAULT_GRACE = 30.0
DEFAULT_MAX_PIECES = 100
MAX_PIECES = 10_000
MIN_EXIT_CODE = 3
"""The least ``exit_code`` of a rule: 1 and 2 are what any crash or shell misuse exits with."""
CHECKPOINT_DIR = "/runplane/checkpoint"
"""Where the run's checkpoint directory is in its container (``$RUNPLANE_CHECKPOINT_DIR``)."""
CHECKPOINT_ENV = "RUNPLANE_CHECKPOINT_DIR"


class CheckpointRule(Record):
    """How a run checkpoints (``RunSpec.checkpoint``): what the agent does with its checkpoint
    directory. Every field is optional, but the rule names at least one (``--checkpoint 10m`` gives
    ``interval``)."""

    model_config = ConfigDict(
        allow_inf_nan=False,
        json_schema_extra={  # what _names_one says, for the schema: one field at least; max_pieces with exit_code
            "minProperties": 1,
            "if": {"properties": {"max_pieces": {"type": "integer"}}, "required": ["max_pieces"]},
            "then": {"properties": {"exit_code": {"type": "integer"}}, "required": ["exit_code"]},
        },
    )

    interval: Annotated[float | None, duration_or_text(MIN_INTERVAL, MAX_INTERVAL, ["10m", 600])] = Field(
        default=None,
        ge=MIN_INTERVAL,
        le=MAX_INTERVAL,
        description="seconds between syncs of what changed in the checkpoint directory to the run's checkpoint "
        "series (1 s to 7 days); none: synced only when the run is stopped or ends a piece",
    )
    signal: Literal[CHECKPOINT_SIGNALS] | None = Field(  # type: ignore[valid-type]
        default=None,
        description="sent to the command when its worker is preempted, hands it back or stops: it has grace to "
        "write a checkpoint before it is stopped and synced; default SIGTERM",
    )
    grace: Annotated[float | None, duration_or_text(0, MAX_GRACE, ["60s", 60])] = Field(
        default=None,
        ge=0,
        le=MAX_GRACE,
        description="the longest the command is given after the signal (0 to 1 hour; default 30 s); when its "
        "worker stops, at most three quarters of the agent's stop budget (75 s of 100 s by default), which its "
        "final sync shares",
    )
    exit_code: Annotated[int | None, WHOLE] = Field(
        default=None,
        ge=MIN_EXIT_CODE,
        le=125,
        strict=True,
        description="the exit status (3..125) by which the command says 'checkpointed, start me again': its "
        "checkpoint is synced and it starts again on the same worker, in the same attempt (not 1 or 2, what any "
        "crash or shell misuse exits with: every crash would be a new piece)",
    )
    max_pieces: Annotated[int | None, WHOLE] = Field(
        default=None,
        ge=1,
        le=MAX_PIECES,
        strict=True,
        description=f"with exit_code: the most pieces the run goes in, all attempts together (default "
        f"{DEFAULT_MAX_PIECES}); one more exit_code fails it",
    )

    _durations = field_validator("interval", "grace", mode="before")(staticmethod(read_duration))

    @model_validator(mode="after")
    def _names_one(self) -> CheckpointRule:
        if not self.model_fields_set:
            raise ValueError("give at least one of interval, signal, grace, exit_code, max_pieces")
        if self.max_pieces is not None and self.exit_code is None:
            raise ValueError("max_pieces bounds the pieces an exit_code starts: give exit_code too")
        return self

    @property
    def stop_signal(self) -> str:
        return self.signal or "SIGTERM"

    @property
    def stop_grace(self) -> float:
        return DEFAULT_GRACE if self.grace is None else self.grace

    @property
    def piece_limit(self) -> int:
        return DEFAULT_MAX_PIECES if self.max_pieces is None else self.max_pieces


class CheckpointStatus(Record):
    """The newest checkpoint of a run's series as the worker that synced it last recorded it on the
    run (``Run.checkpoint``; that worker holds the run's lease, the one writer)."""

    seq: int = Field(ge=1, le=MAX_SEQ)
    attempt: int = Field(ge=0)
    """The attempt that synced it."""
    files: int = Field(ge=0)
    bytes: int = Field(ge=0)
    synced_at: float
    series: str | None = None
    """The run whose series holds it, when not this run's own (a restore of ``from_checkpoint`` not
    synced again yet)."""


class CheckpointSource(Record):
    """The checkpoint a run starts from before it has one of its own (``RunSpec.from_checkpoint``,
    pinned at submit to that run's newest complete checkpoint then)."""

    run: str = Field(pattern=f"^{RUN_ID_PATTERN}$")
    seq: int = Field(ge=1, le=MAX_SEQ)


class CheckpointTooLarge(PayloadTooLarge):
    """A checkpoint directory over its cap (the run's disk limit, or the most entries): no manifest
    is written for it, and no restore writes it."""


class CheckpointUnusable(RunplaneError):
    """A checkpoint could not be restored (a blob that is not what its manifest says, a directory that
    is not an empty one of its own): what the restore wrote is removed again."""

    code = "checkpoint_unusable"


class CheckpointCancelled(RunplaneError):
    """A sync given up before its manifest was written (its caller's time ran out): the checkpoint
    before it stays the newest."""

    code = "checkpoint_cancelled"
