"""``runplane serve``'s options that cannot work are refused in one line before anything starts, and
``runplane serve backup`` says in one line what is wrong with its state directory."""

from __future__ import annotations

import os

import pytest

from runplane.cli.app import run_cli
from runplane.cli.common import ExitCode
from runplane.cli.serve import parse_listen
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
