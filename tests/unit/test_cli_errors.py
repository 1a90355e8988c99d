"""``runplane`` as a process, where no stack is needed: usage errors, an API that cannot be reached
or fails, the exit codes of these, profiles without a server, and shell completion. Each error is
one line on stderr starting ``error: ``, never a box or a traceback."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from runplane import __version__ as runplane_version
from runplane.api.models import RunView
from runplane.cli.app import run_cli
from tests.conftest import wait_for

RUNPLANE = str(Path(sys.executable).with_name("runplane"))


def runplane(*args: str, home: Path, env: dict[str, str] | None = None, stdin: str = "") -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RUNPLANE_")}
    base = {**clean, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    return subprocess.run(
        [RUNPLANE, *args], capture_output=True, text=True, env={**base, **(env or {})}, input=stdin, timeout=60
    )


def in_process(args: list[str], home: Path, monkeypatch, capsys) -> subprocess.CompletedProcess:
    """``runplane ARGS`` run in this process (as ``main`` runs it, quicker than a new one)."""
    for name in [k for k in os.environ if k.startswith("RUNPLANE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    code = run_cli(args)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(["runplane", *args], code, captured.out, captured.err)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_error_line(proc: subprocess.CompletedProcess, code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: "), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr.strip()


@pytest.mark.parametrize(
    ("args", "message", "command"),
    [
        (["run", "--memroy", "1g", "--", "x"], "error: No such option: --memroy", "run"),
        (["ls", "--limit", "many"], "error: Invalid value for '--limit'", "ls"),
        (["ls", "--state", "sleeping"], "error: Invalid value for '--state'", "ls"),
        (["token", "create"], "error: Missing argument 'USER'.", "token create"),
        (["logs", "--tail", "-1"], "error: Invalid value for '--tail'", "logs"),
        (["statsu"], "error: No such command 'statsu'.", ""),
        (["quota", "set", "alice", "--period", "year"], "error: Invalid value for '--period'", "quota set"),
        (["quota", "set", "alice", "--max-gpus", "-1"], "error: Invalid value for '--max-gpus'", "quota set"),
        (["usage", "--by", "colour"], "error: Invalid value for '--by'", "usage"),
    ],
)
def test_mistyped_commands_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message, command):
    line = one_error_line(in_process(args, tmp_path, monkeypatch, capsys), 2)
    assert line.startswith(message)
    assert line.endswith(f"({' '.join(['runplane', command]).strip()} --help)")  # where the usage is explained


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["kill", "--state", "queued", "r-1"], "error: --state goes with --all"),
        (["kill", "--all", "r-1"], "error: give run ids or --all, not both"),
        (["run", "--env", "NOEQUALS", "--", "x"], "error: --env must look like NAME=VALUE, got 'NOEQUALS'"),
        (
            ["quota", "set", "alice"],
            "error: give at least one of --max-running, --max-gpus, --max-cpus, --gpu-hours, --cpu-hours, "
            "--period (runplane quota rm removes a quota)",
        ),
        (["quota", "set", "alice", "--cpu-hours", "inf"], "error: --cpu-hours must be a finite number, got inf"),
        (["quota", "show", "@"], "error: '@' names no user or group: give a user (alice) or a group (@vision)"),
    ],
)
def test_bad_combinations_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    assert one_error_line(in_process(args, tmp_path, monkeypatch, capsys), 2) == message


def test_no_run_id_and_no_last_run_is_a_usage_error(tmp_path):
    line = one_error_line(runplane("status", home=tmp_path, env={"RUNPLANE_API_URL": "http://127.0.0.1:1"}), 2)
    assert line == "error: no run id given and no previous run to default to"


def test_an_unknown_profile_or_url_is_a_usage_error(tmp_path):
    line = one_error_line(runplane("--profile", "prod", "ls", home=tmp_path), 2)
    assert line.startswith("error: no profile 'prod' in ") and str(tmp_path) in line
    line = one_error_line(runplane("ls", home=tmp_path, env={"RUNPLANE_API_URL": "ftp://x"}), 2)
    assert "http:// or https://" in line


def test_an_unreachable_api_exits_4(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}"
    line = one_error_line(runplane("ls", home=tmp_path, env={"RUNPLANE_API_URL": url, "RUNPLANE_TOKEN": "x"}), 4)
    assert line.startswith(f"error: cannot reach {url}")


class _Failing(BaseHTTPRequestHandler):
    """An API that answers every request with a 503 (what a broken deployment does)."""

    def do_GET(self) -> None:
        body = json.dumps({"error": {"code": "unavailable", "message": "the API is down for maintenance"}}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def failing_api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_api_that_keeps_failing_exits_4(tmp_path, failing_api):
    proc = runplane("ls", home=tmp_path, env={"RUNPLANE_API_URL": failing_api, "RUNPLANE_TOKEN": "x"})
    assert one_error_line(proc, 4) == "error: the API is down for maintenance"


def test_help_lists_the_exit_codes(tmp_path):
    proc = runplane("--help", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.replace("│", " ").split())
    for words in (
        "2 a usage error",
        "3 the API refused",
        "4 the API could not be reached",
        "124 timed out",
        "137 killed",
    ):
        assert words in text


def test_the_bash_completion_script_names_runplane(tmp_path):
    proc = runplane("--show-completion", "bash", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "_RUNPLANE_COMPLETE=complete_bash" in proc.stdout
    assert "complete -o default -F _runplane_completion runplane" in proc.stdout
    words = {"COMP_WORDS": "runplane lo", "COMP_CWORD": "1", "_RUNPLANE_COMPLETE": "complete_bash"}
    done = runplane(home=tmp_path, env=words)
    assert done.stdout.split() == ["logs", "login"], done.stderr
    states = runplane(home=tmp_path, env={**words, "COMP_WORDS": "runplane kill --state ", "COMP_CWORD": "3"})
    assert states.stdout.split() == ["queued", "preparing", "running", "uploading"], states.stderr


def test_profiles_without_a_config_file(tmp_path):
    proc = runplane("profiles", "--json", home=tmp_path)
    assert (proc.returncode, json.loads(proc.stdout)) == (0, [])
    empty = runplane("profiles", home=tmp_path)
    assert empty.returncode == 0 and "runplane login URL" in empty.stderr


def test_login_checks_the_url_and_the_token_before_saving(tmp_path):
    bad_url = runplane("login", "ftp://example", "--token", "t", home=tmp_path)
    assert "http:// or https://" in one_error_line(bad_url, 2)
    nothing = runplane("login", f"http://127.0.0.1:{closed_port()}", home=tmp_path, stdin="\n")
    assert one_error_line(nothing, 2).startswith("error: no token")
    unreachable = runplane("login", f"http://127.0.0.1:{closed_port()}", home=tmp_path, stdin="secret\n")
    assert one_error_line(unreachable, 4).startswith("error: cannot reach")
    assert not (tmp_path / ".config" / "runplane").exists()  # nothing saved


class _Going(BaseHTTPRequestHandler):
    """An API whose one run goes on for ever: a submit answers it queued, a read says it is
    running its first attempt, its logs are empty and not complete, its outputs hold a path that
    leaves any directory. Each request's path is kept in ``server.paths``."""

    def _answer(self, status: int, body: dict) -> None:
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        if "/outputs" in self.path:  # a listing with a path that climbs out of any directory
            files = [{"path": p, "size": 1, "url": "http://127.0.0.1:1/x"} for p in ("fine", "../escape")]
            self._answer(200, {"files": files, "next_cursor": None, "complete": True})
        elif "/logs" in self.path:
            self._answer(200, {"data": "", "next_offset": 0, "complete": False})
        else:
            self._answer(200, dict(RUN, name="café ☃", state="running", attempt=1))

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(201, RUN)

    def log_message(self, *args: object) -> None:
        pass


RUN = RunView.model_json_schema()["examples"][0]


@pytest.fixture
def going_api() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Going)
    server.paths = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["run", "--wait", "--", "sleep 600"], f"stopped following {RUN['id']}; it goes on (runplane kill {RUN['id']}"),
        (["logs", "-f", RUN["id"]], ""),  # as `tail -f`: nothing to add
    ],
)
def test_ctrl_c_while_following_exits_130(tmp_path, going_api, args, said):
    """SIGINT (Ctrl-C) while ``run --wait`` or ``logs -f`` follows a run that goes on: exit 130,
    at most one line, no traceback; nothing asks the API to kill the run."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RUNPLANE_")}
    url = f"http://127.0.0.1:{going_api.server_address[1]}"
    env = {**clean, "HOME": str(tmp_path), "RUNPLANE_API_URL": url, "RUNPLANE_TOKEN": "x", "PYTHONIOENCODING": "utf-8"}
    # as a terminal starts it: Ctrl-C's signal not ignored, whatever this process inherited
    proc = subprocess.Popen(
        [RUNPLANE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=_interruptible
    )
    try:
        # a second read of the logs: the CLI is in its loop of reading and waiting
        wait_for(lambda: sum("/logs" in p for p in going_api.paths) >= 2, 30, 0.05, "the CLI to follow the logs")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[-1].startswith(said) if said else lines == []
    assert not any(p.endswith("/kill") for p in going_api.paths)


def test_an_unexpected_failure_exits_1_and_shows_the_traceback_only_when_asked(tmp_path, going_api):
    """A failure runplane has no answer for (here: a run's name that a terminal limited to ASCII
    cannot print) is one line and exit 1; RUNPLANE_DEBUG=1 shows its traceback."""
    url = f"http://127.0.0.1:{going_api.server_address[1]}"
    env = {"RUNPLANE_API_URL": url, "RUNPLANE_TOKEN": "x", "PYTHONIOENCODING": "ascii"}
    line = one_error_line(runplane("status", RUN["id"], home=tmp_path, env=env), 1)
    assert line.startswith("error: runplane failed unexpectedly: UnicodeEncodeError: ")
    assert line.endswith("(RUNPLANE_DEBUG=1 shows the traceback)")
    debug = runplane("status", RUN["id"], home=tmp_path, env={**env, "RUNPLANE_DEBUG": "1"})
    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr and "UnicodeEncodeError" in debug.stderr


def test_a_download_whose_output_path_leaves_dest_exits_3(tmp_path, going_api):
    """README: an output path that leaves DEST is a refusal (exit 3), one line; nothing is written."""
    env = {"RUNPLANE_API_URL": f"http://127.0.0.1:{going_api.server_address[1]}", "RUNPLANE_TOKEN": "x"}
    dest = tmp_path / "dest"
    proc = runplane("download", RUN["id"], str(dest), home=tmp_path / "home", env=env)
    assert one_error_line(proc, 3) == f"error: refusing output path '../escape': it leaves {dest}"
    assert not (tmp_path / "escape").exists() and not (dest / "fine").exists()


def test_version_is_answered_before_the_commands_are_loaded(tmp_path):
    """``runplane --version`` loads neither the commands nor the SDK, typer or pydantic (most of a
    short command's time); any other command does."""
    assert runplane("--version", home=tmp_path).stdout == f"runplane {runplane_version}\n"
    probe = (
        "import sys; sys.argv = ['runplane', *sys.argv[1:]]\n"
        "from runplane.cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = ('runplane.cli.app', 'runplane.client', 'typer', 'pydantic', 'rich', 'httpx')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPLANE_")} | {"HOME": str(tmp_path)}
    loaded = subprocess.run([sys.executable, "-c", probe, "--version"], capture_output=True, text=True, env=env)
    assert loaded.stdout.splitlines() == [f"runplane {runplane_version}", "[]"], loaded.stderr
    loaded = subprocess.run([sys.executable, "-c", probe, "--help"], capture_output=True, text=True, env=env)
    assert "'runplane.cli.app'" in loaded.stdout.splitlines()[-1], loaded.stderr


def test_a_port_forward_whose_local_port_is_taken_is_a_local_problem_exit_2(tmp_path, monkeypatch, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("RUNPLANE_API_URL", f"http://127.0.0.1:{closed_port()}")
        proc = in_process(["port-forward", "r-" + "0" * 24, f"{port}:8000"], tmp_path, monkeypatch, capsys)
    assert f"cannot listen on 127.0.0.1:{port}" in one_error_line(proc, 2)
