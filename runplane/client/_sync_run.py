"""``Run`` and ``Sweep``: a run and a sweep with the ``Client`` that read them (the blocking flavour)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from runplane.api.checkpoint_models import CheckpointPage
from runplane.api.models import OutputFile, RunView, SweepView
from runplane.client._core import Progress, StateSeen
from runplane.client._forward import PortForward, loopback_listener, open_forward
from runplane.client._run import RunBase, SweepBase
from runplane.client.errors import ApiError
from runplane.client.sessions import (
    Access,
    ExecResult,
    exec_captured,
    over_unless_running,
)
from runplane.domain.states import RunState

if TYPE_CHECKING:
    from runplane.client._sync import Client


class Run(RunBase):
    """A run, with its client: ``refresh``, ``wait``, ``logs``, ``follow``, ``kill``,
    ``set_priority``, ``keep``, ``download``; while it runs, ``exec``, ``port_forward`` and (an
    interactive run) ``attach``."""

    def __init__(self, client: Client, view: RunView, created: bool = False) -> None:
        super().__init__(view, created)
        self._client = client

    def refresh(self, *, wait: float = 0) -> Run:
        """Read the run again; returns itself. With ``wait`` (seconds, up to 20): as soon as it
        differs from what was last read, or as it is after ``wait``."""
        plans = self._client._plans
        self.view = self._client._drive(plans.changed(self.view, wait) if wait > 0 else plans.get(self.view.id))
        return self

    def wait(self, timeout: float | None = None, poll: float = 0.5) -> Run:
        """Until the run has ended (``done``); returns itself. Raises WaitTimeout after
        ``timeout`` seconds. Each read is answered as soon as the run changes (``poll``: how
        often a stack that cannot wait so is read)."""
        self.view = self._client._drive(self._client._plans.wait(self.view.id, timeout, poll, self.view))
        return self

    def logs(self, stream: str = "stdout", *, attempt: int | None = None) -> str:
        """Everything ``stream`` holds so far (of ``attempt``; default the latest: an earlier
        attempt's logs are kept when a retry rule runs it again)."""
        return self._client._drive(self._client._plans.all_logs(self.view.id, stream, attempt))

    def follow(self, streams: tuple[str, ...] = ("stdout",), *, poll: float = 0.5) -> Iterator[str]:
        """The text of ``streams`` as it arrives, until the run has ended and all of it is read."""
        for _, text in self.follow_chunks(streams, poll=poll):
            yield text

    def follow_chunks(
        self,
        streams: tuple[str, ...] = ("stdout", "stderr"),
        *,
        on_state: Callable[[Run], None] | None = None,
        poll: float = 0.5,
    ) -> Iterator[tuple[str, str]]:
        """``(stream, text)`` as the streams grow: whole lines while the run goes, the rest at the
        end. The run is kept up to date; ``on_state(run)`` is called whenever its state (or why
        it waits) changes. Ends when the run has ended and every stream is read to its end."""
        steps = self._client._steps(self._client._plans.follow(self.view.id, tuple(streams), poll))
        while True:
            try:
                item = next(steps)
            except StopIteration as stop:
                self.view = stop.value
                return
            if isinstance(item, StateSeen):
                self.view = item.view
                if on_state is not None:
                    on_state(self)
            else:
                yield item

    def kill(self) -> Run:
        """Kill it (see ``Client.kill``); returns itself."""
        self.view = self._client.kill(self.view.id).view
        return self

    def set_priority(self, priority: int) -> Run:
        """Change its priority while it is queued (see ``Client.set_priority``); returns itself."""
        self.view = self._client.set_priority(self.view.id, priority).view
        return self

    def keep(self, keep: bool = True) -> Run:
        """Keep it from its pool's retention, or let it go (see ``Client.keep``); returns itself."""
        self.view = self._client.keep(self.view.id, keep).view
        return self

    def outputs(self, *, attempt: int | None = None) -> Iterator[OutputFile]:
        return self._client.outputs(self.view.id, attempt=attempt)

    def download(self, dest: Path | str = ".", *, force: bool = False, progress: Progress | None = None) -> list[Path]:
        """Write every output file under ``dest`` and return their paths. Raises DownloadFailed,
        before writing anything, for a path that would leave ``dest`` or an existing file of
        another size; a file of the same size whose bytes differ is refused when it is reached.
        ``force`` overwrites; a ``live/`` file (a copy of one the run rewrites while it goes) is
        always written over, so that a download again brings its newer content.
        ``progress(bytes_so_far, bytes_in_all)`` follows the whole download."""
        return self._client._drive(self._client._plans.download(self.view.id, dest, force, progress))

    def checkpoint_files(self) -> CheckpointPage:
        """Its newest checkpoint (else the one it starts from) with every file's download URL
        (``Client.checkpoint``); ``run.checkpoint`` is what its record says of it."""
        return self._client.checkpoint(self.view.id)

    def download_checkpoint(
        self, dest: Path | str = ".", *, force: bool = False, progress: Progress | None = None
    ) -> list[Path]:
        """Write its checkpoint's files and directories under ``dest``, each file with its permission
        bits, and return the files' paths; refuses as ``download`` does."""
        return self._client._drive(self._client._plans.download_checkpoint(self.view.id, dest, force, progress))

    def exec(self, command: Sequence[str], stdin: bytes | None = None) -> ExecResult:
        """Run ``command`` (its arguments, no shell) in the run's container as the run's user, feed
        it ``stdin`` (None: none) and wait for its exit: its exit code, stdout and stderr. Raises
        NotFound, Conflict (the run is not running), InvalidRequest (its pool allows no session,
        or no more); SessionLost when the session ends before the command (docs/sessions.md)."""
        access = Access.read(
            self._client.open_session(self.view.id, "exec", command=list(command), stdin=stdin is not None)
        )
        with self._closed_unjoined(access):
            return exec_captured(access, stdin, run_over=self._run_over(), renew=self._renew(access))

    def attach(self, stdin: bytes | None = None) -> ExecResult:
        """An interactive run's own command (submitted with ``interactive=True``): feed it ``stdin``
        (then its end; None: nothing, its input stays open for a later attach) and take its output
        until it exits: its exit code and output (with ``tty``, all of it as stdout). Raises as
        ``exec`` does, and Conflict for a run that is not interactive or is attached already."""
        access = Access.read(self._client.open_session(self.view.id, "attach"))
        with self._closed_unjoined(access):
            return exec_captured(access, stdin, run_over=self._run_over(), renew=self._renew(access))

    def port_forward(self, remote: int, local: int = 0) -> PortForward:
        """Connections to ``127.0.0.1:local`` (0: a free port, ``.local_port``) forwarded to
        ``127.0.0.1:remote`` inside the run, until ``close()`` (use it with ``with``) or the run
        ends (``.ended``). Raises OSError when ``local`` is taken, and as ``exec`` does."""
        listener = loopback_listener(local)
        try:
            access = Access.read(self._client.open_session(self.view.id, "port_forward", port=remote))
        except BaseException:
            listener.close()
            raise
        with self._closed_unjoined(access):
            return open_forward(
                access,
                remote,
                listener,
                self._run_over(),
                renew=self._renew(access),
                leave=functools.partial(self._client.close_session, self.view.id, access.session_id),
            )

    def _run_over(self) -> Callable[[], str | None]:
        """While waiting for the session's worker: the run's state once it is no longer running
        (no worker serves a session of a run that ended)."""
        return over_unless_running(lambda: self._client.get(self.view.id).state)

    def _renew(self, access: Access) -> Callable[[], Access]:
        """A fresh ticket for the session of ``access``: its link dials again with it after a drop."""
        return lambda: Access.read(self._client.session_ticket(self.view.id, access.session_id))

    @contextlib.contextmanager
    def _closed_unjoined(self, access: Access) -> Iterator[None]:
        """A session its worker never joined (NotJoined), or left before its command's end (an
        interrupt, a lost session), closed: it would hold a slot until it expires, and a worker
        would wait for this side to dial again."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(ApiError, OSError):
                self._client.close_session(self.view.id, access.session_id)
            raise


class Sweep(SweepBase):
    """A sweep, with its client: ``refresh``, ``wait``, ``kill``, ``retry``, ``members``."""

    def __init__(self, client: Client, view: SweepView, created: bool = False) -> None:
        super().__init__(view, created)
        self._client = client

    def refresh(self) -> Sweep:
        self.view = self._client._drive(self._client._plans.sweep(self.view.id))
        return self

    def wait(
        self, timeout: float | None = None, poll: float = 1.0, *, on_progress: Callable[[Sweep], None] | None = None
    ) -> Sweep:
        """Until every member has ended; ``on_progress(sweep)`` after each read. Raises
        WaitTimeout after ``timeout`` seconds."""
        steps = self._client._steps(self._client._plans.wait_sweep(self.view.id, timeout, poll))
        while True:
            try:
                self.view = next(steps)
            except StopIteration as stop:
                self.view = stop.value
                return self
            if on_progress is not None:
                on_progress(self)

    def kill(self) -> Sweep:
        self.view = self._client.kill_sweep(self.view.id).view
        return self

    def retry(self) -> int:
        """Run the failed, killed and timed-out members again; how many go."""
        sweep, count = self._client.retry_sweep(self.view.id)
        self.view = sweep.view
        return count

    def set_max_parallel(self, max_parallel: int | None) -> Sweep:
        self.view = self._client.set_max_parallel(self.view.id, max_parallel).view
        return self

    def members(self, *, state: RunState | str | None = None) -> Iterator[Run]:
        return self._client.members(self.view.id, state=state)
