"""``runplane serve``'s options that cannot work are refused in one line before anything starts (a
state directory holding other files is left as it was, a busy port is named), ``runplane serve backup``
says in one line what is wrong with its state directory, and a started service says how to use it:
its URLs, the export lines, its admin (``admin``), and what will not work (links for loopback, a pool's
missing image)."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runplane.cli.app import run_cli
from runplane.cli.common import ExitCode
from runplane.cli.serve import links_warning, parse_listen
from runplane.client import Client
from runplane.extras import cli_needs


@pytest.mark.parametrize(
    ("listen", "expected"),
    [("127.0.0.1:8080", ("127.0.0.1", 8080)), ("0.0.0.0:443", ("0.0.0.0", 443)), ("[::1]:9000", ("::1", 9000))],
)
def test_listen_takes_an_address_and_a_port(listen, expected):
    assert parse_listen(listen) == expected


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--listen", "8080"], "give ADDR:PORT"),
        (["--listen", "example.org:8080"], "is not an IP address"),
        (["--listen", "127.0.0.1:0"], "the port must be a number from 1 to 65535"),
        (["--listen", "127.0.0.1:http"], "the port must be a number from 1 to 65535"),
        (["--tls-cert", "cert.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-key", "key.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-cert", "missing.pem", "--tls-key", "missing.pem"], "--tls-cert missing.pem: no such file"),
        (["--public-url", "gpu1.lab:8080"], "give the http(s) URL clients reach the API at"),
        (["--public-url", "https://gpu1.lab/?x=1"], "give the http(s) URL clients reach the API at"),
        (["--listen", "0.0.0.0:8080"], "plain HTTP on an address other machines reach sends tokens in clear"),
        (["--listen", "[::]:8080"], "or --insecure-http"),
        (["--token", "rp_a", "--token-file", "{tmp}/token"], "give the admin token one way"),
        (["--token-file", "{tmp}/missing"], "No such file or directory"),
        (["--token-file", "{tmp}/open"], "is open to other users (mode 0640): chmod 600 it"),
        (["--token-file", "{tmp}/link"], "Too many levels of symbolic links"),
        (["--token-file", "{tmp}/empty"], "give one token on one line"),
    ],
)
def test_options_that_cannot_work_are_one_line_and_start_nothing(tmp_path, capsys, args, said):
    state = tmp_path / "state"
    for name, mode, text in (("token", 0o600, "rp_a\n"), ("open", 0o640, "rp_a"), ("empty", 0o600, " \n")):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(mode)
    (tmp_path / "link").symlink_to(tmp_path / "token")
    args = [a.format(tmp=tmp_path) for a in args]
    # a missing pools file fails the start: an option that is not refused before it gets that error
    code = run_cli(["serve", "--state-dir", str(state), "--pools", str(tmp_path / "no-pools.yaml"), *args])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert err.startswith("error: ") and said in err and err.count("\n") == 1, err
    assert not state.exists()


@pytest.mark.parametrize(
    "args",
    [["--listen", "0.0.0.0:8080", "--insecure-http"], ["--token-file", "{tmp}/token"], ["--token", "rp_a"], []],
)
def test_a_token_file_the_environment_and_insecure_http_are_taken(tmp_path, capsys, monkeypatch, args):
    """Options that are taken get as far as the start (the missing pools file), and a token in the
    command line, which every local user can read, is warned of."""
    (tmp_path / "token").write_text("rp_a\n")
    (tmp_path / "token").chmod(0o600)
    if not args:
        monkeypatch.setenv("RUNPLANE_SERVE_TOKEN", "rp_b")
    args = [a.format(tmp=tmp_path) for a in args]
    code = run_cli(["serve", "--state-dir", str(tmp_path / "state"), "--pools", str(tmp_path / "no.yaml"), *args])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and err.endswith(
        f"error: cannot read pools file {tmp_path}/no.yaml: No such file or directory\n"
    ), err
    assert ("--token is in this process's command line" in err) == ("--token" in args), err


def test_the_environment_and_the_command_line_do_not_both_give_a_token(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RUNPLANE_SERVE_TOKEN", "rp_b")
    assert run_cli(["serve", "--state-dir", str(tmp_path / "state"), "--token", "rp_a"]) == ExitCode.USAGE
    assert "give the admin token one way: --token and RUNPLANE_SERVE_TOKEN" in capsys.readouterr().err


@pytest.mark.parametrize("state_is", ["writable by others", "another user's"])
def test_a_state_directory_not_this_users_alone_is_refused(tmp_path, capsys, state_is):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    if state_is == "writable by others":
        state.chmod(0o777)
    elif os.geteuid() != 0:
        pytest.skip("needs root, to give a directory to another user")
    else:
        os.chown(state, 65534, 65534)
    code = run_cli(["serve", "--state-dir", str(state), "--pools", str(tmp_path / "no.yaml")])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and f"error: --state-dir {state} is refused: " in err, err
    assert list(state.iterdir()) == []


def test_backup_says_in_one_line_what_is_wrong(tmp_path, capsys):
    code = run_cli(["serve", "backup", str(tmp_path / "dest"), "--state-dir", str(tmp_path / "nothing")])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert err.startswith("error: no stack state in ") and err.count("\n") == 1, err
    assert not (tmp_path / "dest").exists()


def test_serve_needs_the_local_extra_and_its_backup_none():
    assert cli_needs(["serve", "--listen", "0.0.0.0:8080"], {}) == ("runplane serve", ("local",))
    assert cli_needs(["serve", "backup", "/srv/backup"], {}) is None


@pytest.fixture
def busy_port():
    """A loopback port something else listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def snapshot(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): stat.S_IMODE(p.lstat().st_mode) for p in [path, *path.rglob("*")]}


@pytest.mark.parametrize("command", ["serve", "dev", "token"])
def test_a_directory_holding_other_files_is_refused_and_left_as_it_was(tmp_path, capsys, busy_port, command):
    """A mistyped --state-dir (/etc, /var/lib) is neither made 0700 nor written in (no lock file
    either), by serve, dev or the installer's first token; the busy port would fail a start that got
    past the directory."""
    parent = tmp_path / "etc"
    foreign = parent / str(busy_port) if command == "dev" else parent  # dev keeps its stack in DIR/PORT
    foreign.mkdir(parents=True)
    (foreign / "passwd").write_text("root:x:0:0\n")
    (foreign / "ssl").mkdir()
    for path in (parent, foreign):
        path.chmod(0o755)
    before = snapshot(parent)
    where = {
        "serve": ["serve", "--listen", f"127.0.0.1:{busy_port}"],
        "dev": ["dev", "--port", str(busy_port)],
        "token": ["token", "create", "--direct", "--init", "--scope", "admin", "admin"],
    }[command]

    code = run_cli([*where, "--state-dir", str(parent)])

    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert err == (
        f"error: {foreign} is not a runplane stack's directory (it holds passwd, ssl): nothing written there; "
        "choose a new or empty state dir\n"
    ), err
    assert snapshot(parent) == before


def test_dev_makes_its_stack_directory_private_and_leaves_the_parent_given_as_it_was(tmp_path, capsys, busy_port):
    parent = tmp_path / "srv"
    parent.mkdir()
    (parent / "other").write_text("kept")
    parent.chmod(0o755)

    code = run_cli(["dev", "--state-dir", str(parent), "--port", str(busy_port)])

    assert code == ExitCode.USAGE and "is already in use" in capsys.readouterr().err
    assert stat.S_IMODE(parent.stat().st_mode) == 0o755
    assert stat.S_IMODE((parent / str(busy_port)).stat().st_mode) == 0o700


def test_a_busy_port_is_one_line_naming_the_option(tmp_path, capsys, busy_port):
    code = run_cli(["serve", "--state-dir", str(tmp_path / "state"), "--listen", f"127.0.0.1:{busy_port}"])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert err == f"error: port {busy_port} on 127.0.0.1 is already in use: choose another with --listen ADDR:PORT\n"


@pytest.mark.parametrize(
    ("host", "public_url", "warned"),
    [
        ("0.0.0.0", "http://localhost:8080", True),
        ("0.0.0.0", "https://localhost.localdomain:8443", True),
        ("::", "http://[::1]:8080", True),
        ("10.1.2.3", "http://127.0.1.1:8080", True),
        ("0.0.0.0", "https://gpu1.lab:8443", False),
        ("0.0.0.0", "http://10.1.2.3:8080", False),
        ("127.0.0.1", "http://localhost:8080", False),  # no other machine reaches it anyway
    ],
)
def test_links_signed_for_loopback_while_listening_beyond_it_are_warned_of(host, public_url, warned):
    said = links_warning(host, public_url)
    assert bool(said) == warned
    assert all(f"signed for {public_url}, which other machines cannot reach: give --public-url" in w for w in said)


@pytest.mark.docker
def test_a_started_service_says_how_to_use_it_and_which_default_image_is_missing(tmp_path):
    """The banner: API and links URLs, the export line with the token just made (named ``admin``),
    and a warning for the pool whose default image the engine lacks (nothing pulled)."""
    from runplane.devstack.net import free_port

    port = free_port()
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "pools:\n"
        "  - {name: absent, backend: local, cpus: 1, memory: 1g, max_workers: 1, "
        "default_image: 'runplane-test/never-built:none'}\n"
    )
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPLANE_")} | {"HOME": str(tmp_path)}
    command = [sys.executable, "-m", "runplane.cli", "serve", "--state-dir", str(tmp_path / "state")]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, "--listen", f"127.0.0.1:{port}", "--pools", str(pools)], stdout=out, stderr=out, env=env
        )
    try:
        deadline = time.monotonic() + 120
        while "warning:" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        said = log.read_text()
        assert "runplane is serving" in said, said
        url = f"http://127.0.0.1:{port}"
        (token,) = [line.split()[1] for line in said.splitlines() if line.strip().startswith("token ")]
        assert f"  links  {url} (where the download links it signs point: --public-url)" in said
        assert f"  export RUNPLANE_API_URL={url} RUNPLANE_TOKEN={token}\n" in said
        assert [t.user for t in Client(url, token).tokens()] == ["admin"]
        assert said.count("warning:") == 1, said
        assert "warning: pool absent: its default image runplane-test/never-built:none is not in" in said
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


@pytest.mark.docker
def test_a_service_whose_stderr_was_closed_still_stops(tmp_path):
    """`runplane serve 2>&1 | head`: once the reader is gone, every print fails (BrokenPipeError);
    SIGTERM must stop the stack all the same (its port freed, the process gone), not leave it hung."""
    from runplane.devstack.net import free_port

    port = free_port()
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "pools:\n  - {name: absent, backend: local, cpus: 1, memory: 1g, max_workers: 1, "
        "default_image: 'runplane-test/never-built:none'}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPLANE_")} | {"HOME": str(tmp_path)}
    command = [sys.executable, "-m", "runplane.cli", "serve", "--state-dir", str(tmp_path / "state")]
    proc = subprocess.Popen(
        [*command, "--listen", f"127.0.0.1:{port}", "--pools", str(pools)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stderr is not None
        said = b""
        while b"warning:" not in said and proc.poll() is None:
            said += proc.stderr.readline()
        assert b"runplane is serving" in said, said
        proc.stderr.close()  # the reader goes, as head does after its lines
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # the stack stopped: its port is free
