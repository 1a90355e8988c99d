"""``runplane serve``'s options that cannot work are refused in one line before anything starts, and
``runplane serve backup`` says in one line what is wrong with its state directory."""

from __future__ import annotations

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
    ],
)
def test_options_that_cannot_work_are_one_line_and_start_nothing(tmp_path, capsys, args, said):
    state = tmp_path / "state"
    code = run_cli(["serve", "--state-dir", str(state), *args])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert err.startswith("error: ") and said in err and err.count("\n") == 1, err
    assert not state.exists()


def test_backup_says_in_one_line_what_is_wrong(tmp_path, capsys):
    code = run_cli(["serve", "backup", str(tmp_path / "dest"), "--state-dir", str(tmp_path / "nothing")])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert err.startswith("error: no stack state in ") and err.count("\n") == 1, err
    assert not (tmp_path / "dest").exists()


def test_serve_needs_the_local_extra_and_its_backup_none():
    assert cli_needs(["serve", "--listen", "0.0.0.0:8080"], {}) == ("runplane serve", ("local",))
    assert cli_needs(["serve", "backup", "/srv/backup"], {}) is None
