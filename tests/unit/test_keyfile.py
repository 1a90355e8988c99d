"""The key file that seals secrets on one machine: made once, 0600 in a 0700 directory, never
rewritten; a file or directory another user could read or change is refused with a message
saying why; the agent's opener never makes one."""

import os
import stat
import threading
from pathlib import Path

import pytest

from runplane.adapters.local.keyfile import KEY_BYTES, KeyFileOpener, KeyFileSealer
from runplane.domain.errors import Misconfigured
from runplane.domain.secrets import SecretUnavailable, context

CTX = context("user:alice", "wandb")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_key_file_is_made_once_private_and_never_rewritten(tmp_path):
    path = tmp_path / "new" / "state" / "secrets.key"
    sealed = KeyFileSealer(path).seal(b"v4lue", CTX)

    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    key = path.read_bytes()
    assert len(key) == KEY_BYTES
    assert sealed.key_id.startswith("file:") and key.hex()[:16] not in sealed.key_id
    assert sorted(p.name for p in path.parent.iterdir()) == ["secrets.key"]  # no draft left
    later = KeyFileSealer(path)  # another process, or a restart: the same key
    assert later.ready() == sealed.key_id
    assert KeyFileOpener(path).open(later.seal(b"again", CTX), CTX) == b"again"
    assert KeyFileOpener(path).open(sealed, CTX) == b"v4lue"
    assert path.read_bytes() == key


def test_makers_that_race_all_use_the_one_key_made(tmp_path):
    path = tmp_path / "secrets.key"
    ids: list[str] = []
    errors: list[BaseException] = []

    def make():
        try:
            ids.append(KeyFileSealer(path).ready())
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=make) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(set(ids)) == 1 and len(ids) == 16
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secrets.key"]


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o700])
def test_a_key_file_others_may_read_is_refused_and_left_as_it_is(tmp_path, mode):
    path = tmp_path / "secrets.key"
    sealed = KeyFileSealer(path).seal(b"v4lue", CTX)
    path.chmod(mode)
    said = "other users may read or write it" if mode & 0o077 else None

    for use in (lambda: KeyFileSealer(path).seal(b"x", CTX), lambda: KeyFileOpener(path).open(sealed, CTX)):
        if said is None:
            use()  # 0700: this user's alone, an odd mode but no one else's
            continue
        with pytest.raises((Misconfigured, SecretUnavailable)) as refused:
            use()
        assert f"{said} (mode {mode:04o}); make it 0600 (chmod 600 {path})" in str(refused.value)
    assert _mode(path) == mode


def test_a_link_in_place_of_the_key_file_is_not_followed(tmp_path):
    real = tmp_path / "real.key"
    KeyFileSealer(real).ready()
    path = tmp_path / "secrets.key"
    path.symlink_to(real)
    with pytest.raises(Misconfigured, match="cannot be read"):
        KeyFileSealer(path).seal(b"x", CTX)
    assert path.is_symlink()


def test_a_key_file_of_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a file to another user")
    path = tmp_path / "secrets.key"
    KeyFileSealer(path).ready()
    os.chown(path, 65534, 65534)
    with pytest.raises(Misconfigured, match=r"is owned by another user \(uid 65534\)"):
        KeyFileSealer(path).ready()


def test_no_key_is_made_in_a_directory_others_may_write_in(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(Misconfigured, match=r"other users may write in it \(mode 0777\)"):
        KeyFileSealer(folder / "secrets.key").ready()
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("content", [b"", b"short", os.urandom(KEY_BYTES + 1)])
def test_a_key_file_that_holds_no_key_is_refused_not_replaced(tmp_path, content):
    path = tmp_path / "secrets.key"
    path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(Misconfigured, match=f"does not hold a key \\({KEY_BYTES} bytes\\)"):
        KeyFileSealer(path).ready()
    assert path.read_bytes() == content


def test_the_opener_never_makes_a_key_file(tmp_path):
    sealed = KeyFileSealer(tmp_path / "one" / "secrets.key").seal(b"v4lue", CTX)
    path = tmp_path / "two" / "secrets.key"
    with pytest.raises(SecretUnavailable, match="does not exist"):
        KeyFileOpener(path).open(sealed, CTX)
    assert not path.parent.exists()
