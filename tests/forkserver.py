"""Processes forked from an interpreter that has imported their program already.

A command-line tool written in Python spends most of a short invocation importing itself (the
aws CLI and ``runplane`` about half a second each, much more on a loaded machine). A test that
runs such a tool many times starts one ``ForkServer``, which imports the tool once; each
``ForkServer.run`` then forks a fresh process from it that takes the caller's arguments,
environment, working directory and standard streams, runs the tool as ``python -m MODULE`` or
``python SCRIPT`` would, and exits: the caller gets its exit status and its output, as from
``subprocess.run``. Each invocation is still a process of its own (its exit code, its streams, its
environment, nothing shared with another invocation but what the imports left).

Run as a script, this file is the server (``SOCKET PRELOAD...``: it prints ``ready`` once it
listens), or with ``--client SOCKET (--module M | --path P) -- ARGS...`` a stand-in for the tool's
executable that runs it with its own arguments, environment and streams. Only the standard
library here: the server runs under the tool's interpreter, whatever its packages.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import locale
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


# ---- the server -----------------------------------------------------------------------------


def serve(path: str, preload: list[str]) -> None:
    """Import ``preload``, listen on the Unix socket ``path``, and answer each connection from a
    child of its own (which forks the program's process), until stdin ends: the caller holds it
    open, so a caller that dies leaves no server behind."""
    before = dict(os.environ)
    for name in preload:
        importlib.import_module(name)
    # what the imports put in the environment (awscli its data path), as they would in each process
    imported = {k: v for k, v in os.environ.items() if before.get(k) != v}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the children that answer reap themselves
    print("ready", flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(0, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fd == 0:
                if not os.read(0, 4096):
                    return
                continue
            conn, _ = listener.accept()
            if os.fork() == 0:
                selector.close()
                listener.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _answer(conn, imported)
            conn.close()


def _answer(conn: socket.socket, imported: dict[str, str]) -> None:
    """Fork the program's process for the request on ``conn``, say its pid, wait for it and say
    its exit status (as ``subprocess`` gives it: the negative signal number when killed)."""
    code = 1
    try:
        _, fds, _, _ = socket.recv_fds(conn, 1, 3)
        payload = b""
        while chunk := conn.recv(65536):
            payload += chunk
        request = json.loads(payload)
        request["env"] |= imported
        pid = os.fork()
        if pid == 0:
            conn.close()
            _become(request, fds)
        for fd in fds:
            os.close(fd)
        conn.sendall(f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked process: take the caller's streams, environment and directory, and run the
    program as the interpreter would run it; then exit as the interpreter would."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        code = _run(request)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _run(request: dict[str, Any]) -> int:
    """Run the request's module (as ``python -m``) or script; its exit code."""
    try:
        try:
            if "module" in request:
                sys.argv = [request["module"], *request["args"]]
                sys.path.insert(0, os.getcwd())
                runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            else:
                sys.argv = [request["path"], *request["args"]]
                sys.path.insert(0, str(Path(request["path"]).resolve().parent))
                runpy.run_path(request["path"], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = _exit_code(e)
        except KeyboardInterrupt:
            traceback.print_exc()
            atexit._run_exitfuncs()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            return 130
        atexit._run_exitfuncs()
        return code
    except BaseException:
        traceback.print_exc()
        return 1


def _exit_code(e: SystemExit) -> int:
    """The exit code the interpreter makes of an uncaught SystemExit."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


# ---- the caller's side ----------------------------------------------------------------------


class ForkServer:
    """A server process (``python this-file SOCKET PRELOAD...``) under ``interpreter``, which
    imports ``preload`` once; ``run`` forks a process of the program from it. ``env`` is the
    server's environment, the one the imports see (each run brings its own)."""

    def __init__(self, interpreter: list[str], preload: list[str], env: dict[str, str], start_timeout: float = 120):
        self.dir = Path(tempfile.mkdtemp(prefix="forkserver-"))
        self.socket = str(self.dir / "socket")
        self.log = self.dir / "server.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [*interpreter, str(HERE), self.socket, *preload],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=self.dir,
            )
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            ready = selector.select(start_timeout) and self.proc.stdout.readline() == b"ready\n"
        self.proc.stdout.close()
        if not ready:
            log = self.log.read_text()[-3000:]
            self.stop()
            raise RuntimeError(f"the fork server did not start:\n{log}")

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for path in self.dir.iterdir():
            path.unlink()
        self.dir.rmdir()

    def run(
        self,
        target: dict[str, str],
        args: list[str],
        *,
        env: dict[str, str],
        cwd: str | os.PathLike[str] | None = None,
        input: str | None = None,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Like ``subprocess.run(..., capture_output=True, text=True)`` of the program
        (``target``: ``{"module": M}`` or ``{"path": P}``) with ``args``; stdin is ``input``,
        or empty."""
        argv = [*target.values(), *args]
        request = {**target, "args": args, "env": env, "cwd": os.fspath(cwd or Path.cwd())}
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                try:
                    conn.connect(self.socket)
                    socket.send_fds(conn, [b"."], [in_r, out_w, err_w])
                    conn.sendall(json.dumps(request).encode())
                    conn.shutdown(socket.SHUT_WR)
                finally:
                    for fd in (in_r, out_w, err_w):
                        os.close(fd)
                streams = _Streams(conn, in_w, (input or "").encode(), out_r, err_r)
                in_w = -1  # the streams close it
                streams.exchange(argv, timeout)
        finally:
            for fd in (in_w, out_r, err_r):
                if fd >= 0:
                    os.close(fd)
        control = streams.got[streams.control].split()
        if len(control) != 2:
            raise RuntimeError(f"the fork server gave no exit status:\n{self.log.read_text()[-3000:]}")
        return subprocess.CompletedProcess(argv, int(control[1]), _text(streams.got[out_r]), _text(streams.got[err_r]))


class _Streams:
    """The caller's ends of a forked process's stdin, stdout and stderr, and of its control
    connection (which answers the pid, then the exit status)."""

    def __init__(self, conn: socket.socket, in_w: int, pending: bytes, out_r: int, err_r: int) -> None:
        self.control, self.in_w, self.pending = conn.fileno(), in_w, pending
        self.out_r, self.err_r = out_r, err_r
        self.got = {out_r: b"", err_r: b"", self.control: b""}

    def exchange(self, argv: list[str], timeout: float | None) -> None:
        """Write the pending input, read every output to its end; kill the process and raise
        subprocess.TimeoutExpired when it runs past ``timeout``. Closes stdin's end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            for fd in self.got:
                selector.register(fd, selectors.EVENT_READ)
            if self.pending:
                os.set_blocking(self.in_w, False)
                selector.register(self.in_w, selectors.EVENT_WRITE)
            else:
                self._close_stdin()
            try:
                while selector.get_map():
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        self._kill()
                        raise subprocess.TimeoutExpired(argv, timeout or 0, self.got[self.out_r], self.got[self.err_r])
                    for key, _ in selector.select(left):
                        if key.fd == self.in_w:
                            self._write()
                            if not self.pending:
                                selector.unregister(key.fd)
                                self._close_stdin()
                            continue
                        data = os.read(key.fd, 65536)
                        self.got[key.fd] += data
                        if not data:
                            selector.unregister(key.fd)
            finally:
                self._close_stdin()

    def _write(self) -> None:
        try:
            self.pending = self.pending[os.write(self.in_w, self.pending[:65536]) :]
        except BrokenPipeError:  # the process closed its stdin: the rest is not for it
            self.pending = b""

    def _close_stdin(self) -> None:
        if self.in_w >= 0:
            os.close(self.in_w)
            self.in_w = -1

    def _kill(self) -> None:
        pid = self.got[self.control].split()[:1]
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid[0]), signal.SIGKILL)


def _text(data: bytes) -> str:
    """``data`` decoded as ``subprocess.run(text=True)`` does (universal newlines)."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


# ---- the stand-in executable ----------------------------------------------------------------


def client(argv: list[str]) -> int:
    """``--client SOCKET (--module M | --path P) -- ARGS...``: run the program with ARGS on this
    process's streams, environment and directory; exit as it exits."""
    path, kind, name, separator, *args = argv
    assert kind in ("--module", "--path") and separator == "--", argv
    request = {kind[2:]: name, "args": args, "env": dict(os.environ), "cwd": os.getcwd()}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        socket.send_fds(conn, [b"."], [0, 1, 2])
        conn.sendall(json.dumps(request).encode())
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    control = answer.split()
    if len(control) != 2:
        print(f"forkserver: no exit status from {path}", file=sys.stderr)
        return 255
    code = int(control[1])
    if code < 0:  # killed by a signal: so is this process
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


if __name__ == "__main__":
    if sys.argv[1] == "--client":
        sys.exit(client(sys.argv[2:]))
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE.parent]
    serve(sys.argv[1], sys.argv[2:])
