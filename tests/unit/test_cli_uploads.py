"""``--upload DIR[:NAME]``: which part names the input, and the one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from runplane.cli.common import CliError
from runplane.cli.uploads import upload_arg
from runplane.client._uploads import with_uploads


def test_the_name_is_given_or_the_directory_s(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    assert upload_arg(f"{proj}:code") == ("code", proj)
    assert upload_arg(str(proj)) == ("proj", proj)
    assert upload_arg(f"{proj}/") == ("proj", Path(f"{proj}/"))
    odd = tmp_path / "a:b c"  # a last part that is no name belongs to the directory
    assert upload_arg(f"{odd}:x") == ("x", odd)
    with pytest.raises(CliError, match="cannot name an input; give one"):
        upload_arg(str(odd))


def test_an_upload_may_not_take_an_input_s_name() -> None:
    merged = with_uploads({"inputs": {"data": "run:abc"}, "gpus": 1}, {"code": "upload:" + "0" * 64})
    assert merged == {"inputs": {"data": "run:abc", "code": "upload:" + "0" * 64}, "gpus": 1}
    with pytest.raises(ValueError, match="data is named by inputs and by uploads"):
        with_uploads({"inputs": {"data": "run:abc"}}, {"data": "upload:" + "0" * 64})
