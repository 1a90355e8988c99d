"""The file side of a ``Fetch`` (a download), the same for both drivers: where a file goes, its
``.part`` file while it comes, and the move into place."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from runplane.api.checkpoint_models import CheckpointFileView
from runplane.api.models import OutputFile
from runplane.client._core import Fetch
from runplane.client.errors import DownloadFailed

LIVE = "live/"
"""Where a run's outputs while it goes are (``$RUNPLANE_OUTPUT/live/``)."""


def overwrites(file: OutputFile, force: bool) -> bool:
    """Whether a download writes ``file`` over a local file that differs: with ``force``, and always
    for a ``live/`` file, a copy of one the run rewrites while it goes, so that downloading a run
    again (while it goes, and once it has ended) brings its newer content."""
    return force or file.path.startswith(LIVE)


def output_target(root: Path, file: OutputFile | CheckpointFileView, force: bool) -> Path:
    """Where ``file`` (an output's or a checkpoint's) goes under ``root``. Raises DownloadFailed for
    a path that leaves it, a directory in its place, or (unless ``force``) a file there of another size."""
    target = (root / file.path).resolve()
    if target == root or not target.is_relative_to(root):
        raise DownloadFailed(0, "unsafe_path", f"refusing output path {file.path[:200]!r}: it leaves {root}")
    if target.is_dir():
        raise DownloadFailed(0, "exists", f"{target} is a directory; output {file.path!r} cannot be written there")
    for parent in target.relative_to(root).parents:
        if (root / parent).exists() and not (root / parent).is_dir():
            raise DownloadFailed(0, "exists", f"{root / parent} is not a directory; {file.path!r} cannot be written")
    if not force and target.exists() and target.stat().st_size != file.size:
        raise DownloadFailed(0, "exists", f"{target} exists and differs; use --force to overwrite it")
    return target


def dir_target(root: Path, path: str) -> Path:
    """Where a checkpoint's directory ``path`` goes under ``root``. Raises DownloadFailed for a path
    that leaves it, or a file in its place."""
    target = (root / path).resolve()
    if target == root or not target.is_relative_to(root):
        raise DownloadFailed(0, "unsafe_path", f"refusing directory {path[:200]!r}: it leaves {root}")
    if target.exists() and not target.is_dir():
        raise DownloadFailed(0, "exists", f"{target} is not a directory; directory {path[:200]!r} cannot be made")
    return target


def part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def place(part: Path, dest: Path, force: bool) -> None:
    """Move a finished ``part`` to ``dest``. Unless ``force``, an existing ``dest`` with other
    bytes is kept (``part`` removed) and DownloadFailed raised."""
    if not force and dest.exists() and not _same_bytes(part, dest):
        part.unlink(missing_ok=True)
        raise DownloadFailed(0, "exists", f"{dest} exists and differs; use --force to overwrite it")
    part.replace(dest)


def _same_bytes(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with a.open("rb") as fa, b.open("rb") as fb:
        while True:
            chunk = fa.read(1 << 20)
            if chunk != fb.read(1 << 20):
                return False
            if not chunk:
                return True


class PartFile:
    """The file side of a ``Fetch``, the same for both drivers: ``start`` with the answer's status
    and headers, ``write`` each chunk, ``finish`` (``place``s it), or ``fail`` with whatever went
    wrong, which removes the part file and returns the DownloadFailed to raise."""

    def __init__(self, step: Fetch) -> None:
        self.step = step
        self.part = part_path(step.dest)
        self._out: BinaryIO | None = None
        self._length: int | None = None

    def start(self, status: int, headers: Mapping[str, str]) -> None:
        if status != 200:
            raise DownloadFailed(status, "download_failed", f"download of {self.step.dest.name} failed: HTTP {status}")
        length = headers.get("content-length")
        self._length = int(length) if length is not None and length.isdigit() else None
        self.step.dest.parent.mkdir(parents=True, exist_ok=True)
        self._out = self.part.open("wb")

    def write(self, chunk: bytes) -> None:
        assert self._out is not None, "write before start"
        self._out.write(chunk)
        if self.step.on_chunk is not None:
            self.step.on_chunk(len(chunk), self._length)

    def finish(self) -> None:
        if self._out is None:
            raise DownloadFailed(0, "download_failed", f"download of {self.step.dest.name} failed: no answer")
        self._out.close()
        place(self.part, self.step.dest, self.step.force)

    def fail(self, error: Exception) -> DownloadFailed:
        if self._out is not None:
            self._out.close()
        self.part.unlink(missing_ok=True)
        if isinstance(error, DownloadFailed):
            return error
        reason = str(error) or type(error).__name__
        return DownloadFailed(0, "download_failed", f"download of {self.step.dest.name} failed: {reason}")
