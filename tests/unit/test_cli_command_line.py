"""What ``runplane run -- WORDS`` stores as the run's command (run with ``sh -c``): the words as the
user's shell split them, quoted back, so the container's shell splits them the same way."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from runplane.cli.run_options import command_line


@pytest.mark.parametrize(
    ("words", "stored", "printed"),
    [
        (["sh", "-c", "echo a b"], "sh -c 'echo a b'", "a b\n"),
        (["echo", "a   b"], "echo 'a   b'", "a   b\n"),
        (["echo", "it's", "$HOME", "a;b"], "echo 'it'\"'\"'s' '$HOME' 'a;b'", "it's $HOME a;b\n"),
        (["echo hello; echo 42"], "echo hello; echo 42", "hello\n42\n"),  # one word: a command line as it is
        (["printf", "%s|", "", "x"], "printf '%s|' '' x", "|x|"),
    ],
)
def test_the_words_after_the_double_dash_keep_their_quoting(words, stored, printed):
    assert command_line(words) == stored
    done = subprocess.run(["sh", "-c", stored], capture_output=True, text=True, check=True, env={"HOME": "/nowhere"})
    assert done.stdout == printed


def test_version_is_the_packages():
    from runplane import __version__

    done = subprocess.run(
        [sys.executable, "-m", "runplane.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, f"runplane {__version__}\n"), done.stderr
    with open(Path(__file__).resolve().parents[2] / "pyproject.toml", "rb") as f:
        assert tomllib.load(f)["project"]["version"] == __version__
